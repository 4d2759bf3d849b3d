"""The limit at the pace of the daemon's run: the machine's speed timed around each run.

On a shared machine the same work's CPU time drifts: inference alone, timed in half-second
windows for half a minute, took 1.45 to 2.02 ms a frame on the 2-core machine this was
written on, in stretches of a few seconds. The ``limit`` (:mod:`.components`) takes each
step at its cheapest over the rounds; a daemon run lasts a second or two and gets the
machine as it is then, so the more rounds, the further apart the two moments the ratio
compares can be.

So each round pairs its own limit with its primary full-load daemon run through one
timing, done the same way three times (:func:`time_pace`: inference alone of one batch at
the round's cheapest batch size, for :data:`PACE_CPU_S` of CPU): right after the round's
components are measured, right before the run and right after it. The mean of the last two
over the first is the run's *slowdown* (above 1: slower than when the components were
timed; below 1: faster), and the round's limit at the run's pace is its limit with the
inference term scaled by it:

    cores × 1000 ÷ (the round's CPU ms per frame + (slowdown − 1) × its inference ms)

The other steps are taken as they were (scaling them too would charge a JPEG input's
decoding, most of its work, with inference's drift). It is shown, not judged: on the
machine above the pace moved by up to a fifth between the components and a run a minute
later, and by as much between two of its own timings, so it explains the spread of a
mode's rounds rather than correcting it; the targets stay against the limit (issue 8).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from streamer.bench.work import FrameWork

__all__ = ["PACE_CPU_S", "LimitAtPace", "Pace", "PacedRun", "limit_at_pace", "time_pace"]

PACE_CPU_S = 0.5
"""CPU seconds each of a round's three timings of the pace takes."""


@dataclass(frozen=True)
class Pace:
    """Inference alone timed around one daemon run, and its round's limit.

    Attributes:
        batch_size: the batch size timed (the round's cheapest).
        components_ms: CPU ms per frame right after the round's components were measured.
        before_ms: CPU ms per frame just before the run.
        after_ms: CPU ms per frame just after it.
        limit_cpu_ms: the round's limit: CPU ms per frame of its steps.
        inference_ms: the inference term of ``limit_cpu_ms`` (at ``batch_size``).
    """

    batch_size: int
    components_ms: float
    before_ms: float
    after_ms: float
    limit_cpu_ms: float
    inference_ms: float

    @property
    def slowdown(self) -> float:
        """The mean of ``before_ms`` and ``after_ms`` over ``components_ms``."""
        return (self.before_ms + self.after_ms) / 2 / self.components_ms


@dataclass(frozen=True)
class PacedRun:
    """One round's daemon run against its round's limit at its pace.

    Attributes:
        daemon_fps: the run's frames per second.
        pace: inference alone around it, and the round's limit.
        slowdown: :attr:`Pace.slowdown`.
        limit_fps: the round's limit at the run's pace (module docstring), frames/s.
        ratio: ``daemon_fps`` ÷ ``limit_fps``.
    """

    daemon_fps: float
    pace: Pace
    slowdown: float
    limit_fps: float
    ratio: float


@dataclass(frozen=True)
class LimitAtPace:
    """Every round's daemon run against its limit at its pace.

    Attributes:
        runs: one per round, in order.
        best: the fastest run (the one the report shows for ``daemon``).
    """

    runs: tuple[PacedRun, ...]
    best: PacedRun


def time_pace(work: FrameWork, batch: np.ndarray) -> float:
    """CPU ms per frame of inference alone of ``batch`` (model inputs, N first), timed by
    the process's CPU time (as :mod:`.components` times inference) for :data:`PACE_CPU_S`."""
    start = time.process_time_ns()
    frames = 0
    while time.process_time_ns() - start < PACE_CPU_S * 1e9:
        work.infer(batch)
        frames += len(batch)
    return round((time.process_time_ns() - start) / 1e6 / frames, 4)


def limit_at_pace(cores: int, runs: Sequence[tuple[float, Pace | None]]) -> LimitAtPace | None:
    """Each round's daemon run against its round's limit at its pace; None if a run has no
    pace.

    Args:
        cores: CPU cores the limit counts.
        runs: per round, the daemon run's frames per second and the pace around it.
    """
    paced = []
    for fps, pace in runs:
        if pace is None:
            return None
        cpu_ms = pace.limit_cpu_ms + (pace.slowdown - 1) * pace.inference_ms
        limit_fps = cores * 1000.0 / cpu_ms
        paced.append(
            PacedRun(
                daemon_fps=fps,
                pace=pace,
                slowdown=round(pace.slowdown, 4),
                limit_fps=round(limit_fps, 1),
                ratio=round(fps / limit_fps, 3),
            )
        )
    if not paced:
        return None
    return LimitAtPace(tuple(paced), max(paced, key=lambda run: run.daemon_fps))

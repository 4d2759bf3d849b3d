"""The limit at the pace of the daemon's run: the machine's speed timed around each run.

On a shared machine the same work's CPU time drifts: inference alone, timed in half-second
windows for half a minute, took 1.45 to 2.02 ms a frame on the 2-core machine this was
written on, in stretches of a few seconds. The ``limit`` (:mod:`.components`) takes each
step at its cheapest over the rounds, the machine at its best moment; a daemon run lasts a
second or two and gets the machine as it is then, so the more rounds, the further apart
the two moments the ratio compares can be.

So around each full-load run of the primary daemon, inference alone at the round's
cheapest batch size is timed again, for :data:`PACE_CPU_S` of CPU just before the run and
just after it (:func:`time_pace`). Their mean over the cheapest inference of that size
is the run's *slowdown* (1.0: the machine at its best; 1.2: 20 % slower), and the limit at
the run's pace is the limit ÷ the slowdown. This assumes every step slowed as inference
did (on this machine's inputs inference is most of the work), and counts a slowdown of
at least 1, so the limit at a run's pace never exceeds the limit. It is judged as a target
of its own, ``daemon / limit at its pace`` (the best of the rounds, as each mode reports
its best); the ``daemon / limit`` target is unchanged.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from streamer.bench.components import Components, Limit
from streamer.bench.work import FrameWork

__all__ = ["PACE_CPU_S", "LimitAtPace", "Pace", "PacedRun", "limit_at_pace", "time_pace"]

PACE_CPU_S = 0.5
"""CPU seconds each timing of the pace takes (one before a run, one after)."""


@dataclass(frozen=True)
class Pace:
    """Inference alone timed around one daemon run.

    Attributes:
        batch_size: the batch size timed (the round's cheapest).
        before_ms: CPU ms per frame just before the run.
        after_ms: CPU ms per frame just after it.
    """

    batch_size: int
    before_ms: float
    after_ms: float

    @property
    def mean_ms(self) -> float:
        return (self.before_ms + self.after_ms) / 2


@dataclass(frozen=True)
class PacedRun:
    """One round's daemon run against the limit at its pace.

    Attributes:
        daemon_fps: the run's frames per second.
        pace: inference alone around it.
        slowdown: ``pace.mean_ms`` ÷ the cheapest inference at that batch size, at least 1.
        limit_fps: the limit ÷ ``slowdown``, frames per second.
        ratio: ``daemon_fps`` ÷ ``limit_fps``.
    """

    daemon_fps: float
    pace: Pace
    slowdown: float
    limit_fps: float
    ratio: float


@dataclass(frozen=True)
class LimitAtPace:
    """Every round's daemon run against the limit at its pace.

    Attributes:
        runs: one per round, in order.
        best: the run with the highest ``ratio``.
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
    return (time.process_time_ns() - start) / 1e6 / frames


def limit_at_pace(
    limit: Limit, components: Components, runs: Sequence[tuple[float, Pace | None]]
) -> LimitAtPace | None:
    """Each round's daemon run against the limit at its pace; None if a run has no pace.

    Args:
        limit: the input's limit.
        components: the steps alone it comes from (each at its cheapest over the rounds).
        runs: per round, the daemon run's frames per second and the pace around it.
    """
    paced = []
    for fps, pace in runs:
        if pace is None:
            return None
        cheapest_ms = components.inference[pace.batch_size].cpu_ms
        slowdown = max(1.0, pace.mean_ms / cheapest_ms)
        limit_fps = limit.fps / slowdown
        paced.append(
            PacedRun(
                daemon_fps=fps,
                pace=pace,
                slowdown=round(slowdown, 4),
                limit_fps=round(limit_fps, 1),
                ratio=round(fps / limit_fps, 4),
            )
        )
    if not paced:
        return None
    return LimitAtPace(tuple(paced), max(paced, key=lambda run: run.ratio))

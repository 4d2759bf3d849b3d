"""The targets of issue 8, checked against one benchmark's results.

Per input: daemon >= 0.85 x limit, daemon >= serial, daemon >= 1.2 x naive, p99 latency at
50 % of the maximum rate <= ``max_delay_ms`` + 3 x one inference at the configured batch size,
and less than 10 % throughput lost from 1 to 16 sources. Across inputs: the config's
``max_size`` is the fastest one measured, or within :data:`TIE` of it (a smaller difference
is within what rounds of one mode differ by on a shared machine); so is its onnxruntime
``rows_per_run``, the rows of each model run, among the batch sizes' inference alone.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from streamer.bench.components import Components, Limit
from streamer.bench.modes import (
    DAEMON,
    HALF_RATE,
    MANY_SOURCES,
    MANY_SOURCES_MODE,
    NAIVE,
    SERIAL,
)
from streamer.bench.stats import RunResult

__all__ = [
    "TIE",
    "BatchSizeFinding",
    "Target",
    "batch_size_target",
    "input_targets",
    "rows_per_run_target",
]

TIE = 0.05
"""Batch sizes within 5 % of the fastest count as fastest too."""


@dataclass(frozen=True)
class Target:
    """One target and where the measurement stands.

    Attributes:
        name: what is compared, e.g. ``daemon / limit``.
        scope: the input it applies to, or ``all``.
        value: the measured value (a ratio, ms, or a batch size).
        goal: the condition, e.g. ``>= 0.85``.
        met: True or False; None when a measurement is missing.
    """

    name: str
    scope: str
    value: float | None
    goal: str
    met: bool | None


def input_targets(
    name: str,
    runs: Mapping[str, RunResult],
    limit: Limit,
    components: Components,
    max_size: int,
    max_delay_ms: float,
    rows_per_run: int = 0,
) -> list[Target]:
    """The per-input targets of ``name``'s runs (by the names of :mod:`.modes`); one
    inference of a ``max_size`` batch runs in runs of ``rows_per_run`` rows (0 = whole)."""
    daemon = runs[DAEMON].fps
    one_inference_ms = components.inference_in_runs(max_size, rows_per_run).wall_ms * max_size
    budget_ms = max_delay_ms + 3 * one_inference_ms
    half = runs[HALF_RATE].latency
    return [
        _at_least("daemon / limit", name, _ratio(daemon, limit.fps), 0.85),
        _at_least("daemon / serial", name, _ratio(daemon, runs[SERIAL].fps), 1.0),
        _at_least("daemon / naive", name, _ratio(daemon, runs[NAIVE].fps), 1.2),
        _at_most(
            "p99 ms at 50 % of max rate",
            name,
            half.p99_ms if half is not None else None,
            round(budget_ms, 2),
        ),
        _at_least(
            f"{MANY_SOURCES} sources / 1 source",
            name,
            _ratio(*_alike(runs[MANY_SOURCES_MODE], runs[DAEMON])),
            0.9,
        ),
    ]


def _alike(run: RunResult, other: RunResult) -> tuple[float, float]:
    """The frames/s of two daemon runs measured alike: their steady rates where both have
    one, else their whole-run rates. A run of 16 sources has no steady part when its
    frames are few (``--frames`` under about 500): its producer's 16 connections buffer
    them all before the first result comes back
    (:data:`~streamer.bench.modes.MANY_SOURCES_FRAMES_FACTOR`)."""
    if (run.whole_run_fps is None) == (other.whole_run_fps is None):
        return run.fps, other.fps
    return _whole_run_fps(run), _whole_run_fps(other)


def _whole_run_fps(run: RunResult) -> float:
    """Frames from the first sent to the last result ÷ that time, steady rate or not."""
    return run.fps if run.whole_run_fps is None else run.whole_run_fps


@dataclass(frozen=True)
class BatchSizeFinding:
    """Which batch ``max_size`` is fastest.

    Attributes:
        fastest: the fastest one.
        relative_speed: each one's speed ÷ the fastest's (1.0 for the fastest).
        basis: how speed was measured (daemon throughput, or inference cost alone).
        conclusive: False when the basis cannot tell the sizes apart (inference alone in
            runs of ``rows_per_run`` rows, the same for every ``max_size`` above it).
    """

    fastest: int
    relative_speed: dict[int, float]
    basis: str
    conclusive: bool = True

    @classmethod
    def of(
        cls, speeds: Mapping[int, float], basis: str, conclusive: bool = True
    ) -> BatchSizeFinding:
        """From a speed (higher is faster, any unit) per batch size."""
        fastest = max(speeds, key=speeds.__getitem__)
        relative = {size: round(speed / speeds[fastest], 3) for size, speed in speeds.items()}
        return cls(fastest, relative, basis, conclusive)


def batch_size_target(configured: int, finding: BatchSizeFinding) -> Target:
    """The config's ``max_size`` against the fastest found: met within :data:`TIE`; not
    judged (None) on an inconclusive finding."""
    speed = finding.relative_speed.get(configured)
    if not finding.conclusive:  # daemon runs tell: --max-size repeated
        name = f"config max_size {configured}: repeat --max-size"
        return Target(name, "all", speed, f">= {1 - TIE}", None)
    return Target(
        f"config max_size {configured}: speed / fastest ({finding.fastest})",
        "all",
        speed,
        f">= {1 - TIE}",
        None if speed is None else speed >= 1 - TIE,
    )


def rows_per_run_target(
    rows_per_run: int, max_size: int, components: Sequence[Components]
) -> Target:
    """The config's ``rows_per_run`` (0 = whole batches) against the batch size up to
    ``max_size`` whose inference alone costs the least CPU per frame over the inputs, each
    priced as the daemon runs its ``max_size`` batches: met within :data:`TIE`."""
    sizes = [size for size in sorted(components[0].inference) if size <= max_size]
    cost = {size: sum(c.inference[size].cpu_ms for c in components) for size in sizes}
    fastest = min(cost, key=cost.__getitem__)
    configured = sum(c.inference_in_runs(max_size, rows_per_run).cpu_ms for c in components)
    speed = round(cost[fastest] / configured, 3)
    return Target(
        f"config rows_per_run {rows_per_run}: speed / fastest ({fastest})",
        "all",
        speed,
        f">= {1 - TIE}",
        speed >= 1 - TIE,
    )


def _ratio(value: float, reference: float) -> float | None:
    return round(value / reference, 3) if reference > 0 else None


def _at_least(name: str, scope: str, value: float | None, goal: float) -> Target:
    met = None if value is None else value >= goal
    return Target(name, scope, value, f">= {goal}", met)


def _at_most(name: str, scope: str, value: float | None, goal: float) -> Target:
    met = None if value is None else value <= goal
    return Target(name, scope, value, f"<= {goal}", met)

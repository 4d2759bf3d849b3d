"""Throughput and latency of one measured run, in the form the report stores."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

__all__ = ["CDF_POINTS", "Latency", "RunResult"]

CDF_POINTS = 101
"""Quantiles kept of every latency distribution (0 %, 1 %, …, 100 %), for the plot."""


@dataclass(frozen=True)
class Latency:
    """A latency distribution.

    Attributes:
        p50_ms, p95_ms, p99_ms: percentiles, ms.
        cdf_ms: the 0 %, 1 %, …, 100 % quantiles, ms (:data:`CDF_POINTS` values).
    """

    p50_ms: float
    p95_ms: float
    p99_ms: float
    cdf_ms: tuple[float, ...]

    @classmethod
    def of(cls, samples_ms: Sequence[float]) -> Latency | None:
        """The distribution of ``samples_ms`` (ms); None when there is no sample."""
        if not len(samples_ms):
            return None
        samples = np.asarray(samples_ms, np.float64)
        p50, p95, p99 = np.percentile(samples, (50, 95, 99))
        cdf = np.percentile(samples, np.linspace(0, 100, CDF_POINTS))
        return cls(_r(p50), _r(p95), _r(p99), tuple(_r(v) for v in cdf))


@dataclass(frozen=True)
class RunResult:
    """What one mode delivered.

    Attributes:
        mode: ``serial``, ``naive``, ``daemon``, ``daemon_half_rate``, …
        frames: frames that came back with a result.
        seconds: wall time from the first frame sent (or started) to the last result, s.
        fps: ``frames / seconds``.
        latency: per frame, from sending (or starting) it to its result; None if unmeasured.
        failed: frames that came back as error results (not counted in ``frames``).
        others_cores: CPU cores other processes used meanwhile (:mod:`.machine`).
        idle_cores: CPU cores the machine left idle from the first frame sent to the last
            result (:mod:`.machine`); unpaced daemon runs only, None for the others.
        rounds_fps: ``fps`` of every round of this mode (this result is the best round).
    """

    mode: str
    frames: int
    seconds: float
    fps: float
    latency: Latency | None
    failed: int = 0
    others_cores: float | None = None
    idle_cores: float | None = None
    rounds_fps: tuple[float, ...] = ()

    @classmethod
    def of(
        cls, mode: str, frames: int, seconds: float, latencies_ms: Sequence[float], failed: int = 0
    ) -> RunResult:
        """A result with ``fps`` and the latency distribution computed."""
        fps = frames / seconds if seconds > 0 else 0.0
        return cls(mode, frames, round(seconds, 4), round(fps, 2), Latency.of(latencies_ms), failed)


def _r(value: float) -> float:
    return round(float(value), 3)

"""Throughput and latency of one measured run, in the form the report stores."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

__all__ = ["CDF_POINTS", "Latency", "RunResult", "steady_fps"]

CDF_POINTS = 101
"""Quantiles kept of every latency distribution (0 %, 1 %, …, 100 %), for the plot."""
FILLING_SHARE = 0.1
"""Share of a daemon run's first results its steady rate leaves out: the pipeline filling."""
_STEADY_MIN_RESULTS = 16


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
        fps: ``frames / seconds``; for a daemon run, its steady rate (:func:`steady_fps`)
            where it has one.
        latency: per frame, from sending (or starting) it to its result; None if unmeasured.
        failed: frames that came back as error results (not counted in ``frames``).
        others_cores: CPU cores other processes used meanwhile (:mod:`.machine`).
        idle_cores: CPU cores the machine left idle from the first frame sent to the last
            result (:mod:`.machine`); unpaced daemon runs only, None for the others.
        rounds_fps: ``fps`` of every round of this mode (this result is the best round).
        whole_run_fps: ``frames / seconds`` where ``fps`` is a steady rate, else None.
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
    whole_run_fps: float | None = None

    @classmethod
    def of(
        cls,
        mode: str,
        frames: int,
        seconds: float,
        latencies_ms: Sequence[float],
        failed: int = 0,
        steady: float | None = None,
    ) -> RunResult:
        """A result with ``fps`` (``steady``, frames/s, where given) and the latency
        distribution computed."""
        whole = frames / seconds if seconds > 0 else 0.0
        fps, whole_run = (whole, None) if steady is None else (steady, round(whole, 2))
        return cls(
            mode,
            frames,
            round(seconds, 4),
            round(fps, 2),
            Latency.of(latencies_ms),
            failed,
            whole_run_fps=whole_run,
        )


def steady_fps(arrivals_s: Sequence[float], last_send_s: float) -> float | None:
    """A daemon run's rate at full load, frames/s: the least-squares slope of the count of
    results against their arrival times (s) from the first result after the first tenth
    (:data:`FILLING_SHARE`; the pipeline filling) to the last one in by ``last_send_s``,
    the producer's last send (after it the daemon drains its queue without the producer's
    CPU beside it, and its last batches leave cores idle).

    Over a run of a second, the filling and draining of a pipeline that holds hundreds of
    frames take a few percent of the time, which a daemon's throughput measured from the
    first send to the last result counts against it, and a service that runs for weeks
    never pays. Returns None when that window holds fewer than 16 results or no time.
    """
    times = np.sort(np.asarray(arrivals_s, np.float64))
    first = int(len(times) * FILLING_SHARE)
    window = times[first : int(np.searchsorted(times, last_send_s, side="right"))]
    if len(window) < _STEADY_MIN_RESULTS or window[-1] <= window[0]:
        return None
    return float(np.polyfit(window, np.arange(len(window)), 1)[0])


def _r(value: float) -> float:
    return round(float(value), 3)

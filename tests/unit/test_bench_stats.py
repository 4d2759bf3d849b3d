"""A daemon run's throughput (``streamer.bench.stats.steady_fps``): the rate while the
producer sent and the pipeline was full, not diluted by its filling and draining."""

from __future__ import annotations

import json

import numpy as np
import pytest

from streamer.bench.clock import Cost
from streamer.bench.components import Components, find_limit
from streamer.bench.daemon_run import _Parsed
from streamer.bench.stats import RunResult, steady_fps
from streamer.bench.targets import input_targets


def _run(rate: float, frames: int, burst: int = 8) -> tuple[list[float], float]:
    """Arrivals (s) of a pipelined run: 30 ms before the first batch is out, then batches
    of ``burst`` results at ``rate`` frames/s, the producer's last send 250 frames before
    the end, and a last partial batch 10 ms late (the batch wait)."""
    batches = np.arange(frames) // burst
    arrivals = 1000.0 + 0.030 + batches * burst / rate
    arrivals[-3:] += 0.010
    last_send = float(arrivals[max(frames - 250, 0)])
    return [float(t) for t in arrivals], last_send


def test_the_steady_rate_is_the_rate_at_full_load_without_filling_and_draining() -> None:
    arrivals, last_send = _run(1200.0, 1000)
    whole = 1000 / (arrivals[-1] - 1000.0)
    steady = steady_fps(arrivals, last_send)
    assert steady == pytest.approx(1200.0, rel=0.01)
    assert whole < 0.97 * steady  # what the filling and the tail cost a one-second run


def test_results_after_the_last_send_do_not_count_the_drain_without_the_producer() -> None:
    arrivals, last_send = _run(1000.0, 1000)
    faster = [t if t <= last_send else last_send + (t - last_send) / 2 for t in arrivals]
    assert steady_fps(faster, last_send) == pytest.approx(1000.0, rel=0.01)


@pytest.mark.parametrize("frames", [0, 1, 16])
def test_a_run_too_short_for_a_steady_part_has_none(frames: int) -> None:
    arrivals = [1000.0 + k / 1000 for k in range(frames)]  # 16: 15 after the first tenth
    assert steady_fps(arrivals, 2000.0) is None
    assert steady_fps([1000.0 + k / 1000 for k in range(100)], 2000.0) == pytest.approx(1000.0)


def test_results_all_in_one_instant_have_no_rate() -> None:
    assert steady_fps([5.0] * 100, 6.0) is None


def test_a_daemon_run_reports_its_steady_rate_with_the_whole_run_beside_it() -> None:
    arrivals, last_send = _run(1200.0, 1000)
    results = [
        (t, json.dumps({"ts": 1000.0, "latency_ms": {"total": 5.0}}).encode()) for t in arrivals
    ]
    results.append((arrivals[-1], json.dumps({"eos": True}).encode()))
    parsed = _Parsed.of(results, 1000.0, last_send)
    run = RunResult.of(
        "daemon", parsed.frames, parsed.seconds, parsed.latencies_ms, 0, parsed.steady_fps
    )
    assert run.fps == pytest.approx(1200.0, rel=0.01)
    assert run.whole_run_fps == pytest.approx(1000 / (arrivals[-1] - 1000.0), abs=0.01)


def test_without_a_steady_rate_the_run_is_whole() -> None:
    run = RunResult.of("serial", 100, 0.5, [1.0] * 100)
    assert (run.fps, run.whole_run_fps) == (200.0, None)


def test_sixteen_sources_are_judged_against_one_by_the_same_measure() -> None:
    """A 16-source producer's connections buffer all 1000 frames before the first result
    (measured: its last send came 41-82 ms after its first, before any result), so that run
    has no steady part and kept its whole-run rate, which the target divided by the one
    source's steady rate: the pipeline's filling and draining counted against 16 sources."""
    cost = Cost(0.1, 0.1, 64)
    components = Components(cost, cost, {1: Cost(1.0, 1.0, 64), 8: Cost(0.9, 0.9, 64)}, cost)
    limit = find_limit(components, cores=2)
    arrivals, last_send = _run(1000.0, 1000)
    one = RunResult.of("daemon", 1000, 1.2, [5.0], 0, steady_fps(arrivals, last_send))
    many = RunResult.of("daemon_16_sources", 1000, 1.2, [5.0], 0, steady_fps(arrivals, 0.0))
    assert (many.whole_run_fps, one.whole_run_fps) == (None, many.fps)  # the same 1.2 s
    runs = {
        "serial": RunResult.of("serial", 1000, 2.0, [1.0]),
        "naive": RunResult.of("naive", 1000, 2.0, [1.0]),
        "daemon": one,
        "daemon_half_rate": RunResult.of("daemon_half_rate", 1000, 2.0, [5.0], 0, 500.0),
        "daemon_16_sources": many,
    }
    targets = {t.name: t for t in input_targets("in", runs, limit, components, 8, 10.0)}
    assert targets["16 sources / 1 source"].value == 1.0
    assert targets["16 sources / 1 source"].met
    assert targets["daemon / limit"].value == round(one.fps / limit.fps, 3)  # steady, as before

"""The limit at the pace of a daemon run (streamer.bench.pace)."""

from __future__ import annotations

import pytest

from streamer.bench.pace import Pace, limit_at_pace


def pace(components_ms: float, before_ms: float, after_ms: float) -> Pace:
    """A round whose limit costs 2.0 ms a frame, 1.6 of it inference at batch 2."""
    return Pace(2, components_ms, before_ms, after_ms, limit_cpu_ms=2.0, inference_ms=1.6)


def test_only_the_inference_term_follows_the_pace_of_the_run() -> None:
    slow = pace(components_ms=1.6, before_ms=2.0, after_ms=2.4)  # 1.375 x
    at_pace = limit_at_pace(2, [(800.0, slow)])
    assert at_pace is not None
    (run,) = at_pace.runs
    assert run.slowdown == pytest.approx(1.375)
    assert run.limit_fps == pytest.approx(2000 / (2.0 + 0.375 * 1.6), abs=0.05)  # 769.2
    assert run.ratio == pytest.approx(800 / 769.2, abs=1e-3)


def test_a_run_on_a_faster_machine_meets_a_higher_limit() -> None:
    """No floor at 1: a floor would only ever raise the ratio (timing noise included)."""
    fast = pace(components_ms=1.6, before_ms=1.4, after_ms=1.4)
    at_pace = limit_at_pace(2, [(900.0, fast)])
    assert at_pace is not None
    assert at_pace.runs[0].slowdown == pytest.approx(0.875)
    assert at_pace.runs[0].limit_fps > 1000  # the round's limit: 2 cores / 2.0 ms


def test_the_round_judged_is_the_fastest_run_not_the_best_ratio() -> None:
    """Picking the best ratio would pick the noisiest timing."""
    at_pace = limit_at_pace(2, [(800.0, pace(1.6, 2.4, 2.4)), (850.0, pace(1.6, 1.6, 1.6))])
    assert at_pace is not None
    assert at_pace.runs[0].ratio > at_pace.runs[1].ratio
    assert at_pace.best is at_pace.runs[1]


def test_no_pace_no_judgement() -> None:
    assert limit_at_pace(2, [(800.0, pace(1.0, 1.0, 1.0)), (900.0, None)]) is None
    assert limit_at_pace(2, []) is None

"""The limit at the pace of a daemon run (streamer.bench.pace)."""

from __future__ import annotations

import pytest

from streamer.bench.clock import Cost
from streamer.bench.components import Components, find_limit
from streamer.bench.pace import Pace, limit_at_pace


def components(batch_1: float, batch_2: float) -> Components:
    inference = {1: Cost(batch_1, batch_1, 16), 2: Cost(batch_2, batch_2, 16)}
    return Components(Cost(0.1, 0.1, 16), Cost(0.1, 0.1, 16), inference, Cost(0.2, 0.2, 16))


def test_a_run_on_a_slower_machine_is_judged_against_the_limit_of_that_moment() -> None:
    steps = components(batch_1=1.8, batch_2=1.6)  # the limit: 2 cores / 2.0 ms = 1000 fps
    limit = find_limit(steps, cores=2)
    slow = Pace(2, before_ms=2.0, after_ms=2.4)  # 1.375 x the cheapest batch of 2
    fast = Pace(2, before_ms=1.5, after_ms=1.6)  # faster than the cheapest: counted as 1
    at_pace = limit_at_pace(limit, steps, [(800.0, slow), (850.0, fast)])
    assert at_pace is not None
    first, second = at_pace.runs
    assert first.slowdown == pytest.approx(1.375) and first.limit_fps == pytest.approx(727.3)
    assert first.ratio == pytest.approx(800 / 727.3, rel=1e-3)
    assert second.slowdown == 1.0 and second.limit_fps == limit.fps == 1000
    assert at_pace.best is first  # the best ratio, not the fastest run


def test_no_pace_no_judgement() -> None:
    steps = components(1.0, 1.0)
    limit = find_limit(steps, cores=2)
    assert limit_at_pace(limit, steps, [(800.0, Pace(1, 1.0, 1.0)), (900.0, None)]) is None
    assert limit_at_pace(limit, steps, []) is None

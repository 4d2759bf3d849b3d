"""The benchmark keeps each step's cheapest round, so its limit is the machine's at its best."""

from __future__ import annotations

from streamer.bench.clock import Cost
from streamer.bench.components import Components, find_limit


def components(decode: float, preprocess: float, batch_1: float, batch_8: float) -> Components:
    return Components(
        Cost(decode, decode + 0.01, 64),
        Cost(preprocess, preprocess + 0.01, 64),
        {1: Cost(batch_1, batch_1, 64), 8: Cost(batch_8, batch_8, 64)},
        Cost(0.05, 0.05, 64),
    )


def test_each_step_keeps_its_cheapest_round_whichever_round_it_was() -> None:
    slow_start = components(decode=0.02, preprocess=0.15, batch_1=1.9, batch_8=1.7)
    fast_later = components(decode=0.03, preprocess=0.12, batch_1=1.5, batch_8=1.6)
    best = slow_start.cheapest(fast_later)
    assert best == components(decode=0.02, preprocess=0.12, batch_1=1.5, batch_8=1.6)
    assert fast_later.cheapest(slow_start) == best
    assert best.best_batch_size() == 1
    limit = find_limit(best, cores=2)
    assert limit.cpu_ms_per_frame == 0.02 + 0.12 + 1.5 + 0.05
    assert limit.fps > find_limit(slow_start, cores=2).fps

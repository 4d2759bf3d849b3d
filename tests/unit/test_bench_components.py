"""The benchmark keeps each step's cheapest round, so its limit is the machine's at its best."""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import replace

import numpy as np
import pytest

from streamer.bench.ceiling import find_ceiling
from streamer.bench.clock import Cost
from streamer.bench.components import Components, find_limit, mean_run_rows
from streamer.bench.daemon_run import applied_rows_per_run
from streamer.bench.stages import Stage, StageReport
from streamer.bench.targets import BatchSizeFinding, batch_size_target, rows_per_run_target
from streamer.bench.together import time_together


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


def test_the_stage_table_takes_its_steps_alone_from_the_components_given() -> None:
    cheapest = components(decode=0.02, preprocess=0.12, batch_1=1.5, batch_8=1.6)
    stages = (
        Stage("decode+preprocess", 2, 0.2, 10.0, 1.0, "span", 0.17),
        Stage("inference", 2, 1.8, 80.0, 14.0, "span", 1.7),
        Stage("egress", 1, 0.05, 2.0, None, "none", None),
    )
    # As one round measured them, its own components giving 1.92 ms of work alone:
    report = StageReport(stages, "inference", "cpu", 8.0, 0, 2.2, 1.92, 0.28, 1.8)
    rebased = report.against(cheapest)
    assert [s.alone_cpu_ms for s in rebased.stages] == [0.14, 1.6, None]
    assert rebased.work_cpu_ms == 0.02 + 0.12 + 1.6 + 0.05
    assert rebased.overhead_cpu_ms == round(2.2 - rebased.work_cpu_ms, 4)
    assert (rebased.daemon_cpu_ms, rebased.stages[0].cpu_ms) == (2.2, 0.2)  # measured: kept


def test_inference_alone_is_priced_at_the_rows_of_each_run() -> None:
    """With onnxruntime's rows_per_run the daemon's batches of 8 run as runs of fewer rows:
    the work alone, the latency budget and the rows_per_run target price those runs."""
    steps = components(decode=0.02, preprocess=0.12, batch_1=1.5, batch_8=1.6)
    assert steps.inference_at(4.5).cpu_ms == pytest.approx(1.55)
    assert steps.inference_in_runs(8, 0) == steps.inference_at(8)
    assert steps.inference_in_runs(8, 1).cpu_ms == 1.5
    # 8 in runs of 3: two runs of 3 and one of 2, each frame at its run's cost
    thirds = (6 * steps.inference_at(3).cpu_ms + 2 * steps.inference_at(2).cpu_ms) / 8
    assert steps.inference_in_runs(8, 3).cpu_ms == pytest.approx(thirds)
    assert steps.inference_in_runs(2, 3) == steps.inference_at(2)
    assert (mean_run_rows(8, 3), mean_run_rows(8, 0), mean_run_rows(2, 3)) == (8 / 3, 8, 2)
    stages = (Stage("inference", 2, 1.8, 80.0, 14.0, "span", 1.6),)
    report = StageReport(stages, "inference", "cpu", 8.0, 1, 2.0, 1.8, 0.2, 1.8)
    assert report.against(steps).stages[0].alone_cpu_ms == 1.5


def test_the_rows_per_run_target_prices_what_the_daemon_runs() -> None:
    steps = components(decode=0.02, preprocess=0.12, batch_1=1.5, batch_8=1.6)
    best = rows_per_run_target(1, 8, [steps, steps])
    assert (best.name, best.value, best.met) == (
        "config rows_per_run 1: speed / fastest (1)",
        1.0,
        True,
    )
    for rows in (0, 8, 16):  # batches of max_size 8 run whole, whichever is set
        whole = rows_per_run_target(rows, 8, [steps])
        assert (whole.value, whole.met) == (round(1.5 / 1.6, 3), False)
    cheap_16 = replace(steps, inference={**steps.inference, 16: Cost(1.0, 1.0, 64)})
    assert rows_per_run_target(1, 8, [cheap_16]).met  # 16 rows never run with max_size 8


def test_inference_alone_cannot_pick_a_max_size_above_rows_per_run() -> None:
    """Every max_size from rows_per_run up runs the same runs: only daemon runs (repeat
    --max-size) tell them apart, so the target is not judged."""
    finding = BatchSizeFinding.of({2: 1.0, 8: 1.0}, "inference alone", conclusive=False)
    target = batch_size_target(8, finding)
    assert (target.name, target.met) == ("config max_size 8: repeat --max-size", None)


def test_a_daemon_that_turned_rows_per_run_off_is_priced_in_whole_batches() -> None:
    lines = [{"event": "ready"}, {"event": "rows_per_run_off", "model": "face"}]
    assert applied_rows_per_run(lines, 2) == 0
    assert applied_rows_per_run(lines[:1], 2) == 2


def test_the_ceiling_prices_every_replica_at_once_and_the_load_beside_the_daemon() -> None:
    """What a daemon with no overhead could reach here: the limit's work with inference
    timed with every replica at once, plus the producer's and subscriber's CPU per frame."""
    steps = components(decode=0.02, preprocess=0.12, batch_1=1.5, batch_8=1.6)
    assert find_ceiling(steps, find_limit(steps, cores=2), 0.05, 0.1) is None  # no copies
    busy = replace(steps, every_replica={1: Cost(1.65, 0.9, 64)})
    limit = find_limit(busy, cores=2)
    ceiling = find_ceiling(busy, limit, producer_cpu_ms=0.05, subscriber_cpu_ms=0.1)
    assert ceiling is not None
    cpu_ms = 0.02 + 0.12 + 0.05 + 1.65 + 0.05 + 0.1  # decode, pre, post, together, load
    assert ceiling.cpu_ms_per_frame == pytest.approx(cpu_ms)
    assert ceiling.fps == pytest.approx(2000 / cpu_ms, abs=0.05)
    assert ceiling.limit_ratio == pytest.approx(ceiling.fps / limit.fps, abs=1e-3)
    assert (ceiling.batch_size, ceiling.inference_together_ms, ceiling.inference_alone_ms) == (
        1,
        1.65,
        1.5,
    )


def test_the_ceiling_never_passes_the_limit_nor_mixes_batch_sizes() -> None:
    """Inference together measured below alone (a shared machine's noise) counts as alone;
    each batch size timed together is compared with the same size alone."""
    steps = components(decode=0.02, preprocess=0.12, batch_1=1.5, batch_8=1.6)
    noisy = replace(steps, every_replica={1: Cost(1.2, 0.7, 64)})
    limit = find_limit(noisy, cores=2)
    ceiling = find_ceiling(noisy, limit, producer_cpu_ms=0.0, subscriber_cpu_ms=0.0)
    assert ceiling is not None and ceiling.fps == pytest.approx(limit.fps, abs=0.05)
    assert ceiling.limit_ratio <= 1.0
    # Together at 8 (1.62, alone 1.6) beats together at 1 (1.9, alone 1.5): 8 is priced.
    rounds = replace(steps, every_replica={1: Cost(1.9, 1.0, 64), 8: Cost(1.62, 0.9, 64)})
    ceiling = find_ceiling(rounds, find_limit(rounds, cores=2), 0.0, 0.0)
    assert ceiling is not None
    assert (ceiling.batch_size, ceiling.inference_together_ms, ceiling.inference_alone_ms) == (
        8,
        1.62,
        1.6,
    )


def test_every_replica_keeps_the_cheapest_round_of_each_batch_size() -> None:
    steps = components(decode=0.02, preprocess=0.12, batch_1=1.5, batch_8=1.6)
    slow, fast, other = Cost(1.9, 1.0, 64), Cost(1.7, 0.9, 64), Cost(1.8, 0.9, 64)
    first = replace(steps, every_replica={1: slow})
    second = replace(steps, every_replica={1: fast, 8: other})
    assert first.cheapest(second).every_replica == {1: fast, 8: other}
    assert second.cheapest(first).every_replica == {1: fast, 8: other}
    assert steps.cheapest(first).every_replica == {1: slow}
    assert steps.cheapest(steps).every_replica == {}


def test_together_goes_round_a_bounded_set_of_inputs_on_one_thread_per_copy() -> None:
    """``--frames`` may be large: the copies go round a bounded set of model inputs, in
    whole batches, and the rows counted are the rows inferred."""
    seen: dict[int, list[int]] = {0: [], 1: []}
    threads: dict[int, set[str]] = {0: set(), 1: set()}

    def copy(index: int) -> Callable[[np.ndarray], object]:
        def infer(batch: np.ndarray) -> object:
            seen[index].append(len(batch) * 10 + int(batch[0, 0]))  # rows, first row
            threads[index].add(threading.current_thread().name)
            return batch

        return infer

    tensors = np.arange(10)[:, None].repeat(3, axis=1)  # 10 rows, row i filled with i
    cost = time_together([copy(0), copy(1)], tensors, frames=10, batch_size=3)
    assert cost.frames == 2 * 12  # 4 runs of 3 rows each (10 rounded up to whole batches)
    for index in (0, 1):
        warm_up, timed = seen[index][:8], seen[index][8:]
        assert warm_up == [30, 33, 36, 30, 33, 36, 30, 33]  # whole batches of 3 only
        assert timed == [30, 33, 36, 30]
        assert len(threads[index]) == 2  # warmed up on the caller's, timed on its own
    few = time_together([copy(0)], tensors[:2], frames=5, batch_size=4)
    assert few.frames == 6 and seen[0][-3:] == [20, 20, 20]  # one batch of both rows

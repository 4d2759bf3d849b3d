"""The dispatcher's choice of replica, with failure streaks and probes: two replicas of a
real onnxruntime model that nothing runs, each batch's replica read from their submit
queues."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from streamer.config import RuntimeConfig
from streamer.errors import BackendError, FrameError, Reason
from streamer.frames import Batch
from streamer.runtime import ModelSpec, open_backend
from streamer.scheduling import replica as replica_module
from streamer.scheduling.replica import STREAK_FAILURES, Dispatched, Dispatcher, Replica


@pytest.fixture
def replicas(short_range_model: Path) -> Iterator[list[Replica]]:
    """Replica 0 on device 0 and replica 1 on device 1 (onnxruntime: both on the CPU)."""
    spec = ModelSpec("face", short_range_model)
    with open_backend(RuntimeConfig()) as backend:
        with backend.load(spec) as first, backend.load(spec) as second:
            yield [Replica(0, 0, first), Replica(1, 1, second)]


def chosen(dispatcher: Dispatcher, count: int) -> list[int]:
    """The replica each of ``count`` batches went to; each is taken off its submit queue
    and counted finished at once, as if it had run."""
    picks = []
    for _ in range(count):
        dispatcher.dispatch(Batch([]), [np.zeros((1, 3, 128, 128), np.float32)])
        (replica,) = [r for r in dispatcher.replicas if r.submit.full()]
        replica.submit.get_nowait()
        replica.finished()
        picks.append(replica.index)
    return picks


def test_a_replica_on_a_failure_streak_is_spared_until_a_success_ends_it(
    replicas: list[Replica], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(replica_module, "PROBE_INTERVAL_S", 3600.0)
    dispatcher = Dispatcher(replicas, threading.Event())
    assert sorted(chosen(dispatcher, 4)) == [0, 0, 1, 1]  # in turn
    assert replicas[1].execution_failed() == 1
    assert sorted(chosen(dispatcher, 4)) == [0, 0, 1, 1]  # one failure sidelines nothing
    assert replicas[1].execution_failed() == STREAK_FAILURES
    assert chosen(dispatcher, 4) == [0, 0, 0, 0]  # no probe due within the hour
    replicas[1].execution_succeeded()
    assert sorted(chosen(dispatcher, 4)) == [0, 0, 1, 1]


def test_a_replica_on_a_failure_streak_gets_one_probe_per_interval(
    replicas: list[Replica], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(replica_module, "PROBE_INTERVAL_S", 0.0)
    for _ in range(STREAK_FAILURES):
        replicas[1].execution_failed()  # its first probe is due at once
    monkeypatch.setattr(replica_module, "PROBE_INTERVAL_S", 3600.0)
    dispatcher = Dispatcher(replicas, threading.Event())
    assert chosen(dispatcher, 4) == [1, 0, 0, 0]  # the probe; the next is an hour away


def test_replicas_all_on_a_failure_streak_still_take_every_batch(
    replicas: list[Replica], monkeypatch: pytest.MonkeyPatch
) -> None:
    """With no replica free of a streak there is nothing better: the stage runs on those
    it has until ``max_consecutive_failures`` takes them out."""
    monkeypatch.setattr(replica_module, "PROBE_INTERVAL_S", 3600.0)
    for replica in replicas:
        for _ in range(STREAK_FAILURES):
            replica.execution_failed()
    dispatcher = Dispatcher(replicas, threading.Event())
    assert sorted(chosen(dispatcher, 4)) == [0, 0, 1, 1]


def test_a_batch_is_retried_on_a_replica_that_failed_once(replicas: list[Replica]) -> None:
    """Sporadic failures leave most replicas with one failure behind them: a retry still
    finds them (it was refused whenever every other replica had a failure of its own)."""
    dispatcher = Dispatcher(replicas, threading.Event())
    replicas[0].execution_failed()
    batch = Dispatched(Batch([]), [np.zeros((1, 3, 128, 128), np.float32)])
    error = FrameError(Reason.INFERENCE_FAILED, "ACL_ERROR_GE_FAILURE")
    replicas[1].took()
    assert dispatcher.retry(batch, replicas[1], error)
    assert replicas[0].submit.get_nowait().retried and replicas[0].in_flight == 1


def test_a_recovering_replica_is_out_of_rotation_until_it_is_back(
    replicas: list[Replica],
) -> None:
    """While its model is reloaded a replica draws no batch and takes no retry, as a failed
    one; back, it serves again, one recovery counted. One that failed meanwhile stays out."""
    dispatcher = Dispatcher(replicas, threading.Event())
    replicas[1].begin_recovery("model 'face': no output for a batch enqueued 10001 ms ago")
    assert not replicas[1].in_rotation and replicas[1].failed is None
    assert chosen(dispatcher, 4) == [0, 0, 0, 0]
    batch = Dispatched(Batch([]), [np.zeros((1, 3, 128, 128), np.float32)])
    error = FrameError(Reason.INFERENCE_FAILED, "ACL_ERROR_GE_FAILURE")
    replicas[0].took()
    assert not dispatcher.retry(batch, replicas[0], error)  # the only other one recovers
    replicas[0].finished()
    assert replicas[1].recovered() and replicas[1].recoveries == 1
    assert sorted(chosen(dispatcher, 4)) == [0, 0, 1, 1]
    replicas[1].begin_recovery("model 'face': no output for a batch enqueued 10002 ms ago")
    replicas[1].fail("reload after a lost output failed")
    assert not replicas[1].recovered() and replicas[1].recoveries == 1
    assert chosen(dispatcher, 2) == [0, 0]


def test_a_dispatch_waits_for_a_recovering_replica_and_fails_once_none_is_left(
    replicas: list[Replica],
) -> None:
    """With one replica failed and the other recovering, the stage has not failed: a
    dispatch waits for the recovering one, rather than raising 'every replica failed', and
    raises only once that one has failed too."""
    dispatcher = Dispatcher(replicas, threading.Event())
    replicas[0].fail("device 0 lost")
    replicas[1].begin_recovery("model 'face': no output for a batch enqueued 10001 ms ago")
    inputs = [np.zeros((1, 3, 128, 128), np.float32)]
    failures: list[BaseException] = []

    def dispatch() -> None:
        try:
            dispatcher.dispatch(Batch([]), inputs)
        except BackendError as exc:  # reported by the test
            failures.append(exc)

    waiting = threading.Thread(target=dispatch)
    waiting.start()
    waiting.join(0.3)
    assert waiting.is_alive(), "no replica in rotation: the dispatch waits"
    assert replicas[1].recovered()
    waiting.join(5)
    assert not waiting.is_alive() and failures == [] and replicas[1].submit.full()
    replicas[1].submit.get_nowait()
    replicas[1].finished()
    replicas[1].fail("reload after a lost output failed")
    with pytest.raises(BackendError, match="every replica failed"):
        dispatcher.dispatch(Batch([]), inputs)


@pytest.fixture
def three_replicas(short_range_model: Path) -> Iterator[list[Replica]]:
    """Replicas 0, 1 and 2 on devices 0, 1 and 2 (onnxruntime: all on the CPU)."""
    spec = ModelSpec("face", short_range_model)
    with open_backend(RuntimeConfig()) as backend:
        with backend.load(spec) as a, backend.load(spec) as b, backend.load(spec) as c:
            yield [Replica(0, 0, a), Replica(1, 1, b), Replica(2, 2, c)]


def failed_batch() -> tuple[Dispatched, FrameError]:
    inputs = [np.zeros((1, 3, 128, 128), np.float32)]
    return Dispatched(Batch([]), inputs), FrameError(Reason.INFERENCE_FAILED, "lost")


def test_a_retry_skips_a_replica_whose_submit_queue_stays_full(
    three_replicas: list[Replica],
) -> None:
    """Replica 1 has the fewest batches in flight, but its enqueue thread is held up (its
    submit queue full, as behind an output its model will lose): the retry goes to
    replica 2 at once instead of waiting on 1 and failing."""
    source, held_up, free = three_replicas
    dispatcher = Dispatcher(three_replicas, threading.Event())
    held_up.submit.put("a batch its enqueue thread has not taken")
    free.took()
    dispatched, error = failed_batch()
    assert dispatcher.retry(dispatched, source, error)
    assert free.submit.get_nowait().retried and free.in_flight == 2 and held_up.in_flight == 0


def test_a_retry_waits_for_a_replica_back_in_rotation(
    replicas: list[Replica], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The only other replica is recovering (its model reloading after a lost output): the
    retry waits for it to come back instead of failing the batch at once."""
    monkeypatch.setattr(replica_module, "RETRY_WAIT_S", 60.0)
    source, other = replicas
    other.begin_recovery("no output")
    dispatcher = Dispatcher(replicas, threading.Event())
    dispatched, error = failed_batch()
    outcome: list[bool] = []
    retrying = threading.Thread(
        target=lambda: outcome.append(dispatcher.retry(dispatched, source, error))
    )
    retrying.start()
    retrying.join(0.3)
    assert retrying.is_alive() and other.submit.empty()  # waiting, not failed
    assert other.recovered()
    retrying.join(10)
    assert outcome == [True] and other.submit.get_nowait().batch is dispatched.batch


def test_a_recovering_replicas_batch_moves_without_using_its_retry(
    replicas: list[Replica],
) -> None:
    source, other = replicas
    source.begin_recovery("no output")
    dispatcher = Dispatcher(replicas, threading.Event())
    dispatched, _ = failed_batch()
    assert dispatcher.move(dispatched, source)
    moved = other.submit.get_nowait()
    assert moved is dispatched and moved.retryable and source.retried == 0


def test_the_stop_marker_waits_for_a_batch_handed_between_replicas(
    replicas: list[Replica], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A batch in flight on replica 1 is retried on replica 0 while the marker waits for the
    stage to have none in flight. Read replica by replica, the counts could miss it (0 read
    from replica 0 just before it took the batch, then 0 from replica 1 once it let go), and
    the marker went out ahead of the retry, which then never ran. The hand-over happens at
    that worst moment here, or after 50 ms where the replicas' counts are not read."""
    target, source = replicas
    handed = threading.Event()

    def hand_over() -> None:
        if not handed.is_set():
            handed.set()
            target.took()
            source.finished()

    def in_flight(replica: Replica) -> int:
        count = replica._in_flight
        if replica is target:
            hand_over()
        return count

    monkeypatch.setattr(Replica, "in_flight", property(in_flight))
    dispatcher = Dispatcher(replicas, threading.Event())
    source.took()
    stopping = threading.Thread(target=dispatcher.broadcast, args=("STOP",))
    stopping.start()
    threading.Timer(0.05, hand_over).start()
    stopping.join(0.5)
    assert handed.is_set() and stopping.is_alive() and target.submit.empty()
    target.finished()
    stopping.join(10)
    assert not stopping.is_alive()
    assert target.submit.get_nowait() == source.submit.get_nowait() == "STOP"

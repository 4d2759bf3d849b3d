"""Injected faults: a failed execution fails its batch only, slow executions and full queues
are backpressure, a broken device side stops the model with BackendError, never a hang."""

from __future__ import annotations

import re
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from acl_testing import MakeBackend, Reference, assert_close, blazeface_input

from streamer.errors import BackendError
from streamer.runtime.acl.constants import AclCode
from streamer.runtime.acl.errors import AclError
from streamer.runtime.base import ModelSpec, QueueModel

pytestmark = pytest.mark.timeout(60)


@pytest.mark.parametrize("mode", ["async", "sync"])
def test_an_injected_execute_failure_fails_that_batch_only(
    mode: str,
    make_backend: MakeBackend,
    dynamic_model: Path,
    frames: list[np.ndarray],
    reference: Reference,
) -> None:
    backend = make_backend(sim={"fail_every_n_executes": 2})
    model = backend.load(ModelSpec("face", dynamic_model, mode=mode, max_in_flight=4))
    batches = [blazeface_input(frames[:gear]) for gear in (1, 2, 4, 8)]
    for batch in batches:
        model.enqueue([batch])
    results = [model.dequeue(5000) for _ in batches]
    for index, (batch, done) in enumerate(zip(batches, results, strict=True)):
        assert done is not None
        if index % 2:
            assert done.outputs is None and done.error is not None
            assert done.error.reason == "inference_failed"
            assert "ACL_ERROR_GE_FAILURE (500002)" in done.error.detail
            assert f"acl.mdl.execute{'_async' if mode == 'async' else ''}" in done.error.detail
        else:
            assert done.error is None
            assert_close(done.outputs, reference(batch))
    model.close()


def test_queue_mode_lost_output_stops_the_model_without_hanging(
    make_backend: MakeBackend, static4_model: Path, frames: list[np.ndarray]
) -> None:
    backend = make_backend(result_timeout_ms=300, sim={"fail_every_n_executes": 1})
    model = backend.load(ModelSpec("face", static4_model, mode="queue"))
    model.enqueue([blazeface_input(frames[:4])])
    started = time.monotonic()
    lost = (
        r"no output for a batch enqueued \d+ ms ago \(its execution failed on the device, or runs"
    )
    with pytest.raises(BackendError, match=lost + r" past result_timeout_ms = 300\)"):
        while model.dequeue(100) is None:
            assert time.monotonic() - started < 5
    assert backend.simulator.queues.failed_executions == 1
    model.close()


def test_queue_mode_never_gives_a_lost_output_s_batch_the_next_one(
    make_backend: MakeBackend,
    static4_model: Path,
    frames: list[np.ndarray],
    reference: Reference,
) -> None:
    """The second execution fails on the device without an output and the model goes on.
    With two batches in flight, the third batch's output was the second's result (no error:
    one camera's detections on another's frames). With one in flight, the third waits until
    the second's output is given up on, and the model stops."""
    backend = make_backend(result_timeout_ms=300, sim={"fail_every_n_executes": 2})
    model = backend.load(ModelSpec("face", static4_model, mode="queue", max_in_flight=2))
    batch = blazeface_input(frames[:4])
    first_out = threading.Event()
    refused: list[BaseException] = []

    def enqueue_thread() -> None:  # every enqueue from one thread, as queue mode requires
        model.attach_thread()
        model.enqueue([batch])
        first_out.wait(10)
        try:
            model.enqueue([batch])  # its execution fails
            model.enqueue([batch])
        except BackendError as exc:
            refused.append(exc)

    enqueuer = threading.Thread(target=enqueue_thread)
    enqueuer.start()
    done = model.dequeue(5000)
    assert done is not None and done.error is None
    assert_close(done.outputs, reference(batch))
    first_out.set()
    with pytest.raises(BackendError, match="no output for a batch enqueued"):
        while (done := model.dequeue(100)) is None:
            pass
        assert done.error is not None, "the third batch's output taken for the second's"
    model.interrupt()  # as the failed replica does
    enqueuer.join(10)
    assert refused and not enqueuer.is_alive()
    model.close()


@pytest.mark.parametrize("mode", ["queue", "async", "sync"])
def test_slow_executions_time_out_dequeue_then_arrive(
    mode: str, make_backend: MakeBackend, static4_model: Path, frames: list[np.ndarray]
) -> None:
    backend = make_backend(sim={"execute_delay_ms": 1500})
    model = backend.load(ModelSpec("face", static4_model, mode=mode))
    assert model.dequeue(0) is None, "nothing enqueued: an immediate None"
    batch = blazeface_input(frames[:4])

    def produce() -> None:
        model.attach_thread()
        model.enqueue([batch])

    producer = threading.Thread(target=produce)
    producer.start()
    started = time.monotonic()
    first = model.dequeue(50)
    assert first is None or mode == "sync", "async and queue: not done after 50 ms"
    # It gave up long before the 1.5 s execution ended (not within a tight bound: a loaded
    # machine can stall a thread for a few hundred ms).
    assert time.monotonic() - started < 1.2
    done = first or model.dequeue(5000)
    assert done is not None and done.error is None
    producer.join()
    model.close()


def test_a_full_queue_is_backpressure(
    make_backend: MakeBackend, static4_model: Path, frames: list[np.ndarray], reference: Reference
) -> None:
    backend = make_backend(sim={"queue_full_every_n_enqueues": 2})
    model = backend.load(ModelSpec("face", static4_model, mode="queue", max_in_flight=3))
    batches = [blazeface_input(frames[i : i + 4]) for i in range(3)]
    for batch in batches:  # one in flight (queue mode)
        model.enqueue([batch])
        done = model.dequeue(5000)
        assert done is not None
        assert_close(done.outputs, reference(batch))
    codes = [c.result for c in backend.simulator.log.calls("acltdtEnqueueData")]
    assert AclCode.ERROR_RT_QUEUE_FULL in codes
    model.close()


def test_queue_timeouts_reported_as_driver_timeouts(
    make_backend: MakeBackend, static4_model: Path, frames: list[np.ndarray]
) -> None:
    backend = make_backend(
        queue_depth=2, sim={"queue_timeout_code": "report_timeout", "execute_delay_ms": 100}
    )
    model = backend.load(ModelSpec("face", static4_model, mode="queue", max_in_flight=4))
    assert model.dequeue(20) is None, "507012 on an empty queue is 'no result yet'"
    batch = blazeface_input(frames[:4])
    for _ in range(4):  # one in flight (queue mode); each dequeue waits through 507012s
        model.enqueue([batch])
        assert (done := model.dequeue(5000)) is not None and done.error is None
    model.close()


class SecondEnqueue:
    """Two enqueues of ``batch`` from one thread (S28), the second started once the first
    returned: ``done`` when it returns, ``errors`` what it raised."""

    def __init__(self, model: QueueModel, batch: np.ndarray) -> None:
        self.done = threading.Event()
        self.errors: list[BackendError] = []
        first_done = threading.Event()

        def enqueue_two() -> None:
            model.attach_thread()
            model.enqueue([batch])
            first_done.set()
            try:
                model.enqueue([batch])
            except BackendError as exc:
                self.errors.append(exc)
            self.done.set()

        self.thread = threading.Thread(target=enqueue_two)
        self.thread.start()
        assert first_done.wait(5)


@pytest.mark.parametrize("mode", ["queue", "async", "sync"])
def test_enqueue_blocks_at_max_in_flight(
    mode: str, make_backend: MakeBackend, static4_model: Path, frames: list[np.ndarray]
) -> None:
    backend = make_backend(queue_depth=2)
    model = backend.load(ModelSpec("face", static4_model, mode=mode, max_in_flight=1))
    second = SecondEnqueue(model, blazeface_input(frames[:4]))
    assert not second.done.wait(0.3), "one batch in flight: the second enqueue waits"
    assert model.dequeue(5000) is not None
    assert second.done.wait(5) and not second.errors, "a dequeue makes room"
    second.thread.join()
    assert model.dequeue(5000) is not None
    model.close()


@pytest.mark.parametrize("mode", ["queue", "async", "sync"])
def test_interrupt_ends_an_enqueue_waiting_for_room(
    mode: str, make_backend: MakeBackend, static4_model: Path, frames: list[np.ndarray]
) -> None:
    backend = make_backend(queue_depth=2)
    model = backend.load(ModelSpec("face", static4_model, mode=mode, max_in_flight=1))
    second = SecondEnqueue(model, blazeface_input(frames[:4]))
    assert not second.done.wait(0.3), "one batch in flight: the second enqueue waits"
    model.interrupt()
    assert second.done.wait(5) and "interrupted" in str(second.errors[0])
    second.thread.join()
    assert model.dequeue(5000) is not None  # the batch already in still finishes
    model.close()


def test_a_dead_callback_thread_stops_the_model(
    make_backend: MakeBackend, dynamic_model: Path, frames: list[np.ndarray]
) -> None:
    backend = make_backend(
        result_timeout_ms=200, sim={"fail_calls": {"acl.rt.process_report": 500003}}
    )
    model = backend.load(ModelSpec("face", dynamic_model, mode="async"))
    model.enqueue([blazeface_input(frames[:1])])
    with pytest.raises(BackendError, match="callback thread failed.*ACL_ERROR_RT_FAILURE"):
        model.dequeue(2000)
    # The stream waits for a callback no thread will run: it never synchronises, so the
    # model and its device are left alone rather than freed under the stream's tasks.
    with pytest.raises(BackendError, match="'face' on device 0 abandoned"):
        model.close()
    backend.close()
    assert backend.abandoned_devices == [0]


def test_an_execution_failed_on_the_device_fails_its_batch_without_its_callback(
    make_backend: MakeBackend, dynamic_model: Path, frames: list[np.ndarray], reference: Reference
) -> None:
    """The third execute_async fails on the device and its stream drops its callback: the
    batch fails once ``result_timeout_ms`` passed, with the code the stream reports; the
    other replica's batches, and the replica's next batch, come out right."""
    backend = make_backend(result_timeout_ms=300, sim={"task_fail_every_n_executes": 3})
    first, second = (
        backend.load(ModelSpec("face", dynamic_model, mode="async", max_in_flight=4))
        for _ in range(2)
    )
    batch = blazeface_input(frames[:2])
    for model in (first, second, first, second):  # the third execution fails
        model.enqueue([batch])
    for done in (second.dequeue(5000), second.dequeue(5000), first.dequeue(5000)):
        assert done is not None and done.error is None
        assert_close(done.outputs, reference(batch))
    failed = first.dequeue(5000)
    assert failed is not None and failed.outputs is None and failed.error is not None
    assert failed.error.reason == "inference_failed"
    assert "ACL_ERROR_RT_AICORE_EXCEPTION (507015)" in failed.error.detail
    first.enqueue([batch])
    assert (done := first.dequeue(5000)) is not None and done.error is None
    assert_close(done.outputs, reference(batch))
    first.close()
    second.close()


def test_older_releases_callback_timeout_code_is_no_report_yet(
    make_backend: MakeBackend, dynamic_model: Path, frames: list[np.ndarray], reference: Reference
) -> None:
    """Older CANN releases end an empty ``process_report`` turn with 100036, not 507012: the
    callback thread goes on and the batches come out."""
    backend = make_backend(
        report_timeout_ms=10, sim={"report_timeout_code": "wait_callback_timeout"}
    )
    model = backend.load(ModelSpec("face", dynamic_model, mode="async"))
    assert backend.simulator.log.wait_for(  # the callback thread had a turn without one
        lambda c: (
            c.api == "acl.rt.process_report" and c.result == AclCode.ERROR_WAIT_CALLBACK_TIMEOUT
        ),
        timeout_s=30,
    )
    batch = blazeface_input(frames[:1])
    model.enqueue([batch])
    assert (done := model.dequeue(5000)) is not None and done.error is None
    assert_close(done.outputs, reference(batch))
    model.close()


def test_a_device_out_of_memory_names_the_model_the_device_and_the_bytes(
    make_backend: MakeBackend, dynamic_model: Path
) -> None:
    """A load that runs out of device memory says which model, where, and how much it asked
    for (the bare ``acl.rt.malloc failed`` gave a user nothing to act on); nothing leaks."""
    backend = make_backend(devices=(0, 1), sim={"device_memory_mb": 1})
    spec = ModelSpec("face", dynamic_model, mode="async", max_in_flight=64, device=1)
    with pytest.raises(AclError) as refused:
        backend.load(spec)
    assert refused.value.code == AclCode.ERROR_BAD_ALLOC
    assert re.fullmatch(
        r"model 'face' on device 1: acl\.rt\.malloc of \d+ bytes failed: "
        r"ACL_ERROR_BAD_ALLOC \(200000\)",
        str(refused.value),
    )


def test_a_batch_submitted_while_a_flush_synchronises_is_settled_by_that_sync(
    make_backend: MakeBackend,
    dynamic_model: Path,
    frames: list[np.ndarray],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The dequeue's flush synchronises the stream for the first two batches, the second of
    which fails on the device; a third, submitted during that sync, is dropped by the
    stopped stream. The sync's code fails all three: the third was left in flight, and the
    next flush, whose sync found the stream idle and clean, published its unwritten outputs
    as a result."""
    backend = make_backend(
        result_timeout_ms=2000,
        callback_interval=4,  # three batches: no callback, each is settled by a flush
        callback_flush_ms=0,
        sim={"task_fail_every_n_executes": 2, "execute_delay_ms": 300},
    )
    model = backend.load(ModelSpec("face", dynamic_model, mode="async", max_in_flight=4))
    batch = blazeface_input(frames[:1])
    in_sync, submitted = threading.Event(), threading.Event()
    rt = backend.simulator.acl.rt
    synchronize = rt.synchronize_stream_with_timeout

    def synchronize_after_a_submit(stream: int, timeout_ms: int) -> int:
        if not in_sync.is_set():
            in_sync.set()
            assert submitted.wait(5)
        return synchronize(stream, timeout_ms)

    monkeypatch.setattr(rt, "synchronize_stream_with_timeout", synchronize_after_a_submit)

    def enqueue_three() -> None:
        model.attach_thread()
        model.enqueue([batch])
        model.enqueue([batch])  # fails on the device once the first has run
        assert in_sync.wait(5)
        model.enqueue([batch])
        submitted.set()

    enqueuer = threading.Thread(target=enqueue_three)
    enqueuer.start()
    assert backend.simulator.log.wait_for(lambda c: c.api == "acl.mdl.execute_async", 5)
    results = [model.dequeue(5000) for _ in range(3)]
    enqueuer.join(5)
    for done in results:
        assert done is not None and done.outputs is None and done.error is not None
        assert "ACL_ERROR_RT_AICORE_EXCEPTION (507015)" in done.error.detail
    model.close()

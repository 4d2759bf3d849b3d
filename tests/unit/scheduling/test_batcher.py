"""Batch assembly and the enqueue/dequeue ledger, with a small in-process fake model.

The fake stands in for a backend only in these pure-logic tests; the real backends are
exercised in tests/unit/runtime and end to end.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Sequence

import numpy as np

from streamer.config import BatchConfig
from streamer.errors import FrameError, Reason
from streamer.frames import STOP, Batch, EndOfStream, Frame
from streamer.runtime.base import InferenceOutputs, ModelInfo, QueueModel, TensorInfo
from streamer.scheduling.batcher import Batcher
from streamer.scheduling.dequeuer import Dequeuer
from streamer.scheduling.enqueuer import Enqueuer
from streamer.scheduling.mailbox import Mailbox
from streamer.scheduling.policy import BatchPolicy
from streamer.scheduling.replica import Dispatcher, Replica
from streamer.scheduling.tensor_link import Handover


class EchoModel(QueueModel):
    """Returns each batch's input summed per row; fails batches listed in ``fail``."""

    def __init__(self, gears: tuple[int, ...] = (), fail: set[int] | None = None) -> None:
        shape = (-1 if not gears or len(gears) > 1 else gears[0], 2)
        tensor = TensorInfo("x", shape, np.dtype(np.float32))
        self.info = ModelInfo("echo", (tensor,), (tensor,), batch_gears=gears)
        self.sizes: list[int] = []
        self._fail = fail or set()
        self._done: queue.SimpleQueue[InferenceOutputs] = queue.SimpleQueue()

    def enqueue(self, inputs: Sequence[np.ndarray]) -> None:
        index = len(self.sizes)
        self.sizes.append(len(inputs[0]))
        if index in self._fail:
            error = FrameError(Reason.INFERENCE_FAILED, "injected")
            self._done.put(InferenceOutputs(None, error, 1, 2))
        else:
            self._done.put(InferenceOutputs((inputs[0].sum(axis=1),), None, 1, 2))

    def interrupt(self) -> None:
        """Nothing to wake: its enqueue never waits."""

    def dequeue(self, timeout_ms: int) -> InferenceOutputs | None:
        try:
            return self._done.get(timeout=timeout_ms / 1000)
        except queue.Empty:
            return None

    def close(self) -> None:
        pass


def frame(seq: int, source: str = "cam", failed: bool = False) -> Frame:
    f = Frame(source, seq, time.monotonic_ns(), time.time())
    if failed:
        f.fail(FrameError(Reason.DECODE_FAILED, "x"))
    else:
        f.tensor = np.full(2, seq, dtype=np.float32)
    return f


def postprocess(outputs: Sequence[np.ndarray], frames: list[Frame]) -> None:
    for row, f in enumerate(frames):
        f.results = {"sum": float(outputs[0][row])}


class Stage:
    """A batcher, one replica's enqueue and dequeue threads, and the queue after them."""

    def __init__(
        self, models: list[QueueModel], policy: BatchPolicy, inbox: Mailbox | None = None
    ) -> None:
        self.inbox = Mailbox() if inbox is None else inbox
        self.out: queue.SimpleQueue[object] = queue.SimpleQueue()
        abort = threading.Event()
        self.replicas = [Replica(i, i, model) for i, model in enumerate(models)]
        self.batcher = Batcher(
            "echo", Dispatcher(self.replicas, abort), policy, self.inbox, self.out, abort
        )
        self.workers = [
            *(Dequeuer(r, self.out, postprocess, abort, 3) for r in self.replicas),
            *(Enqueuer(r, abort) for r in self.replicas),
            self.batcher,
        ]
        for worker in self.workers:
            worker.launch(5)

    def finish(self) -> list[object]:
        """Send STOP, join every thread, return what came out."""
        self.inbox.put(STOP)
        for worker in reversed(self.workers):
            worker.join(5)
            assert not worker.is_alive() and worker.failure is None
        drained = []
        while True:
            try:
                drained.append(self.out.get_nowait())
            except queue.Empty:
                return drained


def run(model: EchoModel, policy: BatchPolicy, items: list[object]) -> list[object]:
    stage = Stage([model], policy)
    for item in items:
        stage.inbox.put(item)
    return stage.finish()


def frames_of(items: list[object]) -> list[Frame]:
    return [f for item in items if isinstance(item, Batch) for f in item.frames]


def test_full_batches_then_remainder_on_stop() -> None:
    model = EchoModel()
    policy = BatchPolicy(max_size=4, max_delay_ns=10**10, gears=())
    out = run(model, policy, [frame(i) for i in range(10)])
    assert model.sizes == [4, 4, 2]
    assert [f.seq for f in frames_of(out)] == list(range(10))
    assert [f.results["sum"] for f in frames_of(out)] == [2.0 * i for i in range(10)]


def test_deadline_flushes_a_partial_batch() -> None:
    stage = Stage([EchoModel()], BatchPolicy(8, 20_000_000, ()))
    stage.inbox.put(frame(0))
    stage.inbox.put(frame(1))
    batch = stage.out.get(timeout=5)  # long before any STOP: the 20 ms deadline flushed it
    assert isinstance(batch, Batch) and [f.seq for f in batch.frames] == [0, 1]
    assert stage.finish() == []


def test_failed_frames_pass_at_once_and_take_no_row() -> None:
    model = EchoModel()
    items = [frame(0), frame(1, failed=True), frame(2), frame(3, failed=True)]
    out = run(model, BatchPolicy(8, 10**10, ()), items)
    assert model.sizes == [2]
    frames = frames_of(out)
    assert [f.seq for f in frames] == [1, 3, 0, 2]  # egress restores each source's order
    assert [f.error is None for f in frames] == [False, False, True, True]
    assert frames[3].results == {"sum": 4.0}


def test_end_of_stream_flushes_the_pending_batch() -> None:
    model = EchoModel()
    out = run(model, BatchPolicy(8, 10**10, ()), [frame(0), EndOfStream("cam", 0), frame(1)])
    assert model.sizes == [1, 1]  # frame 0 did not wait for frame 1
    assert sum(isinstance(item, EndOfStream) for item in out) == 1
    assert sorted(f.seq for f in frames_of(out)) == [0, 1]


def test_padding_to_the_next_gear() -> None:
    model = EchoModel(gears=(1, 2, 4, 8))
    out = run(model, BatchPolicy(8, 10**10, (1, 2, 4, 8)), [frame(i) for i in range(11)])
    assert model.sizes == [8, 4]
    assert [f.results["sum"] for f in frames_of(out)] == [2.0 * i for i in range(11)]


def test_a_failed_execution_fails_only_its_batch() -> None:
    model = EchoModel(fail={0})
    out = run(model, BatchPolicy(2, 10**10, ()), [frame(i) for i in range(4)])
    frames = frames_of(out)
    assert [f.error.reason if f.error else None for f in frames] == [
        "inference_failed",
        "inference_failed",
        None,
        None,
    ]


def test_batches_above_the_largest_gear_are_split() -> None:
    model = EchoModel(gears=(1,))
    policy = BatchPolicy.for_model(BatchConfig(max_size=4), model.info)
    out = run(model, policy, [frame(i) for i in range(4)])
    assert model.sizes == [1, 1, 1, 1]
    assert [f.results["sum"] for f in frames_of(out)] == [0.0, 2.0, 4.0, 6.0]


def test_lower_strategy_splits_instead_of_padding() -> None:
    model = EchoModel(gears=(1, 4, 8))
    policy = BatchPolicy(16, 10**10, (1, 4, 8), "lower")
    out = run(model, policy, [frame(i) for i in range(13)])
    assert model.sizes == [8, 4, 1]
    assert len(frames_of(out)) == 13


def test_frames_of_different_shapes_never_share_a_batch() -> None:
    model = EchoModel()
    small, large = frame(0), frame(1)
    large.tensor = np.ones(3, dtype=np.float32)
    out = run(model, BatchPolicy(8, 10**10, ()), [small, large, frame(2)])
    assert sorted(model.sizes) == [1, 2]
    assert {len(b.frames) for b in out if isinstance(b, Batch)} == {1, 2}


def test_deadline_flushes_are_counted_by_reason() -> None:
    stage = Stage([EchoModel()], BatchPolicy(2, 1_000_000, ()))
    stage.inbox.put(frame(0))
    stage.out.get(timeout=5)
    for seq in (1, 2, 3):
        stage.inbox.put(frame(seq))
    stage.finish()
    assert stage.batcher.flushes == {"deadline": 1, "full": 1, "marker": 1}


def test_batches_spread_over_replicas_and_a_failing_replicas_batches_run_on_the_other() -> None:
    healthy, failing = EchoModel(), EchoModel(fail=set(range(100)))
    stage = Stage([healthy, failing], BatchPolicy(1, 10**10, ()))
    for seq in range(20):
        stage.inbox.put(frame(seq))
    out = stage.finish()
    frames = frames_of(out)
    assert sorted(f.seq for f in frames) == list(range(20)) and failing.sizes
    # Each batch that failed ran again on the healthy replica: every frame has its result.
    assert [f.error for f in frames if f.error is not None] == []
    assert sorted(f.results["sum"] for f in frames) == [2.0 * i for i in range(20)]
    assert sum(healthy.sizes) == 20
    assert stage.replicas[1].retried >= len(failing.sizes) and stage.replicas[1].on_streak


def test_plans_per_strategy() -> None:
    def sizes(strategy: str, n: int) -> list[tuple[int, int]]:
        policy = BatchPolicy(16, 0, (1, 4, 8), strategy)  # type: ignore[arg-type]
        return [(e.frames, e.rows) for e in policy.plan(n)]

    assert sizes("upper", 5) == [(5, 8)]
    assert sizes("upper", 13) == [(8, 8), (5, 8)]
    assert sizes("lower", 13) == [(8, 8), (4, 4), (1, 1)]
    assert sizes("nearest", 5) == [(4, 4), (1, 1)]
    assert sizes("nearest", 6) == [(6, 8)]
    assert BatchPolicy(8, 0, ()).plan(5)[0].rows == 5


def test_the_largest_execution_is_a_full_batch_s_gear() -> None:
    """What the batcher allocates at most for one execution, checked against memory at start:
    no batch of up to ``max_size`` frames has more rows, whatever the strategy."""
    for strategy in ("upper", "lower", "nearest"):
        for gears in ((), (1, 4, 16), (2, 3, 5), (32,)):
            policy = BatchPolicy(8, 0, gears, strategy)  # type: ignore[arg-type]
            every = max(e.rows for n in range(1, 9) for e in policy.plan(n))
            assert policy.largest_execution == every, (strategy, gears)
    assert BatchPolicy(8, 0, (1, 4, 16)).largest_execution == 16


def test_default_gears_for_a_free_batch_dim() -> None:
    tensor = TensorInfo("x", (-1, 2), np.dtype(np.float32))
    info = ModelInfo("free", (tensor,), (tensor,))
    assert BatchPolicy.for_model(BatchConfig(max_size=8), info).gears == (1, 2, 4, 8)
    assert BatchPolicy.for_model(BatchConfig(max_size=6), info).gears == (1, 2, 4, 6)
    configured = BatchConfig(max_size=8, gears=(1, 8))
    info = ModelInfo("free", (tensor,), (tensor,), batch_gears=(1, 8))
    assert BatchPolicy.for_model(configured, info).gears == (1, 8)


class GatedModel(EchoModel):
    """An echo model whose executions wait until ``gate`` is set: its replica stays busy."""

    def __init__(self) -> None:
        super().__init__()
        self.gate = threading.Event()

    def enqueue(self, inputs: Sequence[np.ndarray]) -> None:
        self.gate.wait(30)
        super().enqueue(inputs)


def test_frames_the_replicas_cannot_take_yet_stay_in_the_inbox() -> None:
    """With its replica busy the batcher holds one batch it cannot dispatch, and the frames
    behind it stay queued, where admission's ``drop_oldest`` and ``latest`` can still drop
    them: a batcher that took all 20 would keep a full queue's worth more frames waiting
    (twice the latency under overload)."""
    model, inbox = GatedModel(), Mailbox()
    for seq in range(20):
        inbox.put(frame(seq))
    stage = Stage([model], BatchPolicy(4, 10**10, ()), inbox)
    replica = stage.replicas[0]
    while not replica.submit.full():  # batch 0 executes (held), batch 1 waits for it
        time.sleep(0.01)
    queued = inbox.qsize()
    model.gate.set()
    out = stage.finish()
    assert queued >= 20 - 3 * 4  # batch 2 at most was taken besides
    assert model.sizes == [4] * 5 and [f.seq for f in frames_of(out)] == list(range(20))


def test_a_tensor_stage_batch_with_no_live_replica_on_its_device_fails_naming_the_stage() -> None:
    """A tensor stage runs each upstream batch on the device that holds its inputs: with the
    replica on device 1 out of rotation, a batch handed over on device 1 fails, its error
    naming the stage as every other stage error does, and one on device 0 runs."""
    stage = Stage([EchoModel(), EchoModel()], BatchPolicy(8, 10**10, ()))
    stage.replicas[1].fail("device 1 reset")
    for device, seqs in ((1, (0, 1)), (0, (2, 3))):
        frames = [frame(seq) for seq in seqs]
        handover = Handover((np.stack([f.tensor for f in frames]),), device)
        for f in frames:
            f.handover, f.tensor = handover, None
        stage.inbox.put(Batch(frames, list(frames), len(frames)))
    done = sorted(frames_of(stage.finish()), key=lambda f: f.seq)
    assert [f.error.detail if f.error else f.results["sum"] for f in done] == [
        "stage echo: no live replica on device 1",
        "stage echo: no live replica on device 1",
        4.0,
        6.0,
    ]

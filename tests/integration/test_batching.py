"""Batch assembly with gears on the real BlazeFace model: padding, splitting, deadlines.

Every frame of a padded or split batch must give what it gives when run alone.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

import numpy as np
import onnx
import pytest
from structlog.testing import capture_logs

from streamer.config import BatchConfig, RuntimeConfig
from streamer.errors import FrameError, Reason
from streamer.frames import STOP, Batch, Frame
from streamer.log_budget import LogBudget
from streamer.runtime import ModelSpec, QueueModel, open_backend
from streamer.scheduling import dequeuer
from streamer.scheduling.batcher import Batcher
from streamer.scheduling.dequeuer import Dequeuer, Postprocess
from streamer.scheduling.enqueuer import Enqueuer
from streamer.scheduling.mailbox import Mailbox
from streamer.scheduling.policy import BatchPolicy
from streamer.scheduling.replica import Dispatcher, Replica


class Recording(QueueModel):
    """The real model, recording the batch size of every execution."""

    def __init__(self, model: QueueModel) -> None:
        self.info = model.info
        self.sizes: list[int] = []
        self._model = model

    def enqueue(self, inputs: Sequence[np.ndarray]) -> None:
        self.sizes.append(len(inputs[0]))
        self._model.enqueue(inputs)

    def interrupt(self) -> None:
        self._model.interrupt()

    def dequeue(self, timeout_ms: int):  # type: ignore[no-untyped-def]
        return self._model.dequeue(timeout_ms)

    def close(self) -> None:
        self._model.close()


@pytest.fixture
def model(short_range_model: Path) -> Iterator[Recording]:
    spec = ModelSpec("face", short_range_model, max_in_flight=4, batch_gears=(1, 4, 8))
    with open_backend(RuntimeConfig(options={"intra_op_threads": 1})) as backend:
        with backend.load(spec) as loaded:
            yield Recording(loaded)


def frames(count: int) -> list[Frame]:
    rng = np.random.default_rng(count)
    out = []
    for seq in range(count):
        frame = Frame("cam", seq, time.monotonic_ns(), time.time())
        frame.tensor = rng.uniform(-1, 1, (3, 128, 128)).astype(np.float32)
        out.append(frame)
    return out


def keep_outputs(outputs: Sequence[np.ndarray], batch: list[Frame]) -> None:
    for row, frame in enumerate(batch):
        frame.results = {"regressors": outputs[0][row].copy()}


def run_queued(
    model: QueueModel,
    policy: BatchPolicy,
    items: list[Frame],
    postprocess: Postprocess = keep_outputs,
) -> list[Frame]:
    """Queue every frame first, then run the stage's threads until STOP."""
    inbox = Mailbox()
    for item in items:
        inbox.put(item)
    inbox.put(STOP)
    out: queue.SimpleQueue[object] = queue.SimpleQueue()
    abort = threading.Event()
    replica = Replica(0, 0, model)
    workers = [
        Dequeuer(replica, out, postprocess, abort),
        Enqueuer(replica, abort),
        Batcher("face", Dispatcher([replica], abort), policy, inbox, out, abort),
    ]
    for worker in workers:
        worker.launch(5)
    for worker in reversed(workers):
        worker.join(60)
        assert worker.failure is None
    done = []
    while not out.empty():
        item = out.get()
        assert isinstance(item, Batch)
        done += item.frames
    return sorted(done, key=lambda f: f.seq)


def alone(model: QueueModel, frame_tensor: np.ndarray) -> np.ndarray:
    model.enqueue([frame_tensor[None]])
    result = model.dequeue(10_000)
    assert result is not None and result.outputs is not None
    return result.outputs[0][0]


def test_five_queued_frames_run_once_at_gear_8(model: Recording) -> None:
    items = frames(5)
    tensors = [f.tensor.copy() for f in items]  # type: ignore[union-attr]
    policy = BatchPolicy.for_model(BatchConfig(max_size=8), model.info)
    done = run_queued(model, policy, items)
    assert model.sizes == [8]  # 5 frames and 3 padding rows
    assert [f.seq for f in done] == [0, 1, 2, 3, 4]
    for frame, tensor in zip(done, tensors, strict=True):
        diff = np.abs(frame.results["regressors"] - alone(model, tensor)).max()
        assert diff <= 1e-4


@pytest.mark.parametrize(("strategy", "sizes"), [("upper", [8, 8]), ("lower", [8, 4, 1])])
def test_thirteen_frames_split_by_strategy(
    model: Recording, strategy: str, sizes: list[int]
) -> None:
    config = BatchConfig(max_size=16, strategy=strategy)  # type: ignore[arg-type]
    done = run_queued(model, BatchPolicy.for_model(config, model.info), frames(13))
    assert model.sizes == sizes
    assert [f.seq for f in done] == list(range(13))


def static_batch(model_file: Path, batch: int, out: Path) -> Path:
    """A copy of the model with its batch dim fixed, as a static-batch export would be."""
    graph = onnx.load(str(model_file))
    for value in (*graph.graph.input, *graph.graph.output):
        value.type.tensor_type.shape.dim[0].dim_value = batch
    onnx.save(graph, str(out))
    return out


@pytest.mark.parametrize(
    ("raised", "detail"),
    [
        (
            FrameError(Reason.POSTPROCESS_FAILED, "operator NMS: no kernel"),
            "operator NMS: no kernel",
        ),
        (ZeroDivisionError("division by zero"), "ZeroDivisionError: division by zero"),
    ],
)
def test_a_failing_postprocess_fails_its_frames_with_a_warning(
    model: Recording, raised: Exception, detail: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every frame of the batch fails with ``postprocess_failed`` naming the stage, and the
    log says so (a postprocess that fails every batch must not fail frames silently)."""
    monkeypatch.setattr(dequeuer, "_POSTPROCESS_LINES", LogBudget("postprocess_failed"))

    def failing(outputs: Sequence[np.ndarray], batch: list[Frame]) -> None:
        raise raised

    policy = BatchPolicy.for_model(BatchConfig(max_size=8), model.info)
    with capture_logs() as logs:
        done = run_queued(model, policy, frames(5), failing)
    assert {(f.error.reason, f.error.detail) for f in done if f.error} == {
        ("postprocess_failed", f"stage face: {detail}")
    }
    assert len(done) == 5
    (warning,) = [e for e in logs if e["event"] == "postprocess_failed"]
    assert warning["log_level"] == "warning" and warning["detail"] == detail
    assert warning["model"] == "face" and warning["frames"] == 5


def test_static_batch_8_flushes_five_frames_on_the_deadline(
    short_range_model: Path, tmp_path: Path
) -> None:
    path = static_batch(short_range_model, 8, tmp_path / "static8.onnx")
    with open_backend(RuntimeConfig()) as backend, backend.load(ModelSpec("face", path)) as loaded:
        assert loaded.info.batch_gears == (8,)
        model = Recording(loaded)
        policy = BatchPolicy.for_model(BatchConfig(max_size=8, max_delay_ms=20), model.info)
        inbox = Mailbox()
        out: queue.SimpleQueue[object] = queue.SimpleQueue()
        abort = threading.Event()
        replica = Replica(0, 0, model)
        batcher = Batcher("face", Dispatcher([replica], abort), policy, inbox, out, abort)
        workers = [
            Dequeuer(replica, out, lambda outputs, batch: None, abort),
            Enqueuer(replica, abort),
            batcher,
        ]
        for worker in workers:
            worker.launch(5)
        for frame in frames(5):
            inbox.put(frame)
        batch = out.get(timeout=30)  # then nothing more arrives: only the deadline flushes
        assert isinstance(batch, Batch) and len(batch.frames) == 5 and batch.rows == 8
        assert batcher.flushes["deadline"] == 1 and model.sizes == [8]
        inbox.put(STOP)
        for worker in reversed(workers):
            worker.join(10)

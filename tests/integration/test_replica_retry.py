"""A batch that fails on one replica runs again on another, and a replica on a failure streak
draws probe batches only: one stage on two simulated Ascend devices (``acl-sim``, async mode),
a replica on each, with its batcher, enqueue and dequeue threads; device 1 is lost after a
few executions (``device_lost_after_n_executes``), or every execution fails."""

from __future__ import annotations

import json
import queue
import shutil
import threading
import time
from collections import Counter
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from structlog.testing import capture_logs

from streamer.config import BatchConfig, RuntimeConfig
from streamer.frames import STOP, Batch, Frame
from streamer.log_budget import LogBudget
from streamer.runtime import ModelSpec, open_backend
from streamer.runtime.acl.sim.backend import AclSimBackend
from streamer.scheduling import replica as replica_module
from streamer.scheduling.batcher import Batcher
from streamer.scheduling.dequeuer import Dequeuer
from streamer.scheduling.enqueuer import Enqueuer
from streamer.scheduling.mailbox import Mailbox
from streamer.scheduling.policy import BatchPolicy
from streamer.scheduling.replica import Dispatched, Dispatcher, Replica

from .blazeface_stage import keep_regressors, reference, tensors

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def face_model(tmp_path: Path, short_range_model: Path) -> Path:
    """Short-range BlazeFace as ATC builds it with ``--dynamic_batch_size=1,2,4,8``."""
    shutil.copyfile(short_range_model, tmp_path / "face.onnx")
    manifest = {"input_shape": {"input": [-1, 3, 128, 128]}, "dynamic_batch_size": [1, 2, 4, 8]}
    (tmp_path / "face.acl.json").write_text(json.dumps(manifest))
    return tmp_path / "face.onnx"


@pytest.fixture
def retry_lines(monkeypatch: pytest.MonkeyPatch) -> None:
    """A fresh budget for ``batch_retried``: earlier tests may have spent the shared one."""
    monkeypatch.setattr(replica_module, "_RETRY_LINES", LogBudget("batch_retried"))


@dataclass
class StageRun:
    """What one run of the stage left: its frames in seq order, its replicas, and how many
    executions each replica's enqueue thread made (the simulator's call log)."""

    frames: list[Frame]
    replicas: list[Replica]
    executions: Counter[int]


def run_stage(
    model_path: Path, sim: dict[str, Any], inputs: list[np.ndarray], max_failures: int
) -> StageRun:
    """Run one frame per input through a stage with a replica on device 0 and one on
    device 1 (batches of one frame), then STOP; the models and backend closed, leak-checked."""
    config = RuntimeConfig(backend="acl-sim", devices=(0, 1), options={"sim": sim})
    with ExitStack() as stack:
        backend = stack.enter_context(open_backend(config))
        assert isinstance(backend, AclSimBackend)
        models = [
            stack.enter_context(
                backend.load(ModelSpec("face", model_path, device=device, mode="async"))
            )
            for device in (0, 1)
        ]
        replicas = [Replica(index, index, model) for index, model in enumerate(models)]
        frames = run_threads(replicas, inputs, max_failures)
        calls = backend.simulator.log.calls("acl.mdl.execute_async")
        executions = Counter(int(c.thread.removeprefix("enqueue-face-")) for c in calls)
    assert backend.simulator.live_resources() == {}
    return StageRun(frames, replicas, executions)


def run_threads(
    replicas: list[Replica], inputs: list[np.ndarray], max_failures: int
) -> list[Frame]:
    """The stage's threads over one frame per input until STOP; the frames, in seq order."""
    inbox, out = Mailbox(), queue.SimpleQueue[object]()
    for seq, tensor in enumerate(inputs):
        frame = Frame("cam", seq, time.monotonic_ns(), time.time())
        frame.tensor = tensor.copy()
        inbox.put(frame)
    inbox.put(STOP)
    abort = threading.Event()
    policy = BatchPolicy.for_model(BatchConfig(max_size=1), replicas[0].model.info)
    workers = [
        *(Dequeuer(r, out, keep_regressors, abort, max_failures) for r in replicas),
        *(Enqueuer(r, abort) for r in replicas),
        Batcher("face", Dispatcher(replicas, abort), policy, inbox, out, abort),
    ]
    for worker in workers:
        worker.launch(10)
    for worker in reversed(workers):
        worker.join(30)
        assert not worker.is_alive() and worker.failure is None
    done: list[Frame] = []
    while not out.empty():
        batch = out.get()
        assert isinstance(batch, Batch)
        done += batch.frames
    return sorted(done, key=lambda f: f.seq)


def assert_all_served(run: StageRun, expected: np.ndarray) -> None:
    """Every frame has its result (none failed), each as onnxruntime computes it."""
    assert [f.seq for f in run.frames] == list(range(len(expected)))
    assert [f.error for f in run.frames if f.error is not None] == []
    for frame in run.frames:
        np.testing.assert_allclose(frame.results["regressors"], expected[frame.seq], atol=1e-4)


def test_batches_that_fail_on_a_lost_device_run_again_on_the_other(
    face_model: Path, short_range_model: Path, retry_lines: None
) -> None:
    inputs = tensors(24)
    with capture_logs() as logs:
        run = run_stage(face_model, {"device_lost_after_n_executes": {1: 2}}, inputs, 100)
    assert_all_served(run, reference(short_range_model, inputs))
    lost = run.replicas[1]
    assert run.executions[1] > 2 and lost.on_streak and lost.failed is None
    assert lost.retried == run.executions[1] - 2 and run.replicas[0].retried == 0
    retried = [e for e in logs if e["event"] == "batch_retried"]
    assert retried and {(e["device"], e["to_device"], e["frames"]) for e in retried} == {(1, 0, 1)}
    assert "acl.mdl.execute_async failed: ACL_ERROR_GE_FAILURE (500002)" in retried[0]["detail"]


def test_a_retried_batch_keeps_the_time_it_was_first_enqueued(
    face_model: Path, retry_lines: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``batch_wait`` is preprocessed → enqueued: the wait in the batcher. A retried batch's
    second enqueue took its frames' time, so their wait counted the failed execution too."""
    first: dict[int, int] = {}
    retry = Dispatcher.retry

    def noted(dispatcher: Dispatcher, dispatched: Dispatched, *args: Any) -> bool:
        first.update({f.seq: f.batched_at_ns for f in dispatched.batch.good})
        return retry(dispatcher, dispatched, *args)

    monkeypatch.setattr(Dispatcher, "retry", noted)
    run = run_stage(face_model, {"device_lost_after_n_executes": {1: 2}}, tensors(24), 100)
    assert first and all(f.error is None for f in run.frames)
    assert {f.seq: f.batched_at_ns for f in run.frames if f.seq in first} == first


def test_a_replica_on_a_failure_streak_gets_no_batch_until_its_probe_is_due(
    face_model: Path, short_range_model: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No probe is due within the test: once its first failure is counted, the lost
    replica runs only the batches it held then: at most two in the model (max_in_flight,
    the failed one included), one being enqueued, one in its submit queue and one the
    batcher was handing it; and one more, dispatched before its second failure in a row
    (STREAK_FAILURES) puts it on a streak. Before, it drew most of the 40 batches: it failed
    them at once, so it always had the fewest in flight."""
    monkeypatch.setattr(replica_module, "PROBE_INTERVAL_S", 3600.0)
    inputs = tensors(40)
    run = run_stage(face_model, {"device_lost_after_n_executes": {1: 2}}, inputs, 100)
    assert_all_served(run, reference(short_range_model, inputs))
    assert run.executions[1] - 2 <= 6  # its failed executions
    assert run.executions[0] == 40 - 2


def test_failed_probes_cost_no_frame_and_take_the_replica_out_of_rotation(
    face_model: Path, short_range_model: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A probe is due at every dispatch: each fails on the lost device and runs again on
    device 0, and after ``max_consecutive_failures`` (3) failures in a row the replica is out
    of rotation as before; the batches it still held run on device 0 too."""
    monkeypatch.setattr(replica_module, "PROBE_INTERVAL_S", 0.0)
    inputs = tensors(24)
    run = run_stage(face_model, {"device_lost_after_n_executes": {1: 2}}, inputs, 3)
    assert_all_served(run, reference(short_range_model, inputs))
    assert run.replicas[1].failed == "3 executions failed in a row"
    assert run.replicas[1].retried >= 3 and run.replicas[0].failed is None


def test_a_batch_runs_again_once_and_its_frames_fail_when_that_fails_too(
    face_model: Path, short_range_model: Path
) -> None:
    """A batch no device can run (an input of the wrong size) fails on one replica, runs
    again on the other, fails there too, and its frame then fails with an error that names
    the stage once; the other frames are served."""
    inputs = tensors(12)
    inputs[5] = inputs[5][:, :64, :64].copy()
    run = run_stage(face_model, {}, inputs, 100)
    expected = reference(short_range_model, [t for i, t in enumerate(inputs) if i != 5])
    served = [f for f in run.frames if f.seq != 5]
    assert [f.error for f in served if f.error is not None] == []
    for frame, regressors in zip(served, expected, strict=True):
        np.testing.assert_allclose(frame.results["regressors"], regressors, atol=1e-4)
    failed = run.frames[5].error
    assert failed is not None and failed.reason == "inference_failed"
    assert failed.detail == (
        "stage face: input 'input': shape (1, 3, 64, 64), model takes [-1, 3, 128, 128]"
    )
    assert sorted(r.retried for r in run.replicas) == [0, 1]

"""A queue-mode replica whose model lost an output reloads it and goes back into rotation:
one stage on simulated Ascend devices (``acl-sim``, queue mode, a static batch of one), its
batcher, enqueue and dequeue threads, executions failing on the device
(``fail_every_n_executes``, ``device_lost_after_n_executes``), each failure an output that
never comes. Before, each lost output took its replica out of rotation for good, and two
took a two-replica stage down."""

from __future__ import annotations

import json
import queue
import shutil
import threading
import time
from collections.abc import Sequence
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from structlog.testing import capture_logs

from streamer.config import BatchConfig, RuntimeConfig
from streamer.frames import STOP, Batch, Frame
from streamer.lifecycle import Worker
from streamer.runtime import ModelSpec, open_backend
from streamer.runtime.acl.sim.backend import AclSimBackend
from streamer.scheduling.batcher import Batcher
from streamer.scheduling.dequeuer import Dequeuer
from streamer.scheduling.enqueuer import Enqueuer
from streamer.scheduling.mailbox import Mailbox
from streamer.scheduling.policy import BatchPolicy
from streamer.scheduling.replica import Dispatcher, Replica

from .blazeface_stage import keep_regressors, reference, tensors

pytestmark = pytest.mark.timeout(60)

RESULT_TIMEOUT_MS = 200
"""How long a lost output is waited for: short, so that each test loses several."""


@pytest.fixture
def face_model(tmp_path: Path, short_range_model: Path) -> Path:
    """Short-range BlazeFace as ATC builds it with ``--input_shape=input:1,3,128,128``."""
    shutil.copyfile(short_range_model, tmp_path / "face.onnx")
    manifest = {"input_shape": {"input": [1, 3, 128, 128]}}
    (tmp_path / "face.acl.json").write_text(json.dumps(manifest))
    return tmp_path / "face.onnx"


class Egress:
    """What leaves the stage, in a queue; with ``give_up``, the first batch with a failed
    frame gives the run up as a drain timeout does (``ChainRun.give_up``: abort, then
    interrupt every model): its replica's recovery, which begins right after, finds it."""

    def __init__(self, abort: threading.Event, replicas: list[Replica], give_up: bool) -> None:
        self.batches: queue.SimpleQueue[Batch] = queue.SimpleQueue()
        self._abort = abort
        self._replicas = replicas
        self._give_up = give_up

    def put(self, batch: Batch) -> None:
        self.batches.put(batch)
        if self._give_up and any(f.error is not None for f in batch.frames):
            self._abort.set()
            for replica in self._replicas:
                replica.model.interrupt()


@dataclass
class StageRun:
    """What one run of the stage left: its frames in seq order, its replicas, its threads
    (ended), the simulator (backend closed) and the log events."""

    frames: list[Frame]
    replicas: list[Replica]
    workers: list[Worker]
    backend: AclSimBackend
    logs: list[dict[str, Any]]

    def events(self, name: str) -> list[dict[str, Any]]:
        return [e for e in self.logs if e["event"] == name]


def run_stage(
    model_path: Path,
    sim: dict[str, Any],
    inputs: list[np.ndarray],
    devices: Sequence[int],
    max_failures: int = 10,
    give_up: bool = False,
) -> StageRun:
    """One frame per input, then STOP, through a stage with a queue-mode replica on each of
    ``devices`` (batches of one frame); the models and backend closed."""
    options = {"result_timeout_ms": RESULT_TIMEOUT_MS, "sim": sim}
    config = RuntimeConfig(backend="acl-sim", devices=tuple(sorted(set(devices))), options=options)
    with capture_logs() as logs, ExitStack() as stack:
        backend = stack.enter_context(open_backend(config))
        assert isinstance(backend, AclSimBackend)
        models = [
            stack.enter_context(
                backend.load(ModelSpec("face", model_path, device=device, mode="queue"))
            )
            for device in devices
        ]
        replicas = [
            Replica(index, device, m)
            for index, (device, m) in enumerate(zip(devices, models, strict=True))
        ]
        abort = threading.Event()
        egress = Egress(abort, replicas, give_up)
        workers = start_threads(replicas, inputs, max_failures, egress, abort)
    done: list[Frame] = []
    while not egress.batches.empty():
        done += egress.batches.get().frames
    frames = sorted(done, key=lambda f: f.seq)
    return StageRun(frames, replicas, workers, backend, logs)


def start_threads(
    replicas: list[Replica],
    inputs: list[np.ndarray],
    max_failures: int,
    egress: Egress,
    abort: threading.Event,
) -> list[Worker]:
    """The stage's threads over one frame per input until STOP; joined. A batcher that
    ends for want of a replica gives the run up, as the pipeline does then."""
    inbox = Mailbox()
    for seq, tensor in enumerate(inputs):
        frame = Frame("cam", seq, time.monotonic_ns(), time.time())
        frame.tensor = tensor.copy()
        inbox.put(frame)
    inbox.put(STOP)
    policy = BatchPolicy.for_model(BatchConfig(max_size=1), replicas[0].model.info)
    batcher = Batcher("face", Dispatcher(replicas, abort), policy, inbox, egress, abort)
    workers: list[Worker] = [
        *(Dequeuer(r, egress, keep_regressors, abort, max_failures) for r in replicas),
        *(Enqueuer(r, abort) for r in replicas),
        batcher,
    ]
    try:
        for worker in workers:
            worker.launch(10)
        batcher.join(30)
        if batcher.failure is not None:
            abort.set()
        for worker in workers:
            worker.join(30)
            assert not worker.is_alive()
    finally:
        abort.set()  # no thread outlives a failed test
    return workers


def assert_clean(run: StageRun) -> None:
    """The simulator saw no rule broken, and nothing was left unreleased."""
    sim = run.backend.simulator
    assert sim.violations == [] and sim.live_resources() == {}
    assert not run.events("acl_sim_rules_broken") and not run.events("acl_sim_resources_left")


def test_replicas_that_lose_outputs_reload_and_keep_serving(
    face_model: Path, short_range_model: Path
) -> None:
    """Every fourth execution fails on the device. Before, the second loss took the second
    replica out and the stage stopped (every replica failed). Now each replica reloads its
    model after each loss and serves on: every frame is published with its own result (no
    output given to another batch) or failed with a reason, and every loss is recovered."""
    inputs = tensors(40)
    run = run_stage(face_model, {"fail_every_n_executes": 4}, inputs, devices=(0, 1))
    assert [w.failure for w in run.workers] == [None] * len(run.workers)
    assert [f.seq for f in run.frames] == list(range(len(inputs)))
    expected = reference(short_range_model, inputs)
    for frame in run.frames:
        if frame.error is None:
            np.testing.assert_allclose(frame.results["regressors"], expected[frame.seq], atol=1e-4)
        else:
            assert frame.error.reason == "inference_failed"
            assert frame.error.detail.startswith("stage face: ")
    lost = run.backend.simulator.queues.failed_executions
    assert lost >= 5
    assert [r.failed for r in run.replicas] == [None, None]
    assert sum(r.recoveries for r in run.replicas) == lost
    assert len(run.events("replica_recovering")) == lost
    recovered = run.events("replica_recovered")
    assert len(recovered) == lost and not run.events("replica_failed")
    assert {(e["model"], e["log_level"]) for e in recovered} == {("face", "info")}
    assert all(e["reload_ms"] >= 0 and e["replica"] in ("face-0", "face-1") for e in recovered)
    assert_clean(run)


def test_lost_outputs_in_a_row_take_the_replica_out_and_the_stage_with_it(
    face_model: Path,
) -> None:
    """Device 0 fails every execution after its first: each lost output is followed by a
    reload, until ``max_consecutive_failures`` (3) in a row take the replica out of rotation
    for good (one ``replica_failed``). While it only recovered, the stage waited for it; with
    no replica left the batcher ends, which stops the daemon (``pipeline_failed``)."""
    sim = {"device_lost_after_n_executes": {0: 1}}
    run = run_stage(face_model, sim, tensors(16), devices=(0,), max_failures=3)
    (replica,) = run.replicas
    assert replica.failed == "3 executions failed in a row" and replica.recoveries == 2
    assert len(run.events("replica_recovered")) == 2
    assert [e["reason"] for e in run.events("replica_failed")] == [replica.failed]
    batcher = run.workers[-1]
    assert isinstance(batcher, Batcher) and "every replica failed" in str(batcher.failure)
    assert [w.failure for w in run.workers[:-1]] == [None, None]
    assert run.frames[0].error is None
    assert all(f.error is not None and f.error.reason == "inference_failed" for f in run.frames[1:])
    assert_clean(run)


def test_a_replica_whose_reload_fails_leaves_rotation_for_good(face_model: Path) -> None:
    """Only the two replicas' first WithQ loads succeed. The twelfth execution fails on the
    device; its replica's reload then fails too, which takes the replica out for good, its
    half-made queues released; the batch runs again on the other replica, which serves
    the rest."""
    sim = {"fail_every_n_executes": 12, "with_q_load_fails_after_n_loads": 2}
    run = run_stage(face_model, sim, tensors(20), devices=(0, 1))
    assert [w.failure for w in run.workers] == [None] * len(run.workers)
    failed = [r for r in run.replicas if r.failed is not None]
    assert len(failed) == 1 and failed[0].recoveries == 0
    reason = failed[0].failed
    assert reason is not None and reason.startswith("reload after a lost output failed: ")
    assert "ACL_ERROR_GE_LOAD_MODEL (545001)" in reason
    assert [e["replica"] for e in run.events("replica_failed")] == [failed[0].name]
    assert not run.events("replica_recovered")
    assert [f.error for f in run.frames if f.error is not None] == []
    assert_clean(run)


def test_a_stop_waits_for_the_recovery_under_way(face_model: Path) -> None:
    """Every execution fails on the one replica, and STOP is queued behind the frames: every
    frame fails with a reason, the replica recovers after each loss (it never counts as
    failed, so the stage does not stop), and the stop ends every thread once the last
    recovery is done, with nothing leaked."""
    sim = {"fail_every_n_executes": 1}
    run = run_stage(face_model, sim, tensors(4), devices=(0,), max_failures=100)
    assert [w.failure for w in run.workers] == [None, None, None]
    assert [f.seq for f in run.frames] == [0, 1, 2, 3]
    assert all(f.error is not None and f.error.reason == "inference_failed" for f in run.frames)
    (replica,) = run.replicas
    lost = run.backend.simulator.queues.failed_executions
    assert replica.failed is None and replica.recoveries == lost >= 1
    assert len(run.events("replica_recovered")) == lost
    assert_clean(run)


def test_a_give_up_during_a_recovery_ends_it_cleanly(face_model: Path) -> None:
    """The run is given up as the lost batch's frame fails: the recovery that begins then
    stops before it reloads, the replica neither comes back nor counts as failed, every
    thread ends, and closing the model releases the model and queues it still has."""
    sim = {"fail_every_n_executes": 1}
    run = run_stage(face_model, sim, tensors(4), devices=(0,), give_up=True)
    assert [w.failure for w in run.workers] == [None, None, None]
    (replica,) = run.replicas
    assert replica.recovering is not None and replica.failed is None
    assert replica.recoveries == 0 and not run.events("replica_recovered")
    assert len(run.events("replica_recovering")) == 1 and not run.events("replica_failed")
    assert run.frames[0].error is not None
    assert run.frames[0].error.reason == "inference_failed"
    with_q_loads = run.backend.simulator.log.names("aclmdlLoadFromFileWithQ")
    assert with_q_loads == ["aclmdlLoadFromFileWithQ"]  # the first load only
    assert_clean(run)


def test_batches_queued_behind_a_lost_output_never_fail_for_it(
    face_model: Path, short_range_model: Path
) -> None:
    """Every third execution fails on the device, on four replicas over two devices. The
    batches a replica held behind its lost one (in its submit queue, or waiting for the
    model's slot) never ran: they move to a replica in rotation, or wait for one, keeping
    their retry. Before, each was refused with ``reloading its model after a lost output``
    and used its retry there, so half the failed frames had never run. Now a frame fails
    only when its own execution was lost, and its retry lost too or not placed."""
    inputs = tensors(60)
    run = run_stage(face_model, {"fail_every_n_executes": 3}, inputs, devices=(0, 0, 1, 1))
    assert [w.failure for w in run.workers] == [None] * len(run.workers)
    assert [f.seq for f in run.frames] == list(range(len(inputs)))
    failed = [f.error for f in run.frames if f.error is not None]
    assert [e.detail for e in failed if "reloading its model" in e.detail] == []
    lost = run.backend.simulator.queues.failed_executions
    assert len(failed) <= lost
    expected = reference(short_range_model, inputs)
    for frame in run.frames:
        if frame.error is None:
            np.testing.assert_allclose(frame.results["regressors"], expected[frame.seq], atol=1e-4)
    assert [r.failed for r in run.replicas] == [None] * 4
    assert_clean(run)


def test_the_result_timeout_counts_from_the_slot_not_from_the_wait_for_it(
    face_model: Path, short_range_model: Path
) -> None:
    """Each execution takes 150 ms, under the 200 ms result timeout, and the frames come at
    once, so each batch waits for the one before it to leave the model's one slot. Before,
    that wait counted towards its timeout, and a healthy device lost outputs and reloaded."""
    inputs = tensors(6)
    run = run_stage(face_model, {"execute_delay_ms": 150}, inputs, devices=(0,))
    assert [f.error for f in run.frames] == [None] * len(inputs)
    expected = reference(short_range_model, inputs)
    for frame in run.frames:
        np.testing.assert_allclose(frame.results["regressors"], expected[frame.seq], atol=1e-4)
    assert run.replicas[0].recoveries == 0 and not run.events("replica_recovering")
    assert_clean(run)

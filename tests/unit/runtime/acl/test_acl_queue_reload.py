"""Queue mode after a lost output: the model raises OutputLostError and takes no batch until
its dequeue thread reloads it, which unloads it, destroys its tdt queues, creates new ones and
loads it again bound to them; a reload whose load fails releases what it created. Every
enqueue comes from one thread and every dequeue and reload from another (S28)."""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
from acl_testing import MakeBackend, Reference, assert_close, blazeface_input

from streamer.errors import BackendError, OutputLostError
from streamer.runtime.acl.model_queue import QueueModeModel
from streamer.runtime.base import InferenceOutputs, ModelSpec

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def enqueue_thread() -> Iterator[ThreadPoolExecutor]:
    """One thread that runs every enqueue of a test, as queue mode requires."""
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="enqueue") as executor:
        yield executor


def outputs(model: QueueModeModel) -> InferenceOutputs:
    done = model.dequeue(5000)
    assert done is not None and done.error is None
    return done


def wait_lost(model: QueueModeModel) -> None:
    with pytest.raises(OutputLostError, match="no output for a batch enqueued"):
        while model.dequeue(100) is None:
            pass


def test_a_model_that_lost_an_output_serves_again_once_reloaded(
    make_backend: MakeBackend,
    static4_model: Path,
    frames: list[np.ndarray],
    reference: Reference,
    enqueue_thread: ThreadPoolExecutor,
) -> None:
    """The third execution fails on the device. The enqueue waiting for the slot the lost
    batch holds is interrupted, as the replica does before it reloads; after the reload
    the model id and every queue are new, the old queues are gone, and the next batches'
    outputs are their own."""
    backend = make_backend(result_timeout_ms=300, sim={"fail_every_n_executes": 3})
    model = backend.load(ModelSpec("face", static4_model, mode="queue"))
    assert isinstance(model, QueueModeModel)
    model.attach_thread()
    sim = backend.simulator
    batches = [blazeface_input(frames[i : i + 4]) for i in range(4)]
    enqueue_thread.submit(model.attach_thread).result(5)
    for batch in batches[:2]:
        enqueue_thread.submit(model.enqueue, [batch]).result(5)
        assert_close(outputs(model).outputs, reference(batch))
    old_queues, old_id = set(sim.queues.names().values()), model.model_id
    enqueue_thread.submit(model.enqueue, [batches[2]]).result(5)  # its execution fails
    waiting = enqueue_thread.submit(model.enqueue, [batches[3]])
    wait_lost(model)
    model.interrupt()
    assert "enqueue interrupted" in str(waiting.exception(5))
    model.reload()
    queues = set(sim.queues.names().values())
    assert model.model_id != old_id and queues.isdisjoint(old_queues) and len(queues) == 3
    for batch in batches[2:]:
        enqueue_thread.submit(model.enqueue, [batch]).result(5)
        assert_close(outputs(model).outputs, reference(batch))
    assert sim.queues.failed_executions == 1 and sim.violations == []
    model.close()


def test_a_reload_whose_load_fails_releases_what_it_created(
    make_backend: MakeBackend,
    static4_model: Path,
    frames: list[np.ndarray],
    enqueue_thread: ThreadPoolExecutor,
) -> None:
    """The WithQ load after the first fails: the reload has unloaded the model and destroyed
    its queues, created new ones, and destroys them again; the model is then refused, and
    its close releases the rest."""
    sim_options = {"fail_every_n_executes": 1, "with_q_load_fails_after_n_loads": 1}
    backend = make_backend(result_timeout_ms=300, sim=sim_options)
    model = backend.load(ModelSpec("face", static4_model, mode="queue"))
    assert isinstance(model, QueueModeModel)
    model.attach_thread()
    sim = backend.simulator
    enqueue_thread.submit(model.attach_thread).result(5)
    enqueue_thread.submit(model.enqueue, [blazeface_input(frames[:4])]).result(5)
    wait_lost(model)
    failure = r"reload failed: aclmdlLoadFromFileWithQ failed: ACL_ERROR_GE_LOAD_MODEL \(545001\)"
    with pytest.raises(BackendError, match=failure):
        model.reload()
    left = sim.live_resources()
    assert not {"models", "descs", "queues", "queue_attrs"} & set(left)
    created = sim.log.names("acltdtCreateQueue").count("acltdtCreateQueue")
    assert created == 2 * 3  # the first set and the new one
    assert sim.violations == []
    model.close()
    with pytest.raises(BackendError, match="closed"):
        model.reload()


def test_a_reload_whose_unload_hangs_leaves_the_model_to_the_process_exit(
    make_backend: MakeBackend,
    static4_model: Path,
    frames: list[np.ndarray],
    enqueue_thread: ThreadPoolExecutor,
) -> None:
    """The execution outlasts ``result_timeout_ms`` (hung, as far as the host can tell): its
    output is given up, and the reload's unload, which waits for the execution, does not end
    within ``result_timeout_ms`` either. The reload raises and the device is marked hung, so
    the close abandons the model rather than free what the execution still uses."""
    backend = make_backend(result_timeout_ms=300, sim={"execute_delay_ms": 3000})
    model = backend.load(ModelSpec("face", static4_model, mode="queue"))
    assert isinstance(model, QueueModeModel)
    model.attach_thread()
    enqueue_thread.submit(model.attach_thread).result(5)
    enqueue_thread.submit(model.enqueue, [blazeface_input(frames[:4])]).result(5)
    wait_lost(model)
    with pytest.raises(BackendError, match="its unload did not end within result_timeout_ms"):
        model.reload()
    assert backend.abandoned_devices == [0]
    with pytest.raises(BackendError, match="abandoned"):
        model.close()

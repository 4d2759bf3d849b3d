"""Two ACL models chained through device memory: BlazeFace's backbone hands its two feature
maps to its head without a copy to the host, in each execution mode, and the simulator's call
log shows where the bytes went."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from acl_testing import (
    GEARS,
    Loaded,
    MakeBackend,
    MakeModel,
    Reference,
    assert_close,
    blazeface_input,
    calls,
    open_device,
    rules,
)

from streamer.runtime.acl.device_tensor import AclDeviceTensor
from streamer.runtime.acl.sim.simulator import Simulator
from streamer.runtime.base import ModelSpec, QueueModel

MODES = ("sync", "async", "queue")
FEATURES = {"activation_11": (88, 16, 16), "activation_16": (96, 8, 8)}


def split_models(make_model: MakeModel, assets: dict[str, Path], mode: str) -> tuple[Path, Path]:
    """The backbone and head as ``.om`` files: static batch 4 for queue mode, batch gears 1,
    2, 4, 8 otherwise."""
    static = mode == "queue"

    def manifest(shapes: dict[str, tuple[int, ...]]) -> dict[str, Any]:
        batch = 4 if static else -1
        found: dict[str, Any] = {"input_shape": {k: [batch, *v] for k, v in shapes.items()}}
        return found if static else {**found, "dynamic_batch_size": GEARS}

    backbone = make_model(
        "backbone",
        manifest({"input": (3, 128, 128)}),
        assets["blazeface_short_range.backbone"],
        ".om",
    )
    head = make_model("head", manifest(FEATURES), assets["blazeface_short_range.head"], ".om")
    return backbone, head


def run_chain(up: QueueModel, down: QueueModel, batch: np.ndarray) -> tuple[Any, Any]:
    """One batch through both models; the backbone's outputs as it handed them over, and
    the head's result (each model's context made current before its calls)."""
    up.attach_thread()
    up.enqueue([batch])
    handed = up.dequeue(10_000)
    assert handed is not None and handed.error is None and handed.outputs is not None
    down.attach_thread()
    down.enqueue(list(handed.outputs))
    done = down.dequeue(10_000)
    assert done is not None
    return handed.outputs, done


def host_reads(sim: Simulator) -> set[int]:
    """Every address the host read device memory from: memcpy sources, ptr_to_bytes."""
    return {args[2] for args in calls(sim, "acl.rt.memcpy")} | {
        args[0] for args in calls(sim, "acl.util.ptr_to_bytes")
    }


def datasets_of(sim: Simulator) -> dict[int, list[int]]:
    """Dataset handle → its data buffers, from ``acl.mdl.add_dataset_buffer`` calls."""
    found: dict[int, list[int]] = {}
    for dataset, buffer in calls(sim, "acl.mdl.add_dataset_buffer"):
        found.setdefault(dataset, []).append(buffer)
    return found


def head_inputs(sim: Simulator, head_id: int) -> set[int]:
    """The data buffers of every input dataset the head executed."""
    executed = [*calls(sim, "acl.mdl.execute"), *calls(sim, "acl.mdl.execute_async")]
    datasets = datasets_of(sim)
    return {b for args in executed if args[0] == head_id for b in datasets[args[1]]}


@pytest.mark.parametrize("run_mode", ["host", "device"])
@pytest.mark.parametrize("mode", MODES)
def test_the_head_reads_the_backbone_outputs_where_they_are(
    make_backend: MakeBackend,
    make_model: MakeModel,
    assets: dict[str, Path],
    frames: list[np.ndarray],
    reference: Reference,
    mode: str,
    run_mode: str,
) -> None:
    backbone, head = split_models(make_model, assets, mode)
    backend = make_backend(sim={"run_mode": run_mode})
    sim = backend.simulator
    spec = ModelSpec("backbone", backbone, mode=mode, max_in_flight=2, device_outputs=True)
    handed: list[AclDeviceTensor] = []
    with backend.load(spec) as up, backend.load(ModelSpec("head", head, mode=mode)) as down:
        assert (up.mode, down.mode) == (mode, mode)
        for start in (0, 4, 0):  # a third batch needs memory the first one gave back
            batch = blazeface_input(frames[start : start + 4])
            outputs, done = run_chain(up, down, batch)
            assert all(isinstance(t, AclDeviceTensor) for t in outputs)
            assert [t.shape for t in outputs] == [(4, *shape) for shape in FEATURES.values()]
            assert_close(done.outputs, reference(batch))
            handed += outputs
        head_id = down._loaded.model_id  # type: ignore[attr-defined]
    assert not {t.ptr for t in handed} & host_reads(sim)  # never copied to the host
    if mode == "queue":  # dequeued into device memory, enqueued from there
        enqueued = {args[1] for args in calls(sim, "acltdtEnqueueData")}
        assert {t.ptr for t in handed} <= enqueued
    else:  # the head's input datasets hold the backbone's very output data buffers
        assert {t.data_buffer for t in handed} <= head_inputs(sim, head_id)
    assert rules(sim) == []


def test_a_device_tensor_of_another_device_fails_its_batch_and_is_released(
    make_backend: MakeBackend,
    make_model: MakeModel,
    assets: dict[str, Path],
    frames: list[np.ndarray],
) -> None:
    backbone, head = split_models(make_model, assets, "async")
    backend = make_backend(devices=(0, 1))
    up_spec = ModelSpec(
        "backbone", backbone, device=0, mode="async", max_in_flight=1, device_outputs=True
    )
    down_spec = ModelSpec("head", head, device=1, mode="async")
    with backend.load(up_spec) as up, backend.load(down_spec) as down:
        outputs, done = run_chain(up, down, blazeface_input(frames[:2]))
        assert done.outputs is None and done.error is not None
        assert "memory of device 0" in done.error.detail
        assert "runs on device 1" in done.error.detail
        outputs, done = run_chain(up, down, blazeface_input(frames[:2]))  # memory came back
        assert done.error is not None


def test_the_simulator_refuses_host_memory_as_model_input(
    sim: Simulator, make_model: MakeModel
) -> None:
    """``aclmdlExecute``: model inputs and outputs live in device memory."""
    open_device(sim)
    loaded = Loaded(sim, make_model("face", {"input_shape": {"input": [1, 3, 128, 128]}}))
    host, _ = sim.acl.rt.malloc_host(3 * 128 * 128 * 4)
    dataset = sim.acl.mdl.create_dataset()
    sim.acl.mdl.add_dataset_buffer(dataset, sim.acl.create_data_buffer(host, 3 * 128 * 128 * 4))
    assert sim.acl.mdl.execute(loaded.model_id, dataset, loaded.out_ds) != 0
    assert rules(sim) == ["execute-memory"]
    assert sim.acl.mdl.execute(loaded.model_id, loaded.in_ds, loaded.out_ds) == 0

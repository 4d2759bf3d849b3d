"""Helpers shared by the ACL backend tests (imported by name: the test folders are not
packages)."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import cv2
import numpy as np
import onnx
from onnx import TensorProto, helper

from streamer.runtime.acl.constants import MallocPolicy, MemcpyKind
from streamer.runtime.acl.sim.backend import AclSimBackend
from streamer.runtime.acl.sim.simulator import Simulator

GEARS = [1, 2, 4, 8]
TOLERANCE = 1e-4

MakeModel = Callable[..., Path]
MakeBackend = Callable[..., AclSimBackend]
Reference = Callable[[np.ndarray], tuple[np.ndarray, ...]]


def open_device(sim: Simulator, device: int = 0) -> int:
    """``acl.init`` (once), ``set_device`` and ``create_context``; returns the context."""
    if "initialized" not in sim.live_resources():
        assert sim.acl.init() == 0
    assert sim.acl.rt.set_device(device) == 0
    context, ret = sim.acl.rt.create_context(device)
    assert ret == 0
    return int(context)


def in_thread(fn: Any) -> Any:
    """Run ``fn()`` on a fresh thread; return its result."""
    result: list[Any] = []
    thread = threading.Thread(target=lambda: result.append(fn()))
    thread.start()
    thread.join()
    return result[0]


def rules(sim: Simulator) -> list[str]:
    """The rule of every violation the simulator recorded, oldest first."""
    return [v.rule for v in sim.violations]


def blazeface_input(images: Sequence[np.ndarray], size: int = 128) -> np.ndarray:
    """BGR uint8 images → float32 [n, 3, size, size], RGB scaled to [-1, 1] (as BlazeFace)."""
    rgb = [cv2.cvtColor(cv2.resize(i, (size, size)), cv2.COLOR_BGR2RGB) for i in images]
    batch = np.stack(rgb).astype(np.float32) / 127.5 - 1.0
    return np.ascontiguousarray(batch.transpose(0, 3, 1, 2))


def assert_close(outputs: Sequence[np.ndarray] | None, expected: Sequence[np.ndarray]) -> None:
    """Same shapes, and equal within :data:`TOLERANCE`."""
    assert outputs is not None
    assert [o.shape for o in outputs] == [e.shape for e in expected]
    for got, want in zip(outputs, expected, strict=True):
        np.testing.assert_allclose(got, want, atol=TOLERANCE, rtol=0)


class Loaded:
    """A model loaded in the simulator with one input and one output dataset."""

    def __init__(self, sim: Simulator, path: Path) -> None:
        self.sim = sim
        acl = sim.acl
        self.model_id, ret = acl.mdl.load_from_file(str(path))
        assert ret == 0, sim.problems
        self.desc = acl.mdl.create_desc()
        assert acl.mdl.get_desc(self.desc, self.model_id) == 0
        self.inputs = [
            self._malloc(acl.mdl.get_input_size_by_index(self.desc, i))
            for i in range(acl.mdl.get_num_inputs(self.desc))
        ]
        self.outputs = [
            self._malloc(acl.mdl.get_output_size_by_index(self.desc, i))
            for i in range(acl.mdl.get_num_outputs(self.desc))
        ]
        self.in_ds = self._dataset(self.inputs)
        self.out_ds = self._dataset(self.outputs)

    def _malloc(self, size: int) -> tuple[int, int]:
        ptr, ret = self.sim.acl.rt.malloc(size, MallocPolicy.NORMAL_ONLY)
        assert ret == 0
        return ptr, size

    def _dataset(self, buffers: list[tuple[int, int]]) -> int:
        dataset = self.sim.acl.mdl.create_dataset()
        for ptr, size in buffers:
            self.sim.acl.mdl.add_dataset_buffer(dataset, self.sim.acl.create_data_buffer(ptr, size))
        return dataset

    def upload(self, array: np.ndarray, index: int = 0) -> None:
        data = np.ascontiguousarray(array).tobytes()
        ptr, size = self.inputs[index]
        src = self.sim.acl.util.bytes_to_ptr(data)
        assert self.sim.acl.rt.memcpy(ptr, size, src, len(data), MemcpyKind.HOST_TO_DEVICE) == 0

    def download(self, index: int, shape: tuple[int, ...]) -> np.ndarray:
        ptr, _ = self.outputs[index]
        nbytes = int(np.prod(shape)) * 4
        host, _ = self.sim.acl.rt.malloc_host(nbytes)
        assert self.sim.acl.rt.memcpy(host, nbytes, ptr, nbytes, MemcpyKind.DEVICE_TO_HOST) == 0
        return np.frombuffer(self.sim.acl.util.ptr_to_bytes(host, nbytes), np.float32).reshape(
            shape
        )


def tiny_model(path: Path) -> Path:
    """An ONNX model ``y = relu(x)``, x float32 [N, 3, H, W] with every dim but C symbolic."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 3, "h", "w"])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 3, "h", "w"])
    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "tiny", [x], [y])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    onnx.save(model, str(path))
    return path


def write_manifest(path: Path, manifest: dict[str, Any]) -> None:
    """``<path stem>.acl.json`` with ``manifest``."""
    path.with_suffix(".acl.json").write_text(json.dumps(manifest))

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
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

from streamer.runtime.acl.constants import MallocPolicy, MemcpyKind
from streamer.runtime.acl.sim.backend import AclSimBackend
from streamer.runtime.acl.sim.simulator import Simulator
from streamer.runtime.base import InferenceOutputs, QueueModel

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


def conv_model(path: Path) -> Path:
    """A small fully-convolutional ONNX model whose batch, height and width are symbolic.

    ``x`` float32 [N, 3, H, W] → 3x3 convolution, stride 2, pad 1, 4 filters (fixed random
    weights) → ReLU → ``features`` [N, 4, ceil(H/2), ceil(W/2)]; their mean over H and W →
    ``pooled`` [N, 4]: one output whose dims follow the resolution and one that does not.
    """
    rng = np.random.default_rng(7)
    weight = numpy_helper.from_array(rng.normal(0, 0.5, (4, 3, 3, 3)).astype(np.float32), "w")
    bias = numpy_helper.from_array(rng.normal(0, 0.1, (4,)).astype(np.float32), "b")
    nodes = [
        helper.make_node("Conv", ["x", "w", "b"], ["c"], strides=[2, 2], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c"], ["features"]),
        helper.make_node("ReduceMean", ["features"], ["pooled"], axes=[2, 3], keepdims=0),
    ]
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 3, "h", "w"])
    features = helper.make_tensor_value_info("features", TensorProto.FLOAT, ["n", 4, "h2", "w2"])
    pooled = helper.make_tensor_value_info("pooled", TensorProto.FLOAT, ["n", 4])
    graph = helper.make_graph(nodes, "conv", [x], [features, pooled], [weight, bias])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    onnx.save(model, str(path))
    return path


def onnx_runner(path: Path) -> Callable[..., list[np.ndarray]]:
    """``run(*arrays)``: the ONNX file run directly by onnxruntime on the CPU, inputs in order."""
    options = ort.SessionOptions()
    options.log_severity_level = 3
    session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    names = [arg.name for arg in session.get_inputs()]

    def run(*arrays: np.ndarray) -> list[np.ndarray]:
        return list(session.run(None, dict(zip(names, arrays, strict=True))))

    return run


def calls(sim: Simulator, api: str) -> list[tuple[Any, ...]]:
    """The arguments of every logged call of ``api`` (e.g. ``acl.mdl.set_dynamic_hw_size``)."""
    return [call.args for call in sim.log.calls(api) if call.api == api]


def run_threads(
    model: QueueModel, batches: Sequence[np.ndarray | Sequence[np.ndarray]]
) -> list[InferenceOutputs]:
    """Enqueue from one thread and dequeue from another, as the pipeline does; each batch is
    one array (a one-input model) or one array per input."""
    results: list[InferenceOutputs] = []
    errors: list[BaseException] = []

    def produce() -> None:
        try:
            model.attach_thread()
            for batch in batches:
                model.enqueue([batch] if isinstance(batch, np.ndarray) else list(batch))
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            errors.append(exc)

    def consume() -> None:
        try:
            model.attach_thread()
            while len(results) < len(batches):
                done = model.dequeue(5000)
                assert done is not None, "a batch did not come back in 5 s"
                results.append(done)
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            errors.append(exc)

    threads = [
        threading.Thread(target=produce, name="enqueue"),
        threading.Thread(target=consume, name="dequeue"),
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    return results


def write_manifest(path: Path, manifest: dict[str, Any]) -> None:
    """``<path stem>.acl.json`` with ``manifest``."""
    path.with_suffix(".acl.json").write_text(json.dumps(manifest))

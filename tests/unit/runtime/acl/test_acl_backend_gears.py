"""Dynamic resolution and dynamic dims on the ACL backend (simulator): every batch runs at its
gear, set through ``ascend_mbatch_shape_data``; outputs equal onnxruntime's run directly at that
shape (1e-4) and have the executed dims (``get_cur_output_dims``); a shape that is no gear
fails its batch without ever reaching a setter; two dynamic kinds fail at load."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import cv2
import numpy as np
import pytest
from acl_testing import (
    TOLERANCE,
    Loaded,
    MakeBackend,
    assert_close,
    calls,
    conv_model,
    onnx_runner,
    open_device,
    rules,
    run_threads,
    write_manifest,
)
from onnx import TensorProto, helper, save

from streamer.config import PluginConfig
from streamer.errors import ModelError
from streamer.runtime.acl.constants import AclCode
from streamer.runtime.acl.gears import GearKind, gear_table
from streamer.runtime.acl.model_async import AsyncModel
from streamer.runtime.acl.sim.simulator import Simulator
from streamer.runtime.base import ModelSpec, TensorInfo
from streamer.vision.mtcnn.layout import to_tensor
from streamer.vision.registry import PREPROCESSORS

pytestmark = pytest.mark.timeout(60)

HW_GEARS = [[48, 64], [64, 48]]
"""(height, width): a 4:3 landscape gear and a 3:4 portrait one."""

Run = Callable[..., list[np.ndarray]]


@pytest.fixture
def conv(tmp_path: Path) -> Path:
    return conv_model(tmp_path / "conv.onnx")


@pytest.fixture
def hw_model(tmp_path: Path, conv: Path) -> Path:
    """The conv model built with ``--input_shape=x:2,3,-1,-1 --dynamic_image_size=48,64;64,48``."""
    path = tmp_path / "conv_hw.onnx"
    path.write_bytes(conv.read_bytes())
    write_manifest(path, {"input_shape": {"x": [2, 3, -1, -1]}, "dynamic_image_size": HW_GEARS})
    return path


@pytest.fixture
def dims_model(tmp_path: Path, conv: Path) -> Path:
    """The conv model built with ``--input_shape=x:-1,3,-1,-1 --input_format=ND
    --dynamic_dims=1,48,64;2,64,48``: batch and resolution decided together."""
    path = tmp_path / "conv_dims.onnx"
    path.write_bytes(conv.read_bytes())
    manifest = {
        "input_shape": {"x": [-1, 3, -1, -1]},
        "input_format": "ND",
        "dynamic_dims": [[1, 48, 64], [2, 64, 48]],
    }
    write_manifest(path, manifest)
    return path


def letterboxed(info: Any, images: list[np.ndarray]) -> list[np.ndarray]:
    """Each image through the ``letterbox`` preprocessor made for ``info``."""
    pre = PREPROCESSORS.create(PluginConfig(kind="letterbox"), info, "test")
    return [pre(image)[0] for image in images]


def portrait(image: np.ndarray) -> np.ndarray:
    """The image turned a quarter (a landscape image becomes a portrait one)."""
    return np.ascontiguousarray(cv2.rotate(image, cv2.ROTATE_90_CLOCKWISE))


def hw_args(sim: Simulator) -> list[tuple[int, int]]:
    """(height, width) of every ``set_dynamic_hw_size`` call, in order."""
    return [(args[3], args[4]) for args in calls(sim, "acl.mdl.set_dynamic_hw_size")]


@pytest.mark.parametrize("run_mode", ["host", "device"])
@pytest.mark.parametrize("mode", ["async", "sync"])
def test_resolution_gears_run_each_frame_at_its_gear(
    mode: str,
    run_mode: str,
    make_backend: MakeBackend,
    hw_model: Path,
    conv: Path,
    chelsea: np.ndarray,
    coffee: np.ndarray,
) -> None:
    backend = make_backend(sim={"run_mode": run_mode})
    model = backend.load(ModelSpec("conv", hw_model, mode=mode, max_in_flight=2))
    info = model.info
    assert info.hw_gears == ((48, 64), (64, 48)) and info.dims_gears == ()
    assert info.batch_gears == (2,) and info.inputs[0].shape == (2, 3, -1, -1)
    assert [t.shape for t in info.outputs] == [(2, 4, -1, -1), (2, 4)]
    land = letterboxed(info, [chelsea, coffee])
    tall = letterboxed(info, [portrait(chelsea), portrait(coffee)])
    assert {t.shape for t in land} == {(3, 48, 64)} and {t.shape for t in tall} == {(3, 64, 48)}
    # Alternate the gears, so an async batch is set up while the other gear is in flight.
    batches = [np.stack(land), np.stack(tall), np.stack(tall[::-1]), np.stack(land[::-1])]
    results = run_threads(model, batches)
    run = onnx_runner(conv)
    for batch, done in zip(batches, results, strict=True):
        assert done.error is None
        expected = run(batch)
        assert [o.shape for o in expected] == [(2, 4, *(d // 2 for d in batch.shape[2:])), (2, 4)]
        assert_close(done.outputs, expected)
    sim = backend.simulator
    assert hw_args(sim) == [(48, 64), (64, 48), (64, 48), (48, 64)]
    assert len(calls(sim, "acl.mdl.get_cur_output_dims")) == 2 * len(batches)
    assert calls(sim, "acl.mdl.set_dynamic_batch_size") == [] and sim.violations == []
    model.close()


def test_pnet_nhwc_with_height_and_width_transposed(
    make_backend: MakeBackend,
    tmp_path: Path,
    assets: dict[str, Path],
    carphone_frames: list[np.ndarray],
) -> None:
    """MTCNN's P-Net (NHWC, H and W swapped) built with ``--input_format=NHWC
    --dynamic_image_size``: a 144x176 frame goes in as 176x144, its quarter turn as 144x176."""
    path = tmp_path / "pnet.onnx"
    path.write_bytes(assets["mtcnn_pnet"].read_bytes())
    gears = [[176, 144], [144, 176]]
    manifest = {
        "input_shape": {"input_1": [1, -1, -1, 3]},
        "input_format": "NHWC",
        "dynamic_image_size": gears,
    }
    write_manifest(path, manifest)
    backend = make_backend()
    model = backend.load(ModelSpec("pnet", path, mode="sync", max_in_flight=1))
    assert model.info.hw_gears == ((176, 144), (144, 176))
    frames = [carphone_frames[0], portrait(carphone_frames[40]), carphone_frames[80]]
    batches = [to_tensor(frame)[None] for frame in frames]
    assert [b.shape for b in batches] == [(1, 176, 144, 3), (1, 144, 176, 3), (1, 176, 144, 3)]
    run = onnx_runner(assets["mtcnn_pnet"])
    results = run_threads(model, batches)
    for batch, done in zip(batches, results, strict=True):
        assert done.error is None
        assert_close(done.outputs, run(batch))
    wide, tall = (results[k].outputs for k in (0, 1))
    assert wide is not None and tall is not None
    assert [o.shape for o in wide] == [(1, 83, 67, 4), (1, 83, 67, 2)]
    assert [o.shape for o in tall] == [(1, 67, 83, 4), (1, 67, 83, 2)]
    assert hw_args(backend.simulator) == [(176, 144), (144, 176), (176, 144)]
    model.close()


@pytest.mark.parametrize("mode", ["async", "sync"])
def test_dims_gears_set_batch_and_resolution_together(
    mode: str,
    make_backend: MakeBackend,
    dims_model: Path,
    conv: Path,
    chelsea: np.ndarray,
    coffee: np.ndarray,
) -> None:
    backend = make_backend()
    model = backend.load(ModelSpec("conv", dims_model, mode=mode, max_in_flight=2))
    info = model.info
    assert info.dims_gears == ((1, 3, 48, 64), (2, 3, 64, 48)) and info.hw_gears == ()
    assert info.batch_gears == (1, 2), "the batch values of the dims gears"
    # The letterbox picks among the (H, W) of the dims gears.
    land = letterboxed(info, [chelsea])
    tall = letterboxed(info, [portrait(chelsea), portrait(coffee)])
    batches = [np.stack(land), np.stack(tall), np.stack(land)]
    assert [b.shape for b in batches] == [(1, 3, 48, 64), (2, 3, 64, 48), (1, 3, 48, 64)]
    results = run_threads(model, batches)
    run = onnx_runner(conv)
    for batch, done in zip(batches, results, strict=True):
        assert done.error is None
        assert_close(done.outputs, run(batch))
    assert [o.shape for o in results[1].outputs or ()] == [(2, 4, 32, 24), (2, 4)]
    sim = backend.simulator
    assert len(calls(sim, "acl.mdl.set_input_dynamic_dims")) == 3 and sim.violations == []
    model.close()


def add_model(path: Path) -> Path:
    """``c = a + b``: a float32 [N, 3] and b float32 [M, 3], N and M symbolic (two inputs)."""
    a = helper.make_tensor_value_info("a", TensorProto.FLOAT, ["n", 3])
    b = helper.make_tensor_value_info("b", TensorProto.FLOAT, ["m", 3])
    c = helper.make_tensor_value_info("c", TensorProto.FLOAT, ["k", 3])
    graph = helper.make_graph([helper.make_node("Add", ["a", "b"], ["c"])], "add", [a, b], [c])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    save(model, str(path))
    return path


def test_dims_gears_of_two_inputs_are_concatenated_in_input_order(
    make_backend: MakeBackend, tmp_path: Path
) -> None:
    """ATC ``--input_shape=a:-1,3;b:-1,3 --dynamic_dims=3,3;3,1``: b broadcasts when M = 1."""
    path = add_model(tmp_path / "add.onnx")
    manifest = {"input_shape": {"a": [-1, 3], "b": [-1, 3]}, "dynamic_dims": [[3, 3], [3, 1]]}
    write_manifest(path, manifest)
    model = make_backend().load(ModelSpec("add", path, mode="sync", max_in_flight=1))
    assert model.info.dims_gears == ((3, 3, 3, 3), (3, 3, 1, 3))
    rng = np.random.default_rng(3)
    a = rng.normal(size=(3, 3)).astype(np.float32)
    batches = [(a, rng.normal(size=(1, 3)).astype(np.float32)), (a, a), (a, a[:2])]
    results = run_threads(model, batches)
    for (x, y), done in zip(batches[:2], results[:2], strict=True):
        assert done.error is None and done.outputs is not None
        np.testing.assert_allclose(done.outputs[0], x + y, atol=TOLERANCE, rtol=0)
    error = results[2].error
    assert error is not None and "dims [3, 3, 2, 3], not one of the model's" in error.detail
    model.close()


@pytest.mark.parametrize("mode", ["async", "sync"])
def test_a_shape_without_a_gear_fails_alone_and_is_never_sent(
    mode: str, make_backend: MakeBackend, hw_model: Path, dims_model: Path
) -> None:
    backend = make_backend()
    hw = backend.load(ModelSpec("hw", hw_model, mode=mode, max_in_flight=2))
    good = np.zeros((2, 3, 48, 64), np.float32)
    results = run_threads(hw, [np.zeros((2, 3, 40, 40), np.float32), good])
    error = results[0].error
    assert error is not None and error.reason == "inference_failed"
    assert "resolution (h, w) [40, 40], not one of the model's dynamic_image_size gears" in (
        error.detail
    )
    assert results[1].error is None
    dims = backend.load(ModelSpec("dims", dims_model, mode=mode, max_in_flight=2))
    results = run_threads(dims, [np.zeros((2, 3, 48, 64), np.float32)])
    error = results[0].error
    assert error is not None and "dims [2, 3, 48, 64], not one of the model's" in error.detail
    sim = backend.simulator
    assert hw_args(sim) == [(48, 64)], "the backend never sends a gear the model lacks"
    assert calls(sim, "acl.mdl.set_input_dynamic_dims") == [] and sim.violations == []
    hw.close()
    dims.close()


def test_setters_refuse_gears_the_model_lacks(
    sim: Simulator, hw_model: Path, dims_model: Path
) -> None:
    """The documented codes (GE ``aclmdlSetDynamicHWSize``, ``aclmdlSetInputDynamicDims`` and
    ``GeExecutor::SetDynamicImageSize`` / ``SetDynamicDims`` / ``GetCurDynamicDims``)."""
    open_device(sim)
    mdl = sim.acl.mdl
    hw = Loaded(sim, hw_model)
    assert mdl.set_dynamic_hw_size(hw.model_id, hw.in_ds, 1, 48, 48) == (
        AclCode.ERROR_GE_DYNAMIC_BATCH_SIZE_INVALID
    )
    assert mdl.set_dynamic_hw_size(hw.model_id, hw.in_ds, 1, 0, 64) == AclCode.ERROR_INVALID_PARAM
    dims = Loaded(sim, dims_model)

    def set_dims(values: list[int], count: int | None = None) -> int:
        io = {"name": "", "dimCount": len(values) if count is None else count, "dims": values}
        return int(mdl.set_input_dynamic_dims(dims.model_id, dims.in_ds, 1, io))

    assert set_dims([1, 3, 64, 48]) == AclCode.ERROR_GE_DYNAMIC_BATCH_SIZE_INVALID
    assert set_dims([1, 4, 48, 64]) == AclCode.ERROR_GE_DYNAMIC_INPUT_LENGTH_INVALID
    assert set_dims([1, 48, 64]) == AclCode.ERROR_GE_DYNAMIC_INPUT_LENGTH_INVALID
    assert set_dims([], 0) == AclCode.ERROR_INVALID_PARAM
    assert set_dims([2, 3, 64, 48]) == 0
    with pytest.raises(TypeError, match="not a list"):
        mdl.set_input_dynamic_dims(dims.model_id, dims.in_ds, 1, {"dimCount": 4, "dims": (1,)})
    assert rules(sim) == ["S15"] * 6


def test_current_output_dims_follow_the_last_gear_set(
    sim: Simulator, hw_model: Path, make_backend: MakeBackend, tmp_path: Path, conv: Path
) -> None:
    """RT ``function-get_cur_output_dims.md``: the largest gear's dims before any gear is set,
    then the dims of the gear last set on the model (whichever dataset it was set in)."""
    open_device(sim)
    mdl = sim.acl.mdl
    hw = Loaded(sim, hw_model)
    other = sim.acl.mdl.create_dataset()
    for ptr, size in hw.inputs:
        mdl.add_dataset_buffer(other, sim.acl.create_data_buffer(ptr, size))

    def current() -> list[list[int]]:
        found = [mdl.get_cur_output_dims(hw.desc, i) for i in range(2)]
        assert all(ret == 0 for _, ret in found)
        return [dims["dims"] for dims, _ in found]

    assert current() == [[2, 4, 32, 24], [2, 4]], "equal sizes: the last largest gear"
    assert mdl.set_dynamic_hw_size(hw.model_id, hw.in_ds, 1, 48, 64) == 0
    assert current() == [[2, 4, 24, 32], [2, 4]]
    assert mdl.set_dynamic_hw_size(hw.model_id, other, 1, 64, 48) == 0
    assert current() == [[2, 4, 32, 24], [2, 4]]
    assert mdl.get_cur_output_dims(hw.desc, 2)[1] == AclCode.ERROR_INVALID_PARAM


def test_two_dynamic_kinds_fail_at_load(
    make_backend: MakeBackend, tmp_path: Path, conv: Path
) -> None:
    path = tmp_path / "both.onnx"
    path.write_bytes(conv.read_bytes())
    manifest = {
        "input_shape": {"x": [-1, 3, -1, -1]},
        "dynamic_batch_size": [1, 2],
        "dynamic_image_size": HW_GEARS,
    }
    write_manifest(path, manifest)
    backend = make_backend()
    with pytest.raises(ModelError) as caught:
        backend.load(ModelSpec("conv", path))
    message = str(caught.value)
    assert message.startswith("model 'conv': cannot load")
    assert "dynamic_batch_size [1, 2] and dynamic_image_size [[48, 64], [64, 48]]" in message
    assert "mutually exclusive" in message and "input_shape {'x': [-1, 3, -1, -1]}" in message
    assert backend.simulator.acl.get_recent_err_msg() is None, "the backend took the message"


def test_a_description_with_two_kinds_is_refused() -> None:
    """What a runtime reporting gears of two kinds gets (ATC never builds such a model)."""
    x = (TensorInfo("x", (-1, 3, -1, -1), np.dtype(np.float32)),)
    with pytest.raises(ModelError) as caught:
        gear_table("conv", x, (1, 2), ((48, 64),), ())
    message = str(caught.value)
    assert message.startswith("model 'conv': it has gears of 2 dynamic kinds")
    assert "--dynamic_batch_size [[1], [2]]; --dynamic_image_size [[48, 64]]" in message
    assert "{'x': [-1, 3, -1, -1]}" in message and "mutually exclusive" in message
    assert gear_table("conv", x, (), (), ((1, 3, 8, 8),)).kind == GearKind.DIMS
    with pytest.raises(ModelError, match=r"gear \[1, 8, 8\] does not split into the inputs"):
        gear_table("conv", x, (), (), ((1, 8, 8),))
    with pytest.raises(ModelError, match="need -1 at H and W only"):
        gear_table("conv", x, (), ((48, 64),), ())


def test_queue_mode_stays_static_only(make_backend: MakeBackend, hw_model: Path) -> None:
    backend = make_backend()
    with pytest.raises(ModelError) as caught:
        backend.load(ModelSpec("conv", hw_model, mode="queue"))
    message = str(caught.value)
    assert "mode 'queue' needs a static-shape model" in message
    assert "dynamic_image_size gears [[48, 64], [64, 48]]" in message
    with backend.load(ModelSpec("conv", hw_model)) as model:
        assert isinstance(model, AsyncModel), "auto mode runs a resolution-gear model async"

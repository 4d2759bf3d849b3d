"""In-graph preprocessing: the rewritten graph equals host letterbox normalisation."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

from streamer.config import PluginConfig, RuntimeConfig
from streamer.errors import ConfigError
from streamer.runtime.base import ModelSpec
from streamer.runtime.graph_preprocess import (
    InputNormalization,
    prepend_normalization,
    prepend_runtime_normalization,
)
from streamer.runtime.mtcnn_keys import MTCNN_NORMALIZATION, refuse_in_graph
from streamer.runtime.onnx import OnnxBackend, in_graph_normalization
from streamer.vision.mtcnn import to_tensor
from streamer.vision.preprocess import Letterbox, LetterboxParams
from streamer.vision.registry import PREPROCESSORS


def identity_model(layout: str) -> onnx.ModelProto:
    """A float model that returns its (N, 3, 4, 5) NCHW or (N, 4, 5, 3) NHWC input."""
    shape: list[Any] = ["n", 3, 4, 5] if layout == "NCHW" else ["n", 4, 5, 3]
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, shape)
    graph = helper.make_graph([helper.make_node("Identity", ["x"], ["y"])], "g", [x], [y])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def run(model: onnx.ModelProto, pixels: np.ndarray) -> np.ndarray:
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    result: np.ndarray = session.run(None, {"x": pixels})[0]
    return result


@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
@pytest.mark.parametrize("color", ["rgb", "bgr"])
def test_rewritten_graph_equals_host_normalisation(layout: str, color: str) -> None:
    mean, std = np.array([0.485, 0.456, 0.406]), np.array([0.229, 0.224, 0.225])
    norm = InputNormalization.from_mean_std(mean, std, color == "rgb", layout)  # type: ignore[arg-type]
    pixels = np.random.default_rng(0).integers(0, 256, (2, 4, 5, 3), dtype=np.uint8)
    got = run(prepend_normalization(identity_model(layout), norm), pixels)
    model_order = pixels[..., ::-1] if color == "rgb" else pixels
    expected = (model_order / 255.0 - mean) / std
    if layout == "NCHW":
        expected = expected.transpose(0, 3, 1, 2)
    assert got.dtype == np.float32 and got.shape == expected.shape
    np.testing.assert_allclose(got, expected, atol=1e-5)


def dims(value: onnx.ValueInfoProto) -> list[int | str]:
    """A value's inferred dims: sizes, or names where symbolic."""
    return [d.dim_param or d.dim_value for d in value.type.tensor_type.shape.dim]


@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
@pytest.mark.parametrize("runtime", [False, True])
def test_channel_swap_and_arithmetic_run_on_channel_planes(layout: str, runtime: bool) -> None:
    """Gather, Sub and Mul see (n, 3, h, w) planes, offset and scale broadcast as (3, 1, 1):
    on a channel-last axis of 3 onnxruntime's CPU kernels work 3 elements at a time, which
    made in-graph normalisation cost 60 % of BlazeFace's own inference."""
    norm = InputNormalization((1.0, 2.0, 3.0), (0.5,) * 3, True, layout)  # type: ignore[arg-type]
    model = identity_model(layout)
    rewritten = (
        prepend_runtime_normalization(model, layout)  # type: ignore[arg-type]
        if runtime
        else prepend_normalization(model, norm)
    )
    graph = onnx.shape_inference.infer_shapes(rewritten, strict_mode=True).graph
    shapes = {v.name: dims(v) for v in [*graph.input, *graph.value_info]}
    shapes.update({i.name: list(i.dims) for i in graph.initializer})
    gather, sub, mul = (n for n in graph.node if n.op_type in ("Gather", "Sub", "Mul"))
    assert helper.get_attribute_value(gather.attribute[0]) == 1
    for node in (gather, sub, mul):
        assert shapes[node.input[0]] == ["n", 3, 4, 5], node.op_type
    parameter = ["n", 3, 1, 1] if runtime else [3, 1, 1]
    assert shapes[sub.input[1]] == shapes[mul.input[1]] == parameter


def test_nwhc_graph_equals_mtcnn_host_tensors() -> None:
    """MTCNN's nets see images transposed: the rewrite exchanges H and W after normalising,
    and gives what the host's ``to_tensor`` gives, bit for bit."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", "w", "h", 3])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", "w", "h", 3])
    graph = helper.make_graph([helper.make_node("Identity", ["x"], ["y"])], "g", [x], [y])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    rewritten = prepend_normalization(model, MTCNN_NORMALIZATION)
    onnx.checker.check_model(rewritten)
    pixels = np.random.default_rng(1).integers(0, 256, (2, 4, 5, 3), dtype=np.uint8)
    session = ort.InferenceSession(
        rewritten.SerializeToString(), providers=["CPUExecutionProvider"]
    )
    assert session.get_inputs()[0].shape == ["n", "h", "w", 3]
    got = session.run(None, {"x": pixels})[0]
    assert got.shape == (2, 5, 4, 3)
    assert np.array_equal(got, to_tensor(pixels))


def test_rewritten_input_is_uint8_nhwc_with_symbolic_batch() -> None:
    norm = InputNormalization((0.0,) * 3, (1.0,) * 3, False, "NCHW")
    rewritten = prepend_normalization(identity_model("NCHW"), norm)
    onnx.checker.check_model(rewritten)
    session = ort.InferenceSession(
        rewritten.SerializeToString(), providers=["CPUExecutionProvider"]
    )
    arg = session.get_inputs()[0]
    assert (arg.name, arg.type, arg.shape) == ("x", "tensor(uint8)", ["n", 4, 5, 3])


def test_non_image_input_is_refused() -> None:
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3])
    graph = helper.make_graph([helper.make_node("Identity", ["x"], ["y"])], "g", [x], [x])
    with pytest.raises(ValueError, match="4-D float"):
        prepend_normalization(
            helper.make_model(graph), InputNormalization((0,) * 3, (1,) * 3, False, "NCHW")
        )  # type: ignore[arg-type]


def test_table_selects_the_rewrite() -> None:
    assert in_graph_normalization(None) is None
    assert in_graph_normalization(PluginConfig(kind="letterbox")) is None
    norm = in_graph_normalization(PluginConfig(kind="letterbox", normalize="model", color="bgr"))
    assert norm is not None and not norm.swap_rb and norm.layout == "NCHW"
    assert norm.offset == pytest.approx((127.5,) * 3) and norm.scale == pytest.approx(
        (2 / 255,) * 3
    )
    with pytest.raises(ConfigError, match="normalize.*AIPP"):
        in_graph_normalization(PluginConfig(kind="letterbox", normalize="device"))
    with pytest.raises(ConfigError, match="preprocess.std"):
        in_graph_normalization(PluginConfig(kind="letterbox", normalize="model", std=0))
    with pytest.raises(ConfigError, match="preprocess.mean, preprocess.std: .* beyond float32"):
        in_graph_normalization(PluginConfig(kind="letterbox", normalize="model", std=1e-300))


@pytest.mark.parametrize("kind", ["mtcnn_pnet", "mtcnn_rnet", "mtcnn_onet", "mtcnn_classify"])
def test_mtcnn_tables_select_the_rewrite(kind: str) -> None:
    assert in_graph_normalization(PluginConfig(kind=kind, score_threshold=0.5)) is None
    norm = in_graph_normalization(PluginConfig(kind=kind, normalize="model"))
    assert norm == MTCNN_NORMALIZATION
    with pytest.raises(ConfigError, match='postprocess.normalize: "device" is ACL AIPP'):
        in_graph_normalization(PluginConfig(kind=kind, normalize="device"))
    with pytest.raises(ConfigError, match="postprocess.normalize"):
        in_graph_normalization(PluginConfig(kind=kind, normalize="graph"))
    refuse_in_graph(PluginConfig(kind=kind, normalize="device"))
    refuse_in_graph(PluginConfig(kind="letterbox", normalize="model"))
    with pytest.raises(ConfigError, match='"model" is the onnxruntime backend'):
        refuse_in_graph(PluginConfig(kind=kind, normalize="model"))


def test_mtcnn_backend_key_defaults_as_the_stages() -> None:
    from streamer.runtime.mtcnn_keys import MtcnnKeys
    from streamer.vision.mtcnn.layout import InputParams

    default = InputParams.model_fields["normalize"].default
    assert MtcnnKeys.model_fields["normalize"].default == default


def test_backend_keys_default_as_the_letterbox() -> None:
    from streamer.runtime.letterbox_keys import LetterboxKeys

    for key, spec in LetterboxKeys.model_fields.items():
        assert LetterboxParams.model_fields[key].default == spec.default, key


def test_letterbox_sends_pixels_to_the_rewritten_model(short_range_model: Path) -> None:
    table = PluginConfig(kind="letterbox", normalize="model", pad_value=7)
    backend = OnnxBackend(RuntimeConfig())
    with backend.load(ModelSpec("face", short_range_model, preprocess=table)) as model:
        pre = PREPROCESSORS.create(table, model.info, "models[0].preprocess")
    image = np.full((64, 128, 3), 200, np.uint8)
    tensor, transform = pre(image)
    assert tensor.dtype == np.uint8 and tensor.shape == (128, 128, 3)
    assert (tensor[: transform.pad_y] == 7).all() and (tensor[64] == 200).all()


def test_letterbox_pixels_need_a_uint8_input(short_range_model: Path) -> None:
    backend = OnnxBackend(RuntimeConfig())
    with backend.load(ModelSpec("face", short_range_model)) as model:
        info = model.info
    with pytest.raises(ConfigError, match="normalize: 'model'.*float32"):
        Letterbox(LetterboxParams(normalize="model"), info)

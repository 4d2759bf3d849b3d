"""The plug-in registry: registration, lookup, parameter validation and build-time errors."""

from __future__ import annotations

import numpy as np
import pytest
from pydantic import Field

from streamer.config import PluginConfig
from streamer.errors import ConfigError
from streamer.runtime.base import ModelInfo, TensorInfo
from streamer.vision.registry import POSTPROCESSORS, PREPROCESSORS, PluginParams, Registry
from streamer.vision.stages import ITEM_STAGES

F32 = np.dtype(np.float32)


def _info(
    input_shape: tuple[int, ...] = (-1, 3, 128, 128),
    outputs: tuple[tuple[int, ...], ...] = ((-1, 896, 16), (-1, 896, 1)),
    dtype: np.dtype = F32,
) -> ModelInfo:
    return ModelInfo(
        "m",
        (TensorInfo("input", input_shape, dtype),),
        tuple(TensorInfo(f"out{i}", shape, F32) for i, shape in enumerate(outputs)),
    )


class _Params(PluginParams):
    gain: float = Field(1.0, gt=0)
    name: str = "x"


def _registry() -> Registry[tuple[_Params, ModelInfo]]:
    registry: Registry[tuple[_Params, ModelInfo]] = Registry("widget")

    @registry.register("plain", _Params)
    def plain(params: _Params, info: ModelInfo) -> tuple[_Params, ModelInfo]:
        return params, info

    @registry.register("picky", _Params)
    def picky(params: _Params, info: ModelInfo) -> tuple[_Params, ModelInfo]:
        raise ConfigError("gain: does not fit the model")

    return registry


def test_create_validates_and_passes_the_model_info() -> None:
    info = _info()
    params, got = _registry().create(PluginConfig(kind="plain", gain=2), info, "models[0].x")
    assert params == _Params(gain=2.0)
    assert got is info


def test_duplicate_names_are_rejected() -> None:
    registry = _registry()
    with pytest.raises(ValueError, match="'plain' is already registered"):
        registry.register("plain", _Params)(lambda p, i: None)


def test_unknown_kind_lists_the_known_names() -> None:
    with pytest.raises(ConfigError) as info:
        _registry().create(PluginConfig(kind="nope"), _info(), "models[0].postprocess")
    message = str(info.value)
    assert message.startswith("models[0].postprocess.kind: unknown widget 'nope'")
    assert "known: picky, plain" in message


def test_unknown_key_is_named_with_its_location() -> None:
    cfg = PluginConfig(kind="plain", gian=2)
    with pytest.raises(ConfigError) as info:
        _registry().create(cfg, _info(), "models[0].preprocess")
    assert "models[0].preprocess.gian: unknown key (known: gain, name)" in str(info.value)


def test_invalid_value_is_named_with_its_location() -> None:
    with pytest.raises(ConfigError) as info:
        _registry().create(PluginConfig(kind="plain", gain=-1), _info(), "models[1].preprocess")
    assert "models[1].preprocess.gain: Input should be greater than 0" in str(info.value)


def test_factory_config_errors_get_the_location() -> None:
    with pytest.raises(ConfigError, match=r"^models\[0\]\.x: picky: gain: does not fit"):
        _registry().create(PluginConfig(kind="picky"), _info(), "models[0].x")


def test_builtins_are_registered_on_first_lookup() -> None:
    assert "letterbox" in PREPROCESSORS.names()
    assert "blazeface" in POSTPROCESSORS.names()
    assert "blazeface" in POSTPROCESSORS


# ---- build-time errors of the built-in plug-ins --------------------------------------------


def _post(info: ModelInfo, **params: object) -> str:
    with pytest.raises(ConfigError) as exc:
        POSTPROCESSORS.create(PluginConfig(kind="blazeface", **params), info, "models[0].post")
    return str(exc.value)


def _pre(info: ModelInfo, **params: object) -> str:
    with pytest.raises(ConfigError) as exc:
        PREPROCESSORS.create(PluginConfig(kind="letterbox", **params), info, "models[0].pre")
    return str(exc.value)


def test_blazeface_rejects_outputs_that_disagree_with_the_input_size() -> None:
    message = _post(_info(outputs=((-1, 2304, 16), (-1, 2304, 1))))
    assert message.startswith("models[0].post: blazeface:")
    assert "896 anchors" in message
    assert "out0 [-1, 2304, 16]" in message


def test_blazeface_rejects_an_unknown_input_size() -> None:
    message = _post(_info(input_shape=(-1, 3, 160, 160)))
    assert "fits no BlazeFace variant" in message
    assert "128x128 (short_range)" in message


def test_blazeface_accepts_either_variant_and_nhwc() -> None:
    full = _info((1, 192, 192, 3), ((1, 2304, 1), (1, 2304, 16)))
    post = POSTPROCESSORS.create(PluginConfig(kind="blazeface"), full, "x")
    assert post.variant.name == "full_range"  # type: ignore[attr-defined]
    assert post.score_threshold == 0.5  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    ("params", "key"),
    [
        ({"score_threshold": 1.5}, "score_threshold"),
        ({"iou_threshold": -0.1}, "iou_threshold"),
        ({"max_detections": 0}, "max_detections"),
        ({"nms": "weighted"}, "nms"),
        ({"score_threshold": "0.5"}, "score_threshold"),  # a string is not a number
        ({"max_detections": 10.0}, "max_detections"),
    ],
)
def test_blazeface_params_are_validated(params: dict[str, object], key: str) -> None:
    assert f"models[0].post.{key}:" in _post(_info(), **params)


def test_letterbox_needs_a_size_for_dynamic_inputs() -> None:
    assert "set size = [h, w]" in _pre(_info(input_shape=(-1, 3, -1, -1)))
    pre = PREPROCESSORS.create(
        PluginConfig(kind="letterbox", size=[96, 160]), _info((-1, 3, -1, -1)), "x"
    )
    tensor, _ = pre(np.zeros((10, 10, 3), np.uint8))
    assert tensor.shape == (3, 96, 160)


@pytest.mark.parametrize(
    ("info", "params", "fragment"),
    [
        (_info(dtype=np.dtype(np.uint8)), {}, "expected floating point"),
        (_info(input_shape=(-1, 128, 128)), {}, "expected 4-D"),
        (_info(), {"layout": "NHWC"}, "has 128 channels as NHWC"),
        (_info(), {"size": [64, 64]}, "does not fit input"),
        (_info(), {"std": [0.5, 0, 0.5]}, "std: must be positive"),
        (_info(), {"std": 1e-300}, "reaches 5e+299, beyond float32"),
        (_info(), {"mean": -1e300}, "reaches 2e+300, beyond float32"),
        (_info(dtype=np.dtype(np.float16)), {"std": 1e-7}, "beyond the model input's float16"),
        (_info(), {"pad_value": 256}, "models[0].pre.pad_value:"),
        (_info(), {"color": "yuv"}, "models[0].pre.color:"),
    ],
)
def test_letterbox_build_errors(info: ModelInfo, params: dict[str, object], fragment: str) -> None:
    assert fragment in _pre(info, **params)


@pytest.mark.parametrize(
    ("params", "key"), [({"factor": 0.99}, "factor"), ({"min_face_px": 0.5}, "min_face_px")]
)
def test_pnet_pyramid_parameters_are_bounded(params: dict[str, object], key: str) -> None:
    """Past these the pyramid's levels (and their time and memory) grow without bound."""
    with pytest.raises(ConfigError, match=f"pnet.{key}:"):
        ITEM_STAGES.params(PluginConfig(kind="mtcnn_pnet", **params), "pnet")

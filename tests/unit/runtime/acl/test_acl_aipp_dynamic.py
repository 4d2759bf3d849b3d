"""Dynamic AIPP (issue 9, items 2 and 3): the simulated ``acl.mdl`` AIPP surface and its error
codes, the parameters applied per execution and per batch index, the ACL executors setting
them on every batch, and each combination rule as a start-up error that names it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import cv2
import numpy as np
import pytest
from acl_testing import (
    GEARS,
    TOLERANCE,
    Loaded,
    MakeBackend,
    MakeModel,
    Reference,
    assert_close,
    blazeface_input,
    calls,
    conv_model,
    onnx_runner,
    open_device,
    run_threads,
    tiny_model,
    write_manifest,
)
from click.testing import CliRunner

from streamer.cli import main
from streamer.config import PluginConfig
from streamer.errors import ConfigError, ModelError
from streamer.runtime.acl.aipp_dynamic import DynamicAippConfig, DynamicAippParams, DynamicAippPlan
from streamer.runtime.acl.aipp_rules import AippRuleError, check_dynamic_aipp
from streamer.runtime.acl.constants import (
    ACL_DYNAMIC_AIPP_NAME,
    ACL_DYNAMIC_TENSOR_NAME,
    AclCode,
    AippInputFormat,
)
from streamer.runtime.acl.gears import GearKind
from streamer.runtime.acl.sim.simulator import Simulator
from streamer.runtime.base import ModelSpec
from streamer.runtime.graph_preprocess import InputNormalization
from streamer.vision.registry import PREPROCESSORS

pytestmark = pytest.mark.timeout(60)

FACE_BYTES = 128 * 128 * 3
DEVICE = PluginConfig(kind="letterbox", normalize="device", aipp="dynamic")
"""The default BlazeFace letterbox (RGB, mean 0.5, std 0.5) with dynamic AIPP."""


def dynamic_aipp(max_src_image_size: int) -> dict[str, Any]:
    return DynamicAippConfig(
        aipp_mode="dynamic", max_src_image_size=max_src_image_size
    ).model_dump()


@pytest.fixture
def face_aipp(make_model: MakeModel) -> Path:
    """Short-range BlazeFace built with ``--dynamic_batch_size=1,2,4,8`` and dynamic AIPP."""
    manifest = {
        "input_shape": {"input": [-1, 3, 128, 128]},
        "dynamic_batch_size": GEARS,
        "aipp": dynamic_aipp(8 * FACE_BYTES),
    }
    return make_model("face_aipp", manifest)


@pytest.fixture
def relu_aipp(tmp_path: Path) -> Path:
    """``y = relu(x)`` on x [2, 3, 2, 4] (NCHW) with dynamic AIPP for two 2 × 4 images."""
    path = tiny_model(tmp_path / "relu.onnx")
    write_manifest(path, {"input_shape": {"x": [2, 3, 2, 4]}, "aipp": dynamic_aipp(2 * 2 * 4 * 3)})
    return path


def hw_aipp(tmp_path: Path, max_src_image_size: int) -> Path:
    """The conv model (batch 2) built with resolution gears 8 × 8 and 16 × 16 and dynamic AIPP."""
    path = conv_model(tmp_path / "conv_hw_aipp.onnx")
    manifest = {
        "input_shape": {"x": [2, 3, -1, -1]},
        "dynamic_image_size": [[8, 8], [16, 16]],
        "aipp": dynamic_aipp(max_src_image_size),
    }
    write_manifest(path, manifest)
    return path


def filled_set(sim: Simulator, batch: int, width: int, height: int) -> int:
    """An ``aclmdlAIPP`` for ``batch`` RGB888 images of ``width`` × ``height``, all else default."""
    mdl = sim.acl.mdl
    handle = mdl.create_aipp(batch)
    assert handle
    assert mdl.set_aipp_input_format(handle, int(AippInputFormat.RGB888_U8)) == 0
    assert mdl.set_aipp_src_image_size(handle, width, height) == 0
    return int(handle)


def resized(images: list[np.ndarray]) -> np.ndarray:
    """BGR uint8 images resized to 128 × 128, stacked: (n, 128, 128, 3)."""
    return np.stack([cv2.resize(image, (128, 128)) for image in images])


# The simulated surface ---------------------------------------------------------------------


def test_the_model_gets_the_dynamic_aipp_input(sim: Simulator, face_aipp: Path) -> None:
    open_device(sim)
    model = Loaded(sim, face_aipp)
    mdl = sim.acl.mdl
    assert mdl.get_num_inputs(model.desc) == 3
    assert mdl.get_input_index_by_name(model.desc, ACL_DYNAMIC_AIPP_NAME) == (1, 0)
    assert mdl.get_input_index_by_name(model.desc, ACL_DYNAMIC_TENSOR_NAME) == (2, 0)
    assert mdl.get_input_dims(model.desc, 0)[0]["dims"] == [-1, 128, 128, 3]
    assert mdl.get_input_size_by_index(model.desc, 0) == 8 * FACE_BYTES
    assert mdl.get_input_size_by_index(model.desc, 1) == mdl.get_aipp_data_size(8)[0] == 64 + 96 * 8


def test_setters_refuse_misuse_with_documented_codes(sim: Simulator) -> None:
    mdl, invalid = sim.acl.mdl, AclCode.ERROR_INVALID_PARAM
    assert mdl.create_aipp(0) == 0
    handle = mdl.create_aipp(2)
    assert mdl.set_aipp_dtc_pixel_mean(handle, 0, 0, 0, 0, 2) == invalid
    assert mdl.set_aipp_dtc_pixel_min(handle, -1.0, 0.0, 0.0, 0.0, 0) == invalid
    assert mdl.set_aipp_pixel_var_reci(handle, 1e6, 1.0, 1.0, 1.0, 1) == invalid
    assert mdl.set_aipp_src_image_size(handle, 1, 1) == invalid
    assert mdl.set_aipp_input_format(handle, 99) == invalid
    assert mdl.set_aipp_rbuv_swap_switch(handle, 2) == invalid
    assert mdl.get_aipp_data_size(0)[1] == invalid
    with pytest.raises(TypeError, match="acl.mdl.set_aipp_rbuv_swap_switch args parse failed"):
        mdl.set_aipp_rbuv_swap_switch(handle, 256)
    assert sim.live_resources()["aipp_sets"] == [handle]
    assert mdl.destroy_aipp(handle) == 0
    assert mdl.destroy_aipp(handle) == invalid
    assert mdl.set_aipp_rbuv_swap_switch(handle, 1) == invalid


def test_set_input_aipp_checks_the_set_against_the_model(sim: Simulator, face_aipp: Path) -> None:
    open_device(sim)
    model = Loaded(sim, face_aipp)
    mdl, invalid = sim.acl.mdl, AclCode.ERROR_INVALID_PARAM
    unsized = mdl.create_aipp(8)
    assert mdl.set_aipp_input_format(unsized, int(AippInputFormat.RGB888_U8)) == 0
    assert mdl.set_input_aipp(model.model_id, model.in_ds, 1, unsized) == invalid
    assert "srcImageSizeW and srcImageSizeH must be set" in sim.acl.get_recent_err_msg()
    full = filled_set(sim, 8, 128, 128)
    assert mdl.set_input_aipp(model.model_id, model.in_ds, 0, full) == invalid
    too_few = filled_set(sim, 4, 128, 128)
    assert mdl.set_input_aipp(model.model_id, model.in_ds, 1, too_few) == invalid
    assert "batchSize = the largest gear" in sim.acl.get_recent_err_msg()
    assert mdl.set_input_aipp(model.model_id, model.in_ds, 1, full) == 0
    yuv = filled_set(sim, 8, 128, 128)
    assert mdl.set_aipp_input_format(yuv, int(AippInputFormat.YUV420SP_U8)) == 0
    unsupported = AclCode.ERROR_FEATURE_UNSUPPORTED
    assert mdl.set_input_aipp(model.model_id, model.in_ds, 1, yuv) == unsupported
    for handle in (unsized, full, too_few, yuv):
        assert mdl.destroy_aipp(handle) == 0


def test_execution_without_set_input_aipp_fails(sim: Simulator, relu_aipp: Path) -> None:
    open_device(sim)
    model = Loaded(sim, relu_aipp)
    model.upload(np.zeros((2, 2, 4, 3), np.uint8))
    mdl = sim.acl.mdl
    assert mdl.execute(model.model_id, model.in_ds, model.out_ds) == AclCode.ERROR_GE_AIPP_NOT_EXIST
    handle = filled_set(sim, 2, 4, 2)
    assert mdl.set_input_aipp(model.model_id, model.in_ds, 1, handle) == 0
    assert mdl.execute(model.model_id, model.in_ds, model.out_ds) == 0
    assert mdl.destroy_aipp(handle) == 0


def test_each_batch_index_gets_its_own_parameters(sim: Simulator, relu_aipp: Path) -> None:
    open_device(sim)
    model = Loaded(sim, relu_aipp)
    pixels = np.random.default_rng(3).integers(0, 256, (2, 2, 4, 3), dtype=np.uint8)
    model.upload(pixels)
    mdl = sim.acl.mdl
    handle = filled_set(sim, 2, 4, 2)
    assert mdl.set_aipp_rbuv_swap_switch(handle, 1) == 0
    assert mdl.set_aipp_dtc_pixel_mean(handle, 10, 20, 30, 0, 0) == 0
    assert mdl.set_aipp_dtc_pixel_min(handle, 0.5, 1.5, 2.5, 0.0, 1) == 0
    assert mdl.set_aipp_pixel_var_reci(handle, 0.5, 0.25, 2.0, 1.0, 1) == 0
    assert mdl.set_input_aipp(model.model_id, model.in_ds, 1, handle) == 0
    assert mdl.execute(model.model_id, model.in_ds, model.out_ds) == 0
    rgb = pixels[..., ::-1].astype(np.float32)
    expected = np.stack(
        [
            rgb[0] - np.array([10, 20, 30], np.float32),
            (rgb[1] - np.array([0.5, 1.5, 2.5], np.float32)) * np.array([0.5, 0.25, 2.0]),
        ]
    )
    want = np.maximum(expected, 0).transpose(0, 3, 1, 2)
    np.testing.assert_allclose(model.download(0, (2, 3, 2, 4)), want, atol=1e-5)
    assert mdl.destroy_aipp(handle) == 0


# The executors -----------------------------------------------------------------------------


@pytest.mark.parametrize("mode", ["auto", "async", "sync"])
def test_executors_set_the_parameters_on_every_batch(
    make_backend: MakeBackend,
    face_aipp: Path,
    frames: list[np.ndarray],
    reference: Reference,
    mode: str,
) -> None:
    backend = make_backend()
    model = backend.load(ModelSpec("face", face_aipp, mode=mode, preprocess=DEVICE))
    assert model.mode == ("async" if mode == "auto" else mode)
    groups = [frames[:4], frames[4:5], frames[5:7]]
    with model:
        results = run_threads(model, [resized(images) for images in groups])
    for result, images in zip(results, groups, strict=True):
        assert result.error is None and result.outputs is not None
        for got, want in zip(result.outputs, reference(blazeface_input(images)), strict=True):
            # float32 rounding of the differently ordered arithmetic on logits up to ~200
            np.testing.assert_allclose(got, want, atol=TOLERANCE, rtol=1e-5)
    assert len(calls(backend.simulator, "acl.mdl.set_input_aipp")) == 3
    assert len(calls(backend.simulator, "acl.mdl.create_aipp")) == 1
    assert backend.simulator.violations == []


def test_queue_mode_is_refused_with_the_reason(make_backend: MakeBackend, face_aipp: Path) -> None:
    static = face_aipp.with_name("face_aipp4.onnx")
    static.write_bytes(face_aipp.read_bytes())
    write_manifest(
        static, {"input_shape": {"input": [4, 3, 128, 128]}, "aipp": dynamic_aipp(4 * FACE_BYTES)}
    )
    backend = make_backend()
    with pytest.raises(ModelError, match="mode 'queue' cannot run a model with dynamic AIPP"):
        backend.load(ModelSpec("face", static, mode="queue", preprocess=DEVICE))
    with backend.load(ModelSpec("face", static, preprocess=DEVICE)) as model:
        assert model.mode == "async"


def test_config_and_model_must_agree_on_dynamic_aipp(
    make_backend: MakeBackend, face_aipp: Path, static4_model: Path
) -> None:
    backend = make_backend()
    static_aipp = PluginConfig(kind="letterbox", normalize="device")
    with pytest.raises(ModelError, match='needs normalize = "device" and aipp = "dynamic"'):
        backend.load(ModelSpec("face", face_aipp, preprocess=static_aipp))
    with pytest.raises(ModelError, match="needs a model built with ATC aipp_mode: dynamic"):
        backend.load(ModelSpec("face", static4_model, preprocess=DEVICE))


def test_resolution_gears_narrow_to_the_largest(make_backend: MakeBackend, tmp_path: Path) -> None:
    path = hw_aipp(tmp_path, 2 * 16 * 16 * 3)
    backend = make_backend()
    with backend.load(ModelSpec("conv", path, mode="sync", preprocess=DEVICE)) as model:
        assert model.info.hw_gears == ((16, 16),)
        pixels = np.random.default_rng(5).integers(0, 256, (2, 16, 16, 3), dtype=np.uint8)
        (result,) = run_threads(model, [pixels])
    host = (pixels[..., ::-1].astype(np.float32) / 127.5 - 1.0).transpose(0, 3, 1, 2)
    assert_close(result.outputs, onnx_runner(tmp_path / "conv_hw_aipp.onnx")(host))
    assert [args[3:] for args in calls(backend.simulator, "acl.mdl.set_dynamic_hw_size")] == [
        (16, 16)
    ]


# The combination rules ---------------------------------------------------------------------


def test_rule_never_with_dynamic_dims(make_backend: MakeBackend, tmp_path: Path) -> None:
    path = conv_model(tmp_path / "conv_dims.onnx")
    manifest = {
        "input_shape": {"x": [-1, 3, -1, -1]},
        "input_format": "ND",
        "dynamic_dims": [[1, 8, 8], [2, 16, 16]],
        "aipp": dynamic_aipp(2 * 16 * 16 * 3),
    }
    write_manifest(path, manifest)
    with pytest.raises(ModelError, match="rule 'AIPP never with dynamic dims'"):
        make_backend().load(ModelSpec("conv", path, preprocess=DEVICE))


def test_rule_input_memory_for_the_largest_batch(
    make_backend: MakeBackend, make_model: MakeModel
) -> None:
    manifest = {
        "input_shape": {"input": [-1, 3, 128, 128]},
        "dynamic_batch_size": GEARS,
        "aipp": dynamic_aipp(4 * FACE_BYTES),
    }
    path = make_model("face_small", manifest)
    rule = "rule 'dynamic AIPP with dynamic batch: input memory for the largest batch'"
    with pytest.raises(ModelError, match=rule):
        make_backend().load(ModelSpec("face", path, preprocess=DEVICE))


def test_rule_source_size_is_the_largest_resolution_gear(
    make_backend: MakeBackend, tmp_path: Path
) -> None:
    path = hw_aipp(tmp_path, 2 * 16 * 16 * 3)
    small = PluginConfig(kind="letterbox", normalize="device", aipp="dynamic", size=[8, 8])
    rule = "rule 'dynamic AIPP with dynamic resolution: source size = the largest gear'"
    with pytest.raises(ModelError, match=rule):
        make_backend().load(ModelSpec("conv", path, preprocess=small))


def test_rule_input_memory_for_the_largest_resolution(
    make_backend: MakeBackend, tmp_path: Path
) -> None:
    path = hw_aipp(tmp_path, 2 * 8 * 8 * 3)
    rule = "rule 'dynamic AIPP with dynamic resolution: input memory for the largest resolution'"
    with pytest.raises(ModelError, match=rule):
        make_backend().load(ModelSpec("conv", path, preprocess=DEVICE))


def plan(kind: GearKind, **changes: Any) -> DynamicAippPlan:
    """A valid plan for a batch-8 model of 128 × 128 images, with ``changes``."""
    norm = InputNormalization.from_mean_std(np.full(3, 0.5), np.full(3, 0.5), True, "NCHW")
    values: dict[str, Any] = {
        "model": "face",
        "kind": kind,
        "batch_size": 8,
        "largest_batch": 8,
        "params": DynamicAippParams.from_normalization(norm, (128, 128)),
        "largest_resolution": (128, 128),
        "input_bytes": 8 * FACE_BYTES,
    }
    return DynamicAippPlan(**{**values, **changes})


@pytest.mark.parametrize(
    ("kind", "changes", "rule"),
    [
        (
            GearKind.BATCH,
            {"batch_size": 4},
            "dynamic AIPP with dynamic batch: batchSize = the largest gear",
        ),
        (
            GearKind.HW,
            {"crop": True},
            "dynamic AIPP with dynamic resolution: no crop, resize or padding",
        ),
        (
            GearKind.HW,
            {"padding": True},
            "dynamic AIPP with dynamic resolution: no crop, resize or padding",
        ),
    ],
)
def test_rules_the_daemon_keeps_by_construction(
    kind: GearKind, changes: dict[str, Any], rule: str
) -> None:
    check_dynamic_aipp(plan(kind))
    with pytest.raises(AippRuleError, match=f"rule '{rule}'"):
        check_dynamic_aipp(plan(kind, **changes))


# Config and command line -------------------------------------------------------------------


def test_dynamic_aipp_needs_normalize_device(make_backend: MakeBackend, face_aipp: Path) -> None:
    with make_backend().load(ModelSpec("face", face_aipp, preprocess=DEVICE)) as model:
        host = PluginConfig(kind="letterbox", aipp="dynamic")
        with pytest.raises(ConfigError, match='aipp = "dynamic" .* needs normalize = "device"'):
            PREPROCESSORS.create(host, model.info, "models[0].preprocess")
        letterbox = PREPROCESSORS.create(DEVICE, model.info, "models[0].preprocess")
    pixels, _ = letterbox(np.zeros((90, 160, 3), np.uint8))
    assert pixels.shape == (128, 128, 3) and pixels.dtype == np.uint8


def test_cli_prints_the_dynamic_aipp_config(tmp_path: Path) -> None:
    config = tmp_path / "a.toml"
    config.write_text(
        '[[ingress]]\nuri = "pull+bind:tcp://127.0.0.1:5555"\n'
        '[[egress]]\nuri = "pub+bind:tcp://127.0.0.1:5556"\n'
        '[[models]]\nname = "face"\nasset = "blazeface_short_range"\n'
        "[models.batch]\ngears = [1, 2, 4, 8]\n"
        '[models.preprocess]\nkind = "letterbox"\nsize = [128, 128]\n'
        'normalize = "device"\naipp = "dynamic"\n'
        '[models.postprocess]\nkind = "blazeface"\n'
    )
    base = ["models", "aipp", "--config", str(config), "--model", "face"]
    text = CliRunner().invoke(main, base)
    assert text.exit_code == 0, text.output
    assert text.output == DynamicAippConfig.for_images(8, 128, 128).to_config()
    assert "    aipp_mode : dynamic\n    related_input_rank : 0\n" in text.output
    section = CliRunner().invoke(main, [*base, "--json"])
    assert (
        DynamicAippConfig.model_validate_json(section.output).max_src_image_size == 8 * FACE_BYTES
    )
    empty = CliRunner().invoke(main, [*base, "--size", "0", "0"])  # a traceback, exit 1
    assert empty.exit_code == 2, empty.output
    assert "error: model 'face': dynamic AIPP is sized by its largest image" in empty.output

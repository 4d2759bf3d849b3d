"""Static AIPP: the ATC config text, the simulator's manifest ``aipp``, and the combination
rules as load errors that name the rule (seeds "动态Batch/动态分辨率/动态维度")."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
from acl_testing import MakeBackend, MakeModel
from click.testing import CliRunner
from onnx import TensorProto, helper

from streamer.cli import main
from streamer.config import PluginConfig
from streamer.errors import ConfigError, ModelError
from streamer.runtime.acl.aipp_dynamic import DynamicAippParams
from streamer.runtime.acl.aipp_rules import AippRuleError, check_aipp_build
from streamer.runtime.acl.aipp_static import StaticAipp
from streamer.runtime.acl.sim.image import load_image
from streamer.runtime.acl.sim.manifest import ManifestError
from streamer.runtime.base import ModelSpec
from streamer.runtime.graph_preprocess import InputNormalization


def image_model(folder: Path, manifest: dict[str, Any]) -> Path:
    """``face.om`` with an ONNX (N, 3, H, W) → mean over H, W (N, 3) model and ``manifest``."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 3, "h", "w"])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 3])
    node = helper.make_node("ReduceMean", ["x"], ["y"], axes=[2, 3], keepdims=0)
    graph = helper.make_graph([node], "g", [x], [y])
    onnx.save(
        helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]), folder / "face.onnx"
    )
    (folder / "face.acl.json").write_text(json.dumps(manifest))
    return folder / "face.om"


AIPP = StaticAipp.from_normalization(
    InputNormalization.from_mean_std(np.full(3, 0.5), np.full(3, 0.5), True, "NCHW"), 0, 0
)


def test_config_text_has_the_aipp_op_block() -> None:
    text = AIPP.to_config()
    assert text.startswith("aipp_op {\n") and text.endswith("}\n")
    assert "    input_format : RGB888_U8\n" in text and "    rbuv_swap_switch : true\n" in text
    assert "    min_chn_0 : 127.5\n" in text and "    crop : false\n" in text


def test_simulated_aipp_normalises_uint8_pixels(tmp_path: Path) -> None:
    aipp = AIPP.model_copy(update={"src_image_size_w": 4, "src_image_size_h": 2})
    manifest = {"input_shape": {"x": [1, 3, 2, 4]}, "aipp": aipp.model_dump()}
    image = load_image(image_model(tmp_path, manifest))
    assert image.inputs[0].dims == (1, 2, 4, 3) and image.inputs[0].dtype == np.uint8
    pixels = np.zeros((1, 2, 4, 3), np.uint8)
    pixels[..., 0] = 255  # blue in BGR: the model's third (RGB) channel
    (out,) = image.run([pixels])
    np.testing.assert_allclose(out, [[-1.0, -1.0, 1.0]], atol=1e-6)


def test_resolution_gears_fill_h_and_w_of_the_pixels(tmp_path: Path) -> None:
    manifest = {
        "input_shape": {"x": [1, 3, -1, -1]},
        "dynamic_image_size": [[2, 4], [4, 8]],
        "aipp": AIPP.model_dump(),
    }
    image = load_image(image_model(tmp_path, manifest))
    assert image.inputs[0].dims == (1, -1, -1, 3)
    assert image.shapes[(4, 8)] == ((1, 4, 8, 3),)


RULES = [
    (
        {"input_shape": {"x": [1, 3, -1, -1]}, "dynamic_image_size": [[2, 4], [4, 8]]},
        {"crop": True, "crop_size_w": 2, "crop_size_h": 2},
        "static AIPP with dynamic resolution: no crop or padding",
    ),
    (
        {"input_shape": {"x": [1, 3, -1, -1]}, "dynamic_image_size": [[2, 4], [4, 8]]},
        {"padding": True, "left_padding_size": 2},
        "static AIPP with dynamic resolution: no crop or padding",
    ),
    (
        {"input_shape": {"x": [1, 3, -1, -1]}, "dynamic_image_size": [[2, 4], [4, 8]]},
        {"src_image_size_w": 8, "src_image_size_h": 4},
        "static AIPP with dynamic resolution: source size 0",
    ),
    (
        {"input_shape": {"x": [-1, 3, 2, -1]}, "dynamic_dims": [[1, 4], [2, 8]]},
        {},
        "AIPP never with dynamic dims",
    ),
]


@pytest.mark.parametrize(("manifest", "aipp", "rule"), RULES)
def test_broken_rule_is_a_load_error_naming_it(
    tmp_path: Path, manifest: dict[str, Any], aipp: dict[str, Any], rule: str
) -> None:
    manifest = {**manifest, "aipp": AIPP.model_copy(update=aipp).model_dump()}
    with pytest.raises(ManifestError, match=f"rule '{rule}'"):
        load_image(image_model(tmp_path, manifest))


DYNAMIC_AIPP = {"aipp_mode": "dynamic", "related_input_rank": 0, "max_src_image_size": 49152}


@pytest.mark.parametrize("aipp", [AIPP.model_dump(), DYNAMIC_AIPP], ids=["static", "dynamic"])
def test_an_input_format_that_is_not_the_model_s_layout_is_a_load_error(
    tmp_path: Path, aipp: dict[str, Any]
) -> None:
    """NHWC named for an NCHW model puts 128 where AIPP's 3 channels go: it failed deep in
    the graph rewrite with a bare ValueError (a traceback from ``streamer check``)."""
    manifest = {"input_shape": {"x": [1, 3, 128, 128]}, "input_format": "NHWC", "aipp": aipp}
    with pytest.raises(ManifestError, match=r"has 128 channels; AIPP's images have 3"):
        load_image(image_model(tmp_path, manifest))


def test_rules_allow_static_aipp_with_batch_gears() -> None:
    check_aipp_build(AIPP.model_copy(update={"src_image_size_w": 8}), "batch")
    with pytest.raises(AippRuleError, match="dynamic dims"):
        check_aipp_build(AIPP, "dims")


def face_config(folder: Path) -> Path:
    """A config of BlazeFace (model ``face``) letterboxed to 128x128, written to
    ``folder/a.toml``."""
    config = folder / "a.toml"
    config.write_text(
        '[[ingress]]\nuri = "pull+bind:tcp://127.0.0.1:5555"\n'
        '[[egress]]\nuri = "pub+bind:tcp://127.0.0.1:5556"\n'
        '[[models]]\nname = "face"\nasset = "blazeface_short_range"\n'
        '[models.preprocess]\nkind = "letterbox"\nsize = [128, 128]\n'
        '[models.postprocess]\nkind = "blazeface"\n'
    )
    return config


def test_cli_prints_the_config_and_the_manifest_section(tmp_path: Path) -> None:
    config = face_config(tmp_path)
    base = ["models", "aipp", "--config", str(config), "--model", "face"]
    text = CliRunner().invoke(main, base)
    assert text.exit_code == 0, text.output
    assert (
        text.output
        == AIPP.model_copy(update={"src_image_size_w": 128, "src_image_size_h": 128}).to_config()
    )
    section = CliRunner().invoke(main, [*base, "--json", "--size", "0", "0"])
    assert StaticAipp.model_validate_json(section.output) == AIPP
    missing = CliRunner().invoke(main, [*base[:-1], "nope"])
    assert missing.exit_code != 0 and "no model 'nope'" in missing.output


def test_cli_refuses_a_negative_size_with_one_line(tmp_path: Path) -> None:
    """``--size -5 128`` reached StaticAipp's validation: a pydantic traceback, exit 1."""
    config = face_config(tmp_path)
    base = ["models", "aipp", "--config", str(config), "--model", "face", "--size"]
    result = CliRunner().invoke(main, [*base, "-5", "128"])
    assert result.exit_code == 2, result.output
    assert result.output == (
        "error: size -5 128: height and width are pixels, not negative (0 0 for resolution gears)\n"
    )


def test_cli_refuses_a_size_past_int32(tmp_path: Path) -> None:
    """``--size 99999999999 2`` printed an AIPP config no ATC or runtime takes."""
    config = face_config(tmp_path)
    base = ["models", "aipp", "--config", str(config), "--model", "face", "--size"]
    result = CliRunner().invoke(main, [*base, "99999999999", "2"])
    assert result.exit_code == 2, result.output
    assert result.output == (
        "error: size 99999999999 2: height and width are at most 2147483647 pixels "
        "(ACL holds the AIPP source size as int32)\n"
    )
    assert CliRunner().invoke(main, [*base, "2147483647", "2"]).exit_code == 0


@pytest.mark.parametrize(("size", "missing"), [(("0", "128"), "height"), (("96", "0"), "width")])
def test_cli_refuses_a_size_with_one_zero(
    tmp_path: Path, size: tuple[str, str], missing: str
) -> None:
    """``--size 0 128`` printed ``src_image_size_h : 0`` beside a width of 128: neither a
    static size nor the 0 0 of resolution gears, and ATC's error came only at the build."""
    config = face_config(tmp_path)
    base = ["models", "aipp", "--config", str(config), "--model", "face", "--size"]
    result = CliRunner().invoke(main, [*base, *size])
    assert result.exit_code == 2, result.output
    assert result.output == (
        f"error: size {size[0]} {size[1]}: an image has no {missing}; give both in pixels, "
        "or 0 0 for resolution gears\n"
    )


def test_a_std_whose_aipp_multiplier_is_beyond_float16_is_refused() -> None:
    """AIPP's var_reci_chn is a float16 (aclmdlSetAIPPPixelVarReci: [-65504, 65504])."""
    tiny = InputNormalization.from_mean_std(
        np.full(3, 0.5), np.array([1e-8, 0.5, 0.5]), swap_rb=True, layout="NCHW"
    )
    with pytest.raises(ConfigError, match=r"1 / \(255 \* std\) = 392157, beyond"):
        StaticAipp.from_normalization(tiny, 128, 128)
    with pytest.raises(ConfigError, match="var_reci_chn range of"):
        DynamicAippParams.from_normalization(tiny, (128, 128))


def test_a_std_whose_aipp_multiplier_is_below_float16_precision_is_refused() -> None:
    """A std of 1000 makes var_reci_chn 3.9e-6: a float16 subnormal, rounded by ~1 %."""
    huge = InputNormalization.from_mean_std(
        np.full(3, 0.5), np.array([0.5, 1000.0, 0.5]), swap_rb=True, layout="NCHW"
    )
    with pytest.raises(ConfigError, match=r"= 3.92157e-06, below 6.104e-05"):
        StaticAipp.from_normalization(huge, 128, 128)
    with pytest.raises(ConfigError, match="loses precision"):
        DynamicAippParams.from_normalization(huge, (128, 128))


def test_a_mean_outside_0_to_1_is_refused_for_aipp() -> None:
    """AIPP's min_chn (255 * mean) is documented in [0, 255] (aclmdlSetAIPPDtcPixelMin)."""
    for mean in (-1.0, 2.0):
        norm = InputNormalization.from_mean_std(
            np.full(3, mean), np.full(3, 0.5), swap_rb=True, layout="NCHW"
        )
        with pytest.raises(ConfigError, match="preprocess.mean: .* outside its min_chn range"):
            StaticAipp.from_normalization(norm, 128, 128)
        with pytest.raises(ConfigError, match="min_chn range"):
            DynamicAippParams.from_normalization(norm, (128, 128))


DEVICE = PluginConfig(kind="letterbox", normalize="device")


def test_a_model_s_static_aipp_must_be_what_the_letterbox_says(
    make_backend: MakeBackend, make_model: MakeModel
) -> None:
    """An .om built for another mean, std or color ran, and its detections silently
    degraded; acl.mdl.get_first_aipp_info reads the baked-in parameters back."""
    shape = {"input_shape": {"input": [4, 3, 128, 128]}}
    good = make_model("face_good", {**shape, "aipp": AIPP.model_dump()})
    stale = AIPP.model_copy(update={"min_chn_0": 0.0, "var_reci_chn_0": 1.0})
    bad = make_model("face_stale", {**shape, "aipp": stale.model_dump()})
    plain = make_model("face_plain", shape)
    backend = make_backend()
    with backend.load(ModelSpec("face", good, mode="async", preprocess=DEVICE)):
        pass
    with pytest.raises(ModelError, match=r"channel 0 offset \(mean \+ min\) 0, needs 127.5"):
        backend.load(ModelSpec("face", bad, mode="async", preprocess=DEVICE))
    with pytest.raises(ModelError, match="needs a model built with static AIPP .*it has none"):
        backend.load(ModelSpec("face", plain, mode="async", preprocess=DEVICE))
    bgr = PluginConfig(kind="letterbox", normalize="device", color="bgr")
    with pytest.raises(ModelError, match="rbuvSwapSwitch True, the letterbox needs False"):
        backend.load(ModelSpec("face", good, mode="async", preprocess=bgr))

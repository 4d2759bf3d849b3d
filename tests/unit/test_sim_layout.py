"""Laying out a config's models for the ACL simulator (``streamer.sim_layout``): the manifests
it derives from the real models and their tables, and every shipped config loading on the
simulator's ACL backend once laid out."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from streamer.cli import main
from streamer.config import Config, PluginConfig, load_config
from streamer.config_writer import write_config
from streamer.errors import ConfigError
from streamer.model_stages import load_chain
from streamer.runtime import open_backend
from streamer.sim_layout import sim_layout
from streamer.vision.aipp import letterbox_aipp
from streamer.vision.mtcnn import pnet_gears

ROOT = Path(__file__).resolve().parents[2]
SHIPPED = sorted(p.name for p in (ROOT / "configs").glob("*.toml"))
HOST, IN_MODEL, ON_DEVICE = (f'normalize = "{where}"' for where in ("host", "model", "device"))


def shipped(name: str, folder: Path, edit: dict[str, str] | None = None) -> Config:
    """``configs/<name>`` with each key of ``edit`` replaced by its value, loaded."""
    text = (ROOT / "configs" / name).read_text()
    for old, new in (edit or {}).items():
        assert old in text, old
        text = text.replace(old, new)
    path = folder / name
    path.write_text(text)
    return load_config(path)


def manifest(config: Config, stage: str) -> dict[str, Any]:
    """The manifest laid out for model ``stage`` of the laid-out ``config``."""
    path = next(m.path for m in config.models if m.name == stage)
    assert path is not None and path.is_absolute() and path.suffix == ".om"
    result: dict[str, Any] = json.loads(path.with_suffix(".acl.json").read_text())
    return result


def laid_out_table(table: PluginConfig | None) -> PluginConfig | None:
    """What the layout makes of a plug-in table: ``normalize = "model"`` (onnxruntime's
    in-graph rewrite) becomes ATC's counterpart, static AIPP; any other table is kept."""
    if table is None or table.params().get("normalize") != "model":
        return table
    aipp = {"aipp": "static"} if table.kind == "letterbox" else {}
    return PluginConfig(kind=table.kind, **{**table.params(), "normalize": "device", **aipp})


def load_on_simulator(config: Config) -> list[str]:
    """Every stage loaded (and its plug-ins checked) on the simulator's ACL backend, then
    closed: their names in chain order."""
    with open_backend(config.runtime) as backend:
        stages = load_chain(backend, config)
        for stage in reversed(stages):
            stage.close()
    return [stage.name for stage in stages]


@pytest.mark.parametrize("name", SHIPPED)
def test_every_shipped_config_loads_on_the_simulator_once_laid_out(
    name: str, tmp_path: Path, assets: dict[str, Path]
) -> None:
    original = load_config(ROOT / "configs" / name)
    laid_out = sim_layout(original, tmp_path)
    assert laid_out.runtime.backend == "acl-sim" and laid_out.runtime.options == {}
    for before, after in zip(original.models, laid_out.models, strict=True):
        assert after.asset is None and after.path == tmp_path.resolve() / f"{after.name}.om"
        assert (
            after.path.with_suffix(".onnx").read_bytes() == original.model_path(before).read_bytes()
        )
        tables = {
            "preprocess": laid_out_table(before.preprocess),
            "postprocess": laid_out_table(before.postprocess),
        }
        expected = before.model_copy(update=tables)
        assert after.model_copy(update={"path": None, "asset": before.asset}) == expected
    assert load_on_simulator(laid_out) == [m.name for m in laid_out.chain()]


def test_a_letterbox_model_gets_the_batch_gears_of_its_batch_table(
    tmp_path: Path, assets: dict[str, Path]
) -> None:
    default = shipped("default.toml", tmp_path, {IN_MODEL: HOST})  # no AIPP in the manifest
    expected = {"input_shape": {"input": [-1, 3, 128, 128]}, "input_format": "NCHW"}
    powers = sim_layout(default, tmp_path / "powers")
    assert manifest(powers, "face") == {**expected, "dynamic_batch_size": [1, 2, 4, 8]}
    listed = shipped("default.toml", tmp_path, {"gears = []": "gears = [2, 6]"})
    assert manifest(sim_layout(listed, tmp_path / "listed"), "face")["dynamic_batch_size"] == [2, 6]
    given = sim_layout(default, tmp_path / "given", batch_sizes=(16, 1, 4))
    assert manifest(given, "face")["dynamic_batch_size"] == [1, 4, 16]


def test_queue_mode_lays_out_a_static_batch(tmp_path: Path, assets: dict[str, Path]) -> None:
    split = load_config(ROOT / "configs" / "blazeface_split.toml")
    queue = sim_layout(split, tmp_path / "max", mode="queue")
    assert [m.mode for m in queue.models] == ["queue", "queue"]
    assert manifest(queue, "backbone") == {
        "input_shape": {"input": [8, 3, 128, 128]},
        "input_format": "NCHW",
    }
    assert manifest(queue, "head") == {
        "input_shape": {"activation_11": [8, 88, 16, 16], "activation_16": [8, 96, 8, 8]}
    }
    four = sim_layout(split, tmp_path / "four", mode="queue", batch_sizes=(4,))
    assert manifest(four, "head")["input_shape"]["activation_16"] == [4, 96, 8, 8]
    assert load_on_simulator(four) == ["backbone", "head"]  # queue mode: static shapes only
    with pytest.raises(ConfigError, match="'backbone': mode 'queue'.*gears \\[1, 2\\]"):
        sim_layout(split, tmp_path / "gears", mode="queue", batch_sizes=(1, 2))


def test_a_tensor_stage_runs_its_upstream_s_batch_sizes(
    tmp_path: Path, assets: dict[str, Path]
) -> None:
    split = shipped("blazeface_split.toml", tmp_path, {"max_size = 8": "max_size = 4"})
    laid_out = sim_layout(split, tmp_path / "models")
    assert manifest(laid_out, "head") == {
        "input_shape": {"activation_11": [-1, 88, 16, 16], "activation_16": [-1, 96, 8, 8]},
        "dynamic_batch_size": [1, 2, 4],
    }
    mixed = shipped(
        "blazeface_split.toml",
        tmp_path,
        {'input = "backbone:tensor"': 'input = "backbone:tensor"\nmode = "queue"'},
    )
    with pytest.raises(ConfigError, match="'head': mode 'queue'.*gears \\[1, 2, 4, 8\\]"):
        sim_layout(mixed, tmp_path / "mixed")


def test_mtcnn_s_nets_are_nhwc_and_p_net_runs_its_pyramid_as_resolution_gears(
    tmp_path: Path, assets: dict[str, Path]
) -> None:
    mtcnn = load_config(ROOT / "configs" / "mtcnn.toml")
    laid_out = sim_layout(mtcnn, tmp_path / "models")
    gears = [[gear.width, gear.height] for gear in pnet_gears(480, 640)]
    assert manifest(laid_out, "pnet") == {
        "input_shape": {"input_1": [1, -1, -1, 3]},
        "input_format": "NHWC",
        "dynamic_image_size": gears,
    }
    assert manifest(laid_out, "rnet") == {
        "input_shape": {"input_2": [-1, 24, 24, 3]},
        "input_format": "NHWC",
        "dynamic_batch_size": [1, 2, 4, 8, 16],
    }
    with pytest.raises(ConfigError, match="'pnet': mode 'queue'.*resolution gears"):
        sim_layout(mtcnn, tmp_path / "queue", mode="queue")


def test_device_side_normalisation_gets_the_stage_s_aipp(
    tmp_path: Path, assets: dict[str, Path]
) -> None:
    device = {IN_MODEL: ON_DEVICE}
    mtcnn = sim_layout(shipped("mtcnn.toml", tmp_path, {HOST: ON_DEVICE}), tmp_path / "mtcnn")
    sizes = {
        net: manifest(mtcnn, net)["aipp"]["src_image_size_w"] for net in ("pnet", "rnet", "onet")
    }
    assert sizes == {"pnet": 0, "rnet": 24, "onet": 48}
    assert load_on_simulator(mtcnn) == ["pnet", "rnet", "onet"]
    static = shipped("default.toml", tmp_path, device)
    face = manifest(sim_layout(static, tmp_path / "static"), "face")
    assert face["aipp"] == letterbox_aipp(static, "face").model_dump()
    dynamic = shipped(
        "default.toml",
        tmp_path,
        {**device, 'aipp = "static"': 'aipp = "dynamic"'},
    )
    laid_out = sim_layout(dynamic, tmp_path / "dynamic", batch_sizes=(1, 16))
    aipp = manifest(laid_out, "face")["aipp"]
    assert aipp["aipp_mode"] == "dynamic" and aipp["max_src_image_size"] == 16 * 128 * 128 * 3
    assert load_on_simulator(laid_out) == ["face"]


@pytest.mark.parametrize(
    ("name", "to_model", "to_device"),
    [
        ("default.toml", {}, {IN_MODEL: ON_DEVICE}),
        ("mtcnn.toml", {HOST: IN_MODEL}, {HOST: ON_DEVICE}),
    ],
)
def test_normalisation_in_the_model_is_laid_out_as_static_aipp(
    name: str,
    to_model: dict[str, str],
    to_device: dict[str, str],
    tmp_path: Path,
    assets: dict[str, Path],
) -> None:
    """onnxruntime composes ``normalize = "model"`` into the graph and ACL refuses it; the
    layout gives the ``.om`` what ATC builds for it, static AIPP, exactly as for the same
    config saying ``normalize = "device"`` (the shipped default says "model")."""
    laid_out = []
    for edit in (to_model, to_device):
        folder = tmp_path / str(len(laid_out))
        folder.mkdir()
        laid_out.append(sim_layout(shipped(name, folder, edit), folder / "layout"))
    from_model, from_device = laid_out
    for stage in from_model.chain():
        assert "aipp" in manifest(from_model, stage.name)
        assert manifest(from_model, stage.name) == manifest(from_device, stage.name)
    for model, device in zip(from_model.models, from_device.models, strict=True):
        assert model.model_copy(update={"path": None}) == device.model_copy(update={"path": None})
    assert load_on_simulator(from_model) == [stage.name for stage in from_model.chain()]


def test_queue_mode_with_configured_gears_lays_out_a_config_that_loads(
    tmp_path: Path, assets: dict[str, Path]
) -> None:
    """The static batch of queue mode is max_size: gears [3, 5] stayed in the config, which
    then did not load ("configured batch gears [3] are not among the model's gears [5]")."""
    geared = shipped(
        "default.toml", tmp_path, {"max_size = 8": "max_size = 5", "gears = []": "gears = [3, 5]"}
    )
    laid_out = sim_layout(geared, tmp_path / "queue", mode="queue")
    assert laid_out.models[0].batch.gears == (5,)
    assert load_on_simulator(laid_out) == ["face"]


def test_what_cannot_be_laid_out_is_a_config_error(tmp_path: Path, assets: dict[str, Path]) -> None:
    missing = shipped(
        "default.toml", tmp_path, {'asset = "blazeface_short_range"': 'path = "x.om"'}
    )
    with pytest.raises(ConfigError, match=re.escape(f"'face': no ONNX file {tmp_path}/x.onnx")):
        sim_layout(missing, tmp_path / "missing")
    pnet = str(assets["mtcnn_pnet"])
    free = shipped(
        "default.toml", tmp_path, {'asset = "blazeface_short_range"': f'path = "{pnet}"'}
    )
    with pytest.raises(ConfigError, match=r"dims \[\('input_1', 1\), \('input_1', 2\)\] .* free"):
        sim_layout(free, tmp_path / "free")
    device = {IN_MODEL: ON_DEVICE}
    pad = shipped("default.toml", tmp_path, {**device, "pad_value = 0": 'pad_value = "0"'})
    with pytest.raises(
        ConfigError, match=re.escape("models[0] ('face').preprocess.pad_value: Input should be")
    ):
        sim_layout(pad, tmp_path / "pad")
    dynamic = {**device, 'aipp = "static"': 'aipp = "dynamic"'}
    wide = shipped("default.toml", tmp_path, {**dynamic, "std = [0.5, 0.5, 0.5]": "std = 1000"})
    with pytest.raises(ConfigError, match="where its float16 var_reci_chn loses precision"):
        sim_layout(wide, tmp_path / "wide")  # it said "run it", and check then refused it
    aipp = shipped("default.toml", tmp_path, dynamic)
    with pytest.raises(ConfigError, match="mode 'queue' cannot run a model with dynamic AIPP"):
        sim_layout(aipp, tmp_path / "aipp", mode="queue")  # it laid out what check refused
    pyramid = shipped("mtcnn.toml", tmp_path, {"min_face_px = 20.0": 'min_face_px = "20"'})
    with pytest.raises(
        ConfigError, match=re.escape("models[0] ('pnet').postprocess.min_face_px: Input should be")
    ):
        sim_layout(pyramid, tmp_path / "pyramid")


def test_an_acl_config_keeps_its_runtime_options(tmp_path: Path, assets: dict[str, Path]) -> None:
    acl = {"intra_op_threads = 1": "queue_depth = 4", 'backend = "onnxruntime"': 'backend = "acl"'}
    laid_out = sim_layout(shipped("face_classifier.toml", tmp_path, acl), tmp_path / "models")
    assert laid_out.runtime.backend == "acl-sim" and laid_out.runtime.options == {"queue_depth": 4}
    written = write_config(laid_out, tmp_path / "written.toml")
    assert written.model_dump() == laid_out.model_dump()


def test_the_command_writes_the_layout_and_the_config(
    tmp_path: Path, assets: dict[str, Path]
) -> None:
    config = ROOT / "configs" / "blazeface_onet.toml"
    out = tmp_path / "sim"
    args = ["models", "sim-layout", "--config", str(config), "--out", str(out), "--mode", "sync"]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0, result.output
    written = load_config(out / "blazeface_onet.toml")
    assert written.runtime.backend == "acl-sim" and [m.mode for m in written.models] == ["sync"] * 2
    assert sorted(p.name for p in out.iterdir()) == [
        "blazeface_onet.toml",
        "face.acl.json",
        "face.onnx",
        "onet.acl.json",
        "onet.onnx",
    ]
    assert f"streamer run --config {out / 'blazeface_onet.toml'}" in result.output
    copy = tmp_path / "blazeface_onet.toml"
    copy.write_text(config.read_text())
    args = ["models", "sim-layout", "--config", str(copy), "--out", str(tmp_path)]
    refused = CliRunner().invoke(main, args)
    assert refused.exit_code == 2 and "would overwrite" in refused.output


def test_every_stage_is_checked_before_a_layout_or_an_aipp_config(
    tmp_path: Path, assets: dict[str, Path]
) -> None:
    """An R-Net parameter of the wrong type, and a preprocess table on a crops stage (which
    has none), are refused by sim-layout and by `models aipp` for any stage."""
    for edit, says in [
        (
            {"score_threshold = 0.7\n": 'score_threshold = "0.7"\n'},
            "models[1] ('rnet').postprocess",
        ),
        (
            {'input = "pnet:crops"': 'input = "pnet:crops"\npreprocess = { kind = "letterbox" }'},
            "models[1] ('rnet').preprocess: a stage fed through the crops adapter",
        ),
    ]:
        config = shipped("mtcnn.toml", tmp_path, edit)
        with pytest.raises(ConfigError, match=re.escape(says)):
            sim_layout(config, tmp_path / "layout")
        args = ["models", "aipp", "--config", str(tmp_path / "mtcnn.toml"), "--model", "onet"]
        refused = CliRunner().invoke(main, args)
        assert refused.exit_code == 2 and says in refused.output, refused.output

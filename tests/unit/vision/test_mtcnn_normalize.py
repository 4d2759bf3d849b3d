"""Where MTCNN's input normalisation happens (``normalize``): the pixels each place gets, the
in-graph rewrite (onnxruntime) and static AIPP (the simulator) on the real nets, the checks
at start-up, and the AIPP config ``streamer models aipp`` writes for the stages."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import cv2
import numpy as np
import pytest
from click.testing import CliRunner

from streamer.cli import main
from streamer.config import PluginConfig, load_config
from streamer.errors import ConfigError
from streamer.runtime.acl.aipp_static import StaticAipp
from streamer.runtime.acl.sim.image import load_image
from streamer.runtime.base import ModelSpec
from streamer.runtime.mtcnn_keys import MTCNN_KINDS, MTCNN_NORMALIZATION
from streamer.runtime.onnx import open_session, session_model_info
from streamer.sim_layout import sim_layout
from streamer.vision.crops import crop
from streamer.vision.mtcnn import (
    Cascade,
    Infer,
    ONet,
    ONetParams,
    PNet,
    PNetParams,
    RNet,
    RNetParams,
    to_tensor,
)
from streamer.vision.mtcnn.layout import PIXEL_PAD, Normalize, to_input
from streamer.vision.registry import PluginParams
from streamer.vision.stages import ITEM_STAGES

ROOT = Path(__file__).resolve().parents[3]
NETS = ("pnet", "rnet", "onet")
CANVAS = (144, 176)  # carphone's frame size: its P-Net gears are small


def cascade(normalize: Normalize) -> Cascade:
    return Cascade(
        PNet(PNetParams(max_size=CANVAS, normalize=normalize)),
        RNet(RNetParams(normalize=normalize)),
        ONet(ONetParams(normalize=normalize)),
    )


def test_to_input_per_place() -> None:
    images = np.random.default_rng(0).integers(0, 256, (2, 3, 5, 3), np.uint8)
    host = to_input(images, "host")
    assert host.dtype == np.float32 and np.array_equal(host, to_tensor(images))
    model = to_input(images, "model")
    assert model.dtype == np.uint8 and np.array_equal(model, images)
    device = to_input(images, "device")
    assert device.shape == (2, 5, 3, 3) and device.flags.c_contiguous
    assert np.array_equal(device[1, 4, 2], images[1, 2, 4])  # (x, y) ↔ (y, x), still BGR


def test_pnet_pixel_gears_hold_the_resized_image_and_the_pad() -> None:
    image = np.random.default_rng(0).integers(0, 256, (100, 150, 3), np.uint8)
    model = PNet(PNetParams(max_size=CANVAS, normalize="model"))
    tensors, transforms = model.prepare(image)
    first, t = tensors[0], transforms[0]
    gear = model.gears[0]
    assert first.dtype == np.uint8 and first.shape == (gear.height, gear.width, 3)
    resized = cv2.resize(image, (90, 60), interpolation=cv2.INTER_AREA)
    assert (t.resized_width, t.resized_height) == (90, 60)
    assert np.array_equal(first[:60, :90], resized)
    assert (first[60:] == PIXEL_PAD).all() and (first[:, 90:] == PIXEL_PAD).all()
    device, _ = PNet(PNetParams(max_size=CANVAS, normalize="device")).prepare(image)
    assert [d.shape for d in device] == [g.input_shape for g in model.gears[: len(device)]]
    assert all(np.array_equal(d, m.swapaxes(0, 1)) for d, m in zip(device, tensors, strict=True))


def test_refine_crops_are_pixels_in_the_place_s_layout(astronaut: np.ndarray) -> None:
    found = [{"box": [170.0, 50.0, 100.0, 120.0]}, {"box": [-10.0, 400.0, 60.0, 60.0]}]
    crops, _ = crop(astronaut, np.array([d["box"] for d in found]), (48, 48), square=True)
    model, _ = ONet(ONetParams(normalize="model")).prepare(astronaut, found)
    device, _ = ONet(ONetParams(normalize="device")).prepare(astronaut, found)
    assert np.array_equal(model, crops) and np.array_equal(device, crops.swapaxes(1, 2))


@pytest.fixture(scope="module")
def stills(assets: dict[str, Path], carphone_frames: list[np.ndarray]) -> list[np.ndarray]:
    """Every tenth carphone frame and the four test images, as read (BGR uint8)."""
    names = ("astronaut.png", "grace_hopper.jpg", "coffee.png", "chelsea.png")
    return [*carphone_frames[::10], *(cv2.imread(str(assets[n])) for n in names)]


def onnx_infer(assets: dict[str, Path], normalize: Normalize) -> Infer:
    """The three nets on onnxruntime, loaded as the daemon loads an MTCNN stage."""
    sessions = {
        net: open_session(
            ModelSpec(
                net,
                assets[f"mtcnn_{net}"],
                preprocess=PluginConfig(kind=f"mtcnn_{net}", normalize=normalize),
            ),
            {"intra_op_threads": 1},
        )
        for net in NETS
    }

    def run(stage: str, inputs: np.ndarray) -> Sequence[np.ndarray]:
        session = sessions[stage]
        outputs: list[np.ndarray] = session.run(None, {session.get_inputs()[0].name: inputs})
        return outputs

    return run


def simulated_infer(folder: Path) -> Infer:
    """The three nets as the simulator runs ``.om`` files built with MTCNN's static AIPP, laid
    out from configs/mtcnn.toml with ``normalize = "device"`` on the test's canvas: P-Net with
    its pyramid gears as resolution gears (source size 0), R-Net and O-Net with batch gears."""
    text = (ROOT / "configs" / "mtcnn.toml").read_text()
    text = text.replace("max_size = [480, 640]", f"max_size = {list(CANVAS)}")
    (folder / "mtcnn.toml").write_text(text.replace('normalize = "host"', 'normalize = "device"'))
    config = sim_layout(load_config(folder / "mtcnn.toml"), folder / "models", batch_sizes=(1, 32))
    images = {}
    for stage in config.models:
        assert stage.path is not None
        images[stage.name] = load_image(stage.path)
        assert images[stage.name].inputs[0].dtype == np.uint8

    def run(stage: str, inputs: np.ndarray) -> Sequence[np.ndarray]:
        return images[stage].run([inputs])

    return run


def test_in_graph_and_aipp_give_the_host_detections(
    assets: dict[str, Path], stills: list[np.ndarray], tmp_path: Path
) -> None:
    runs: dict[Normalize, Infer] = {
        "host": onnx_infer(assets, "host"),
        "model": onnx_infer(assets, "model"),
        "device": simulated_infer(tmp_path),
    }
    host, model, device = ([cascade(n).detect(f, run) for f in stills] for n, run in runs.items())
    assert sum(len(d) for d in host) == len(stills) - 2  # one face each; none on coffee, cat
    assert model == host  # the same float32 values: bit-identical detections
    assert device == host


def onnx_infer_info(assets: dict[str, Path], net: str, normalize: Normalize) -> Any:
    """The ModelInfo of ``net`` as the onnxruntime backend loads it for ``normalize``."""
    table = PluginConfig(kind=f"mtcnn_{net}", normalize=normalize)
    spec = ModelSpec(net, assets[f"mtcnn_{net}"], preprocess=table)
    return session_model_info(net, open_session(spec, {}))


def test_stages_refuse_a_model_that_does_not_take_what_they_send(assets: dict[str, Path]) -> None:
    plain = onnx_infer_info(assets, "pnet", "host")
    rewritten = onnx_infer_info(assets, "pnet", "model")
    pnet = PluginConfig(kind="mtcnn_pnet", normalize="model")
    assert ITEM_STAGES.create(pnet, rewritten, "models[0].postprocess") is not None
    with pytest.raises(ConfigError, match="normalize: 'model' sends uint8.*float32"):
        ITEM_STAGES.create(pnet, plain, "models[0].postprocess")
    device = PluginConfig(kind="mtcnn_onet", normalize="device")
    with pytest.raises(ConfigError, match="static AIPP.*'input_3'"):
        ITEM_STAGES.create(device, onnx_infer_info(assets, "onet", "host"), "models[2]")
    host = PluginConfig(kind="mtcnn_pnet")
    with pytest.raises(ConfigError, match="normalize: 'host' sends float32.*uint8"):
        ITEM_STAGES.create(host, rewritten, "models[0].postprocess")
    classify = PluginConfig(kind="mtcnn_classify", normalize="model")
    with pytest.raises(ConfigError, match="normalize: 'model'"):
        ITEM_STAGES.create(classify, onnx_infer_info(assets, "rnet", "host"), "models[0]")


def test_the_backends_know_every_item_stage() -> None:
    assert set(ITEM_STAGES.names()) == MTCNN_KINDS


@pytest.mark.parametrize("kind", sorted(MTCNN_KINDS))
def test_every_mtcnn_stage_takes_normalize(kind: str) -> None:
    params: PluginParams = ITEM_STAGES.params(PluginConfig(kind=kind, normalize="device"), "m")
    assert params.normalize == "device"  # type: ignore[attr-defined]
    with pytest.raises(ConfigError, match="normalize"):
        ITEM_STAGES.params(PluginConfig(kind=kind, normalize="gpu"), "m")


def test_models_aipp_prints_mtcnn_s_static_aipp(assets: dict[str, Path]) -> None:
    config = str(ROOT / "configs" / "mtcnn.toml")
    expected = StaticAipp.from_normalization(MTCNN_NORMALIZATION, 0, 0)
    assert (expected.min_chn_0, expected.var_reci_chn_2) == (127.5, 0.0078125)
    assert expected.rbuv_swap_switch and not (expected.crop or expected.padding)
    for net, size in (("pnet", 0), ("rnet", 24), ("onet", 48)):
        result = CliRunner().invoke(main, ["models", "aipp", "--config", config, "--model", net])
        assert result.exit_code == 0, result.output
        sized = {"src_image_size_w": size, "src_image_size_h": size}
        assert result.output == expected.model_copy(update=sized).to_config()

"""What a reload takes in: a model file deployed again at its path is loaded again, and the
settings a reload leaves for a restart are checked as `streamer check` checks them."""

from __future__ import annotations

import os
import re
import shutil
import threading
from pathlib import Path

import pytest

from streamer.bench.bench_config import free_port
from streamer.config import load_config
from streamer.pipeline import Pipeline

pytestmark = pytest.mark.timeout(120)

ROOT = Path(__file__).resolve().parents[2]


def write_config(tmp_path: Path, name: str, ingress_port: int, egress_port: int) -> Path:
    """The default config on the given ports, its model the file ``face.onnx`` beside it."""
    text = (ROOT / "configs" / "default.toml").read_text()
    text = text.replace('"127.0.0.1:9555"', '""')
    text = re.sub(r"127\.0\.0\.1:5555\b", f"127.0.0.1:{ingress_port}", text)
    text = re.sub(r"127\.0\.0\.1:5556\b", f"127.0.0.1:{egress_port}", text)
    text = text.replace('asset = "blazeface_short_range"', 'path = "face.onnx"')
    path = tmp_path / name
    path.write_text(text)
    return path


def deploy(tmp_path: Path, model: Path) -> None:
    """Put ``model`` at ``face.onnx`` as a deployment does: written aside, then renamed."""
    shutil.copyfile(model, tmp_path / "face.onnx.new")
    os.replace(tmp_path / "face.onnx.new", tmp_path / "face.onnx")


def input_side(pipeline: Pipeline) -> int:
    """The side of the model's square input, pixels (128 short range, 192 full range): the
    width of its (B, H, W, 3) uint8 pixels, as ``normalize = "model"`` feeds it."""
    return int(pipeline.models[0].info.inputs[0].shape[-2])


def test_a_model_deployed_again_at_its_path_is_reloaded(
    tmp_path: Path, short_range_model: Path, full_range_model: Path
) -> None:
    """The running model's file was stat'ed again at each SIGHUP, so a file replaced at the
    same path compared equal to itself (`reload_unchanged`): a deployment needed a
    restart."""
    deploy(tmp_path, short_range_model)
    config = write_config(tmp_path, "daemon.toml", free_port(), free_port())
    pipeline = Pipeline.load(load_config(config))
    try:
        pipeline.start()
        running = pipeline.models[0]
        assert pipeline.reload(load_config(config), threading.Event(), None)
        assert pipeline.models[0] is running  # the same file: nothing to load
        deploy(tmp_path, full_range_model)
        assert pipeline.reload(load_config(config), threading.Event(), None)
        assert input_side(pipeline) == 192
        assert pipeline.reload(load_config(config), threading.Event(), None)
        assert input_side(pipeline) == 192
    finally:
        pipeline.stop(5.0)
        pipeline.close()


def test_a_reload_rejects_settings_the_next_start_would_refuse(
    tmp_path: Path, short_range_model: Path
) -> None:
    """An ingress on port 99999 left for a restart was reported as needing one and the
    models were applied, though `streamer check` and the restart refuse the file."""
    deploy(tmp_path, short_range_model)
    ingress, egress = free_port(), free_port()
    config = write_config(tmp_path, "daemon.toml", ingress, egress)
    pipeline = Pipeline.load(load_config(config))
    try:
        pipeline.start()
        text = config.read_text().replace("max_size = 8 ", "max_size = 4 ")
        bad = tmp_path / "bad.toml"
        bad.write_text(text.replace(f"127.0.0.1:{ingress}", "127.0.0.1:99999"))
        assert not pipeline.reload(load_config(bad), threading.Event(), None)
        assert pipeline.config.models[0].batch.max_size == 8
        moved = tmp_path / "moved.toml"
        moved.write_text(text.replace(f"127.0.0.1:{ingress}", f"127.0.0.1:{free_port()}"))
        assert not pipeline.reload(load_config(moved), threading.Event(), None)  # restart
        assert pipeline.config.models[0].batch.max_size == 4
    finally:
        pipeline.stop(5.0)
        pipeline.close()

"""Every shipped config (configs/*.toml) laid out for the ACL simulator by ``streamer models
sim-layout`` and run through the daemon on ``acl-sim``: a handful of frames each get their
results (a frame in which a chain's first stage finds nothing ends there); the detections of
the BlazeFace configs, the single model and its split into backbone → head, equal
onnxruntime's."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from streamer.config import load_config
from streamer.transport.protocol import encode_frame

from .conftest import Daemon, shipped_config
from .test_device_preprocess import assert_same_detections

ROOT = Path(__file__).resolve().parents[2]
SHIPPED = sorted(p.name for p in (ROOT / "configs").glob("*.toml"))
COMPARED = ("default.toml", "blazeface_split.toml")
"""The configs whose detections are compared with onnxruntime's."""


@pytest.fixture(scope="module")
def frames(stills: list[np.ndarray], carphone_frames: list[np.ndarray]) -> list[np.ndarray]:
    """Astronaut, chelsea, coffee and grace_hopper, and two carphone frames."""
    return [*stills, *carphone_frames[:2]]


def results(
    config: tuple[Path, int, int, int], frames: list[np.ndarray], connect: Any
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Each frame's result (sent raw) from a daemon on ``config``, and the daemon's logs."""
    daemon = Daemon(*config)
    try:
        daemon.wait_event("ready")
        client = connect(daemon)
        for seq, frame in enumerate(frames):
            client.send_parts(encode_frame("still", seq, frame, encoding="raw"))
        published = sorted(client.collect(len(frames)), key=lambda r: r["seq"])
        assert daemon.stop() == 0
    finally:
        daemon.close()
    assert [r["seq"] for r in published] == list(range(len(frames)))
    return published, daemon.logs


def lay_out(name: str, folder: Path) -> tuple[Path, int, int, int]:
    """``configs/<name>`` on free ports, laid out by the command into ``folder/sim``: the
    config it wrote, and the ports."""
    path, ingress, egress, http = shipped_config(name, folder)
    out = folder / "sim"
    command = [sys.executable, "-m", "streamer", "models", "sim-layout", "--config", str(path)]
    done = subprocess.run(
        [*command, "--out", str(out)], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"run it: streamer run --config {out / name}" in done.stdout
    return out / name, ingress, egress, http


@pytest.mark.parametrize("name", SHIPPED)
def test_every_shipped_config_runs_on_the_simulator_once_laid_out(
    name: str, tmp_path: Path, assets: dict[str, Path], frames: list[np.ndarray], connect: Any
) -> None:
    config = lay_out(name, tmp_path / "acl-sim")
    stages = [m.name for m in load_config(config[0]).chain()]
    simulated, logs = results(config, frames, connect)
    loaded = {e["model"] for e in logs if e.get("event") == "acl_model_loaded"}
    assert loaded == set(stages)
    assert all(r["error"] is None and r["model"] in stages for r in simulated), simulated
    assert simulated[0]["model"] == stages[-1]  # the astronaut went through every stage
    if name == "face_classifier.toml":
        assert all({"score", "is_face"} <= r["face"].keys() for r in simulated)
    else:
        assert len(simulated[0]["detections"]) == 1  # the astronaut
    if name in COMPARED:
        onnxruntime, _ = results(shipped_config(name, tmp_path), frames, connect)
        assert_same_detections(
            [r["detections"] for r in onnxruntime], [r["detections"] for r in simulated]
        )

"""SIGHUP replaces the whole chain of models, whatever its length, without losing a frame; a
chain that fails to load leaves the running one serving."""

from __future__ import annotations

import signal
from pathlib import Path
from typing import Any

import cv2
import numpy as np

from streamer.transport.protocol import encode_frame

from .conftest import Client, Daemon, shipped, shipped_text


def ports_of(daemon: Daemon) -> tuple[int, int, int]:
    """The daemon's ingress, egress and HTTP ports."""
    uris = (daemon.ingress, daemon.egress, daemon.http)
    ingress, egress, http = (int(uri.rsplit(":", 1)[1]) for uri in uris)
    return ingress, egress, http


def full_range(text: str) -> str:
    """The default config with BlazeFace full range as one model named ``face_full``."""
    return text.replace('name = "face"', 'name = "face_full"').replace(
        "blazeface_short_range", "blazeface_full_range"
    )


def test_sighup_replaces_two_stages_by_one_then_by_two_others(
    tmp_path: Path, connect: Any, astronaut: np.ndarray
) -> None:
    daemon = shipped("blazeface_split.toml", tmp_path)
    client: Client = connect(daemon)
    jpeg = cv2.imencode(".jpg", astronaut)[1].tobytes()
    ports = ports_of(daemon)
    reloads = {
        60: shipped_text("default.toml", ports, full_range),  # 2 stages (tensor) → 1
        150: shipped_text("blazeface_onet.toml", ports),  # 1 → 2 stages (crops)
    }
    for seq in range(240):
        client.send_parts(encode_frame("cam", seq, jpeg, encoding="jpeg"))
        if seq in reloads:
            daemon.config_path.write_text(reloads[seq])
            daemon.process.send_signal(signal.SIGHUP)
            daemon.wait_event("reloaded", 60)
    results = client.collect(240)
    assert [r["seq"] for r in results] == list(range(240))
    models = [r["model"] for r in results]
    first, second = models.index("face_full"), models.index("onet")
    assert first <= 61 and first < second <= 151  # frames sent after "reloaded" run on it
    assert set(models[:first]) <= {"head"} and set(models[first:second]) == {"face_full"}
    assert set(models[second:]) == {"onet"}
    assert all(r["error"] is None and len(r["detections"]) == 1 for r in results)
    assert all(r["detections"][0]["onet"] is not None for r in results[second:])
    assert daemon.stop() == 0
    final = daemon.final_counts()
    assert final["published"] == final["received"]
    assert [e["models"] for e in daemon.logs if e.get("event") == "reloaded"] == [
        ["face_full"],
        ["face", "onet"],
    ]


def test_sighup_with_a_chain_that_does_not_fit_keeps_the_running_one(
    tmp_path: Path, connect: Any, astronaut: np.ndarray
) -> None:
    daemon = shipped("blazeface_split.toml", tmp_path)
    client: Client = connect(daemon)
    text = daemon.config_path.read_text()
    swapped = 'input = "backbone:tensor:activation_11=activation_16,activation_16=activation_11"'
    daemon.config_path.write_text(text.replace('input = "backbone:tensor"', swapped))
    daemon.process.send_signal(signal.SIGHUP)
    rejected = daemon.wait_event("reload_rejected", 60)
    assert "stage 'backbone' output 'activation_11' [-1, 88, 16, 16]" in rejected["error"]
    assert "stage 'head' input 'activation_16' [-1, 96, 8, 8]" in rejected["error"]
    jpeg = cv2.imencode(".jpg", astronaut)[1].tobytes()
    client.send_parts(encode_frame("cam", 0, jpeg, encoding="jpeg"))
    (result,) = client.collect(1)
    assert result["model"] == "head" and len(result["detections"]) == 1
    assert daemon.stop() == 0

"""The ACL backend on its simulator gives the onnxruntime backend's detections, in every mode."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import cv2
import pytest

from streamer.clients.producer import produce
from streamer.runtime.acl.constants import AclCode
from streamer.transport.protocol import encode_frame

from .conftest import (
    BACKENDS,
    Client,
    Daemon,
    Edit,
    backend_settings,
    shipped_config,
    streamer_check,
    to_acl_sim,
)


def carphone_detections(start_daemon: Any, connect: Any, settings: dict[str, Any]) -> list[Any]:
    daemon = start_daemon(**settings)
    client: Client = connect(daemon)
    produce("carphone.mp4", daemon.ingress, source="carphone", encoding="raw")
    results = client.collect(121)
    assert daemon.stop() == 0
    assert [r["seq"] for r in results[:-1]] == list(range(120))
    return [r["detections"] for r in results[:-1]]


@pytest.mark.parametrize("name", [b for b in BACKENDS if b != "onnxruntime"])
def test_detections_match_onnxruntime(
    name: str, start_daemon: Any, connect: Any, tmp_path: Path, assets: dict[str, Path]
) -> None:
    reference = carphone_detections(start_daemon, connect, {})
    settings = backend_settings(name, assets["blazeface_short_range"], tmp_path / "models")
    simulated = carphone_detections(start_daemon, connect, settings)
    for expected, got in zip(reference, simulated, strict=True):
        assert len(expected) == len(got)
        for a, b in zip(expected, got, strict=True):
            assert abs(a["score"] - b["score"]) <= 2e-4  # 1e-4 plus the 4-decimal rounding
            assert max(abs(x - y) for x, y in zip(a["box"], b["box"], strict=True)) <= 0.02


def test_two_dynamic_kinds_fail_at_start(tmp_path: Path, assets: dict[str, Path]) -> None:
    """ATC allows one dynamic option per model; such a model is refused before any frame."""
    settings = backend_settings("acl-sim-async", assets["blazeface_short_range"], tmp_path)
    model = settings["model_path"]
    model.with_suffix(".acl.json").write_text(
        json.dumps(
            {
                "input_shape": {"input": [-1, 3, -1, -1]},
                "dynamic_batch_size": [1, 2, 4, 8],
                "dynamic_image_size": [[128, 128], [192, 192]],
            }
        )
    )
    root = Path(__file__).resolve().parents[2]
    text = (root / "configs" / "default.toml").read_text()
    text = to_acl_sim(text).replace('normalize = "model"', 'normalize = "host"')  # or AIPP
    text = text.replace('asset = "blazeface_short_range"', f'path = "{model}"')
    config = tmp_path / "both.toml"
    config.write_text(text)
    result = streamer_check(config)
    assert result.returncode == 2, result.stdout + result.stderr
    assert "model 'face'" in result.stderr
    assert "mutually exclusive" in result.stdout + result.stderr


def test_findings_are_logged_once_before_stopped(
    start_daemon: Any, tmp_path: Path, assets: dict[str, Path]
) -> None:
    """A release that fails (an injected ``acl.finalize`` failure) leaves its resource
    behind: the simulator's finding says so once, before the daemon's ``stopped`` line,
    though the daemon closes its pipeline twice (as it stops, then on its way out)."""
    settings = backend_settings("acl-sim-async", assets["blazeface_short_range"], tmp_path)
    code = int(AclCode.ERROR_INVALID_PARAM)
    sim = f'[runtime.options.sim]\nfail_calls = {{"acl.finalize" = {code}}}'
    daemon = start_daemon(**settings, runtime_extra=sim)
    assert daemon.stop() == 1, "a failed release exits 1"
    events = [e["event"] for e in daemon.logs]
    assert events.count("acl_sim_resources_left") == 1, events
    assert events.index("acl_sim_resources_left") < events.index("stopped")


def mtcnn_on(backend: str, folder: Path, edit: Edit = lambda text: text) -> tuple[Path, int, ...]:
    """configs/mtcnn.toml, edited, on free ports (:func:`shipped_config`); on ``acl-sim`` its
    nets laid out as ATC builds them (:func:`streamer.sim_layout.sim_layout`): P-Net with
    ``--input_format=NHWC --dynamic_image_size`` = its pyramid gears (batch 1), R-Net and
    O-Net with ``--dynamic_batch_size=1,2,4,8,16``."""
    return shipped_config("mtcnn.toml", folder, edit, {} if backend == "acl-sim" else None)


def mtcnn_faces(
    backend: str,
    folder: Path,
    connect: Any,
    stills: dict[str, Any],
    edit: Edit = lambda text: text,
) -> tuple[dict[str, list[dict[str, Any]]], list[dict[str, Any]]]:
    """The detections of each still image through the MTCNN chain on ``backend`` (its config
    text changed by ``edit`` first), and the daemon's log events."""
    daemon = Daemon(*mtcnn_on(backend, folder, edit))
    try:
        daemon.wait_event("ready")
        client: Client = connect(daemon)
        for name, image in stills.items():
            png = cv2.imencode(".png", image)[1].tobytes()
            client.send_parts(encode_frame(name, 0, png, encoding="png"))
        results = {r["source"]: r for r in client.collect(len(stills))}
        assert daemon.stop() == 0
    finally:
        daemon.close()
    assert all(r["error"] is None for r in results.values()), results
    return {name: results[name]["detections"] for name in stills}, daemon.logs


def test_mtcnn_with_pnet_resolution_gears_matches_onnxruntime(
    connect: Any,
    tmp_path: Path,
    assets: dict[str, Path],
    astronaut: Any,
    coffee: Any,
    carphone_frames: list[Any],
) -> None:
    """Every pyramid level of P-Net runs at its own ``--dynamic_image_size`` gear (NHWC, H and
    W swapped), a portrait frame included; the faces equal onnxruntime's."""
    grace = cv2.imread(str(assets["grace_hopper.jpg"]))
    tall = cv2.rotate(carphone_frames[0], cv2.ROTATE_90_CLOCKWISE)
    stills = {"astronaut": astronaut, "grace": grace, "coffee": coffee, "tall": tall}
    expected, _ = mtcnn_faces("onnxruntime", tmp_path, connect, stills)
    got, logs = mtcnn_faces("acl-sim", tmp_path, connect, stills)
    loaded = {e["model"]: e for e in logs if e.get("event") == "acl_model_loaded"}
    assert loaded["pnet"]["mode"] == "async" and len(loaded["pnet"]["hw_gears"]) == 10
    assert loaded["pnet"]["hw_gears"][0] == [384, 288], "NHWC, H and W swapped: (W, H)"
    assert [len(expected[n]) for n in stills] == [1, 1, 0, 1]
    for name in stills:
        assert len(got[name]) == len(expected[name])
        for a, b in zip(expected[name], got[name], strict=True):
            assert abs(a["score"] - b["score"]) <= 2e-4
            assert max(abs(x - y) for x, y in zip(a["box"], b["box"], strict=True)) <= 0.02

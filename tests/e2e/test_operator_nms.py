"""NMS as single operators on the backend (``nms = "operator"``), through the daemon: the
BlazeFace pipeline on onnxruntime single-node graphs and on ACL single operators on the
simulator (async and queue mode, the model's outputs left in device memory for the operators)
publishes the host NMS's detections for every carphone frame, and so does the MTCNN chain on
the simulator for the test images."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from streamer.clients.producer import produce

from .conftest import Client, backend_settings
from .test_acl_sim import mtcnn_faces

pytestmark = pytest.mark.timeout(180)


def carphone(
    start_daemon: Any, connect: Any, settings: dict[str, Any]
) -> tuple[list[Any], list[str]]:
    """Each carphone frame's detections, and the daemon's log events."""
    daemon = start_daemon(**settings)
    client: Client = connect(daemon)
    produce("carphone.mp4", daemon.ingress, source="carphone", encoding="raw")
    results = client.collect(121)
    assert daemon.stop() == 0
    assert [r["seq"] for r in results[:-1]] == list(range(120))
    assert all(r["error"] is None for r in results[:-1])
    return [r["detections"] for r in results[:-1]], [e.get("event") for e in daemon.logs]


def test_operator_nms_publishes_the_host_detections(
    start_daemon: Any, connect: Any, tmp_path: Path, assets: dict[str, Path]
) -> None:
    reference, _ = carphone(start_daemon, connect, {})
    assert sum(len(d) == 1 for d in reference) >= 115
    operator = {"postprocess_extra": 'nms = "operator"'}
    model = assets["blazeface_short_range"]
    for name in ("onnxruntime", "acl-sim-async", "acl-sim-queue"):
        settings = {**backend_settings(name, model, tmp_path / "models"), **operator}
        got, events = carphone(start_daemon, connect, settings)
        assert ("acl_operator_stream_created" in events) is (name != "onnxruntime")
        for expected, found in zip(reference, got, strict=True):
            assert len(expected) == len(found)
            for a, b in zip(expected, found, strict=True):
                assert abs(a["score"] - b["score"]) <= 2e-4  # 1e-4 plus the 4-decimal rounding
                assert max(abs(x - y) for x, y in zip(a["box"], b["box"], strict=True)) <= 1.0


def mtcnn(
    backend: str, operator: bool, folder: Path, connect: Any, stills: Any
) -> tuple[dict[str, Any], list[str]]:
    """configs/mtcnn.toml on ``backend`` with O-Net's NMS on IoU, and with every NMS as an
    operator if ``operator``: each still's detections, and the daemon's log events."""

    def edit(text: str) -> str:
        text = text.replace('nms_method = "min"', 'nms_method = "union"')
        if operator:
            text = text.replace("merge_nms = 0.7", 'merge_nms = 0.7\nnms = "operator"')
            text = text.replace("nms_threshold = 0.7", 'nms_threshold = 0.7\nnms = "operator"')
        return text

    faces, logs = mtcnn_faces(backend, folder, connect, stills, edit)
    return faces, [e.get("event") for e in logs]


def test_mtcnn_chain_with_operator_nms_on_the_simulator(
    connect: Any,
    tmp_path: Path,
    assets: dict[str, Path],
    astronaut: Any,
    coffee: Any,
    grace_hopper: Any,
) -> None:
    """P-Net, R-Net and O-Net's NMS as ACL single operators, on the dequeue threads of the
    three item stages: the faces of the host NMS on onnxruntime."""
    stills = {"astronaut": astronaut, "grace": grace_hopper, "coffee": coffee}
    expected, _ = mtcnn("onnxruntime", False, tmp_path, connect, stills)
    got, events = mtcnn("acl-sim", True, tmp_path, connect, stills)
    assert "acl_operator_stream_created" in events
    assert [len(expected[n]) for n in stills] == [1, 1, 0]
    for name in stills:
        assert len(got[name]) == len(expected[name])
        for a, b in zip(expected[name], got[name], strict=True):
            assert abs(a["score"] - b["score"]) <= 2e-4
            assert max(abs(x - y) for x, y in zip(a["box"], b["box"], strict=True)) <= 1.0

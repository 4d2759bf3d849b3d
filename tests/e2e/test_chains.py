"""Chains of models through the daemon: MTCNN (P-Net → R-Net → O-Net), BlazeFace → O-Net."""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import cv2
import numpy as np
import pytest

from streamer.clients.producer import produce
from streamer.transport.protocol import encode_frame

from .conftest import Client, Daemon, free_port, metric_by_label, wait_metric

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def start_config(tmp_path: Path, assets: dict[str, Path]) -> Iterator[Callable[..., Daemon]]:
    """Start a daemon on a shipped config, edited, moved to free ports and JSON logs."""
    daemons: list[Daemon] = []

    def start(name: str, edit: Callable[[str], str] = lambda text: text) -> Daemon:
        ports = free_port(), free_port(), free_port()
        text = edit((ROOT / "configs" / name).read_text())
        text = re.sub(r"127\.0\.0\.1:5555\b", f"127.0.0.1:{ports[0]}", text)
        text = re.sub(r"127\.0\.0\.1:5556\b", f"127.0.0.1:{ports[1]}", text)
        header = f'[daemon]\nlog_format = "json"\nhttp_address = "127.0.0.1:{ports[2]}"\n'
        path = tmp_path / name
        path.write_text(header + text)
        daemon = Daemon(path, *ports)
        daemons.append(daemon)
        daemon.wait_event("ready")
        return daemon

    yield start
    for daemon in daemons:
        daemon.close()


def inside(point: list[float], box: list[float]) -> bool:
    x, y, w, h = box
    return x <= point[0] <= x + w and y <= point[1] <= y + h


def iou(a: list[float], b: list[float]) -> float:
    w = max(0.0, min(a[0] + a[2], b[0] + b[2]) - max(a[0], b[0]))
    h = max(0.0, min(a[1] + a[3], b[1] + b[3]) - max(a[1], b[1]))
    return w * h / (a[2] * a[3] + b[2] * b[3] - w * h)


def send_stills(client: Client, images: dict[str, np.ndarray]) -> dict[str, dict[str, Any]]:
    for name, image in images.items():
        jpeg = cv2.imencode(".png", image)[1].tobytes()
        client.send_parts(encode_frame(name, 0, jpeg, encoding="png"))
    return {r["source"]: r for r in client.collect(len(images))}


def test_mtcnn_chain(
    start_config: Any,
    connect: Any,
    assets: dict[str, Path],
    astronaut: np.ndarray,
    grace_hopper: np.ndarray,
    coffee: np.ndarray,
    chelsea: np.ndarray,
) -> None:
    daemon = start_config("mtcnn.toml")
    client: Client = connect(daemon)
    produce("carphone.mp4", daemon.ingress, source="carphone", encoding="raw")
    frames = client.collect(121)[:-1]
    assert [r["seq"] for r in frames] == list(range(120))
    assert sum(len(r["detections"]) == 1 for r in frames) >= 115
    assert all(r["error"] is None and r["model"] in ("pnet", "rnet", "onet") for r in frames)
    stills = {"astronaut": astronaut, "grace": grace_hopper, "coffee": coffee, "chelsea": chelsea}
    results = send_stills(client, stills)
    for name in ("astronaut", "grace"):
        (face,) = results[name]["detections"]
        assert len(face["keypoints"]) == 5
        assert all(inside(point, face["box"]) for point in face["keypoints"])
    assert iou(results["astronaut"]["detections"][0]["box"], [179, 60, 89, 113]) >= 0.5
    assert results["coffee"]["detections"] == [] and results["chelsea"]["detections"] == []
    assert daemon.stop() == 0
    final = daemon.final_counts()
    assert final["published"] == final["received"]


def test_blazeface_then_onet(
    start_config: Any, connect: Any, astronaut: np.ndarray, coffee: np.ndarray
) -> None:
    daemon = start_config("blazeface_onet.toml")
    client: Client = connect(daemon)
    results = send_stills(client, {"astronaut": astronaut, "coffee": coffee})
    (face,) = results["astronaut"]["detections"]
    assert face["onet"] is not None and face["onet"]["score"] > 0.9
    assert len(face["onet"]["keypoints"]) == 5
    assert all(inside(p, face["box"]) for p in face["onet"]["keypoints"])
    assert results["coffee"]["detections"] == []  # no face: O-Net skipped, still published
    assert results["astronaut"]["model"] == "onet" and results["coffee"]["error"] is None
    frames = {"face": 2 + client.probes, "onet": 1 + client.probes}  # a face in each probe
    assert metric_by_label(daemon, "streamer_batch_size_sum", "model") == frames
    for latency in ("batch_wait", "queue", "inference"):
        name = f"streamer_{latency}_duration_seconds_count"
        assert metric_by_label(daemon, name, "model") == frames, latency
    assert daemon.stop() == 0


def test_rnet_alone_classifies_lfw(
    start_config: Any, connect: Any, assets: dict[str, Path]
) -> None:
    """skimage's lfw_subset: 100 faces then 100 non-faces, 25x25 gray, sent as raw frames."""
    gray = np.load(assets["lfw_subset.npy"])
    images = np.round(gray * 255).astype(np.uint8)
    daemon = start_config("face_classifier.toml")
    client: Client = connect(daemon)
    for seq, image in enumerate(images):
        header, payload = encode_frame("lfw", seq, image, encoding="raw", color="gray")
        client.send_parts([header, payload])
    results = client.collect(200)
    assert [r["seq"] for r in results] == list(range(200))
    predicted = np.array([r["face"]["is_face"] for r in results])
    truth = np.repeat([True, False], 100)
    assert (predicted == truth).mean() >= 0.98
    assert daemon.stop() == 0


def test_a_frame_too_small_for_pnet_still_gets_its_answer(
    start_config: Any, connect: Any, astronaut: np.ndarray
) -> None:
    """A frame under P-Net's smallest window (min_face_px) has no item for it: it was
    published with neither ``detections`` nor ``model`` (""), unlike any other frame."""
    daemon = start_config("mtcnn.toml")
    client: Client = connect(daemon)
    tiny = cv2.resize(astronaut, (8, 8), interpolation=cv2.INTER_AREA)
    strip = cv2.resize(astronaut, (2000, 4), interpolation=cv2.INTER_AREA)
    results = send_stills(client, {"tiny": tiny, "strip": strip, "astronaut": astronaut})
    for name in ("tiny", "strip"):
        assert results[name]["error"] is None
        assert results[name]["detections"] == [] and results[name]["model"] == "pnet"
    assert len(results["astronaut"]["detections"]) >= 1
    assert daemon.stop() == 0


def test_onet_alone_classifies_faces(
    start_config: Any, connect: Any, assets: dict[str, Path]
) -> None:
    """``mtcnn_classify`` on O-Net (README: "R-Net or O-Net"): its three outputs failed every
    frame as ``postprocess_failed`` (expected R-Net's two)."""
    gray = np.load(assets["lfw_subset.npy"])
    images = np.round(gray[::10] * 255).astype(np.uint8)  # 10 faces, then 10 non-faces
    daemon = start_config(
        "face_classifier.toml", lambda text: text.replace('"mtcnn_rnet"', '"mtcnn_onet"')
    )
    client: Client = connect(daemon)
    for seq, image in enumerate(images):
        header, payload = encode_frame("lfw", seq, image, encoding="raw", color="gray")
        client.send_parts([header, payload])
    results = client.collect(len(images))
    assert all(r["error"] is None for r in results)
    predicted = np.array([r["face"]["is_face"] for r in results])
    assert (predicted == np.repeat([True, False], 10)).mean() >= 0.8
    assert daemon.stop() == 0


def test_strip_frames_are_classified_through_their_in_image_part(
    start_config: Any, connect: Any
) -> None:
    """``mtcnn_classify`` squares the whole frame: a 1 x 8192 strip (24 KiB, inside every
    ingress limit) was cut as a zero-padded 8192 x 8192 square, 200 MB and a tenth of a
    second or more of a decode worker each, so a few dozen of them held every other source up
    for seconds and a stop's drain ran out (``drain_timeout``, ``threads_stuck``). The cost
    is checked in tests/unit/vision/test_crops.py (allocation, not time); here, that such
    frames get their results through a daemon."""
    daemon = start_config("face_classifier.toml")
    client: Client = connect(daemon)
    strips = [np.full((1, 8192, 3), 200, np.uint8), np.full((8192, 1), 200, np.uint8)]
    for seq in range(60):
        image = strips[seq % 2]
        color = "bgr" if image.ndim == 3 else "gray"
        client.send_parts(encode_frame("strip", seq, image, encoding="raw", color=color))
    results = client.collect(60)
    assert [r["seq"] for r in results] == list(range(60))
    assert all(r["error"] is None and r["face"]["is_face"] is False for r in results)
    assert {(r["width"], r["height"]) for r in results} == {(8192, 1), (1, 8192)}
    assert daemon.stop() == 0


def test_a_stop_is_not_held_by_a_backlog_of_slow_decodes(start_config: Any, connect: Any) -> None:
    """40-megapixel PNGs (half a second each to decode and crop) queued faster than one
    decode worker takes them: at the drain's end the batcher waited on each queued frame's
    preparation in turn, a batch's worth (seconds) past the abort, and the stop logged
    ``threads_stuck`` (an error) and left the ZeroMQ context unterminated, or the worker
    pool's shutdown cancelled the decode it waited on and the daemon exited 1
    (``pipeline_failed``, ``CancelledError``). Batcher: "abort: ... the thread then returns
    at once"."""
    daemon = start_config(
        "face_classifier.toml", lambda text: "drain_timeout_s = 0.5\ndecode_workers = 1\n" + text
    )
    client: Client = connect(daemon)
    payload = cv2.imencode(".png", np.zeros((6000, 6600, 3), np.uint8))[1].tobytes()  # 39.6 MP
    for seq in range(40):
        client.send_parts(encode_frame("big", seq, payload, encoding="png"))
    wait_metric(daemon, "streamer_frames_received_total", 40)
    time.sleep(1.5)  # the batcher has taken a batch's worth, still being decoded
    assert daemon.stop() == 0  # it exited 1 too: pipeline_failed, CancelledError
    assert not [e for e in daemon.logs if e.get("event") == "threads_stuck"]
    final = daemon.final_counts()
    assert final["received"] == final["published"] + final["failed"] + final["dropped"]
    assert final["dropped_by_reason"].get("shutdown", 0) > 0  # the backlog was cut short

"""Host-side vs in-model / on-device normalisation through the daemon (issue 9): in the
onnxruntime graph, and on the simulator with static AIPP and with dynamic AIPP.

The same frames (carphone's 120 and the three test images, sent raw so both daemons decode
identical pixels) go to a daemon that normalises on the host and to one that sends uint8
pixels to the model; the detections must match: boxes within one pixel, scores within 1e-4.
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pytest

from streamer.runtime.acl.aipp_dynamic import DynamicAippConfig
from streamer.runtime.acl.aipp_static import StaticAipp
from streamer.runtime.graph_preprocess import InputNormalization
from streamer.transport.protocol import encode_frame

from .conftest import Client, backend_settings

TOLERANCE_PX = 1.0
TOLERANCE_SCORE = 1e-4


def _detections(
    start_daemon: Any, connect: Any, frames: list[np.ndarray], **settings: Any
) -> list[list[dict[str, Any]]]:
    daemon = start_daemon(**settings)
    client: Client = connect(daemon)
    for seq, frame in enumerate(frames):
        client.send_parts(encode_frame("cmp", seq, frame, encoding="raw"))
    results = sorted(client.collect(len(frames), timeout_s=60.0), key=lambda r: r["seq"])
    assert [r["seq"] for r in results] == list(range(len(frames)))
    assert all(r["error"] is None for r in results)
    assert daemon.stop() == 0
    return [r["detections"] for r in results]


def assert_same_detections(
    host: list[list[dict[str, Any]]], other: list[list[dict[str, Any]]]
) -> None:
    """Per frame the same number of detections, boxes and keypoints within one pixel,
    scores within 1e-4."""
    for index, (a, b) in enumerate(zip(host, other, strict=True)):
        assert len(a) == len(b), (index, a, b)
        for da, db in zip(a, b, strict=True):
            assert np.allclose(da["box"], db["box"], atol=TOLERANCE_PX), (index, da, db)
            assert np.allclose(da["keypoints"], db["keypoints"], atol=TOLERANCE_PX)
            assert abs(da["score"] - db["score"]) <= TOLERANCE_SCORE, (index, da, db)


@pytest.fixture(scope="module")
def frames(
    carphone_frames: list[np.ndarray],
    astronaut: np.ndarray,
    chelsea: np.ndarray,
    coffee: np.ndarray,
) -> list[np.ndarray]:
    return [*carphone_frames, astronaut, chelsea, coffee]


def test_in_graph_preprocessing_matches_host(
    start_daemon: Any, connect: Any, frames: list[np.ndarray]
) -> None:
    host = _detections(start_daemon, connect, frames)
    model = _detections(start_daemon, connect, frames, preprocess_extra='normalize = "model"')
    assert sum(len(d) == 1 for d in host[:120]) >= 115
    assert_same_detections(host, model)


def test_device_normalize_is_refused_on_onnxruntime(start_daemon: Any) -> None:
    daemon = start_daemon(preprocess_extra='normalize = "device"', wait_ready=False)
    assert daemon.process.wait(60) != 0
    daemon.close()
    assert any("normalize" in json.dumps(entry) for entry in daemon.logs), daemon.logs[-5:]


def blazeface_aipp() -> StaticAipp:
    """The AIPP ``streamer models aipp`` writes for the default letterbox (RGB, 0.5 / 0.5)."""
    half = np.full(3, 0.5)
    return StaticAipp.from_normalization(
        InputNormalization.from_mean_std(half, half, True, "NCHW"), 128, 128
    )


@pytest.mark.parametrize("name", ["acl-sim-queue", "acl-sim-async", "acl-sim-sync"])
def test_static_aipp_on_the_simulator_matches_host(
    start_daemon: Any,
    connect: Any,
    frames: list[np.ndarray],
    assets: dict[str, Any],
    tmp_path: Any,
    name: str,
) -> None:
    settings = backend_settings(name, assets["blazeface_short_range"], tmp_path / "models")
    with_aipp(settings, blazeface_aipp().model_dump())
    host = _detections(start_daemon, connect, frames)
    device = _detections(
        start_daemon, connect, frames, preprocess_extra='normalize = "device"', **settings
    )
    assert_same_detections(host, device)


DYNAMIC_AIPP = 'normalize = "device"\naipp = "dynamic"'


def with_aipp(settings: dict[str, Any], aipp: dict[str, Any]) -> dict[str, Any]:
    """``settings`` with ``aipp`` as the ``aipp`` section of the model's manifest."""
    manifest_file = settings["model_path"].with_suffix(".acl.json")
    manifest = json.loads(manifest_file.read_text())
    manifest["aipp"] = aipp
    manifest_file.write_text(json.dumps(manifest))
    return settings


def with_dynamic_aipp(settings: dict[str, Any], max_src_image_size: int) -> dict[str, Any]:
    """``settings`` with a dynamic ``aipp_op`` added to the model's manifest."""
    aipp = DynamicAippConfig(aipp_mode="dynamic", max_src_image_size=max_src_image_size)
    return with_aipp(settings, aipp.model_dump())


@pytest.mark.parametrize("name", ["acl-sim-async", "acl-sim-sync"])
def test_dynamic_aipp_on_the_simulator_matches_host(
    start_daemon: Any,
    connect: Any,
    frames: list[np.ndarray],
    assets: dict[str, Any],
    tmp_path: Any,
    name: str,
) -> None:
    settings = backend_settings(name, assets["blazeface_short_range"], tmp_path / "models")
    largest_batch = 8 * 128 * 128 * 3  # gears 1, 2, 4, 8 of 128 x 128 RGB888 images
    with_dynamic_aipp(settings, largest_batch)
    host = _detections(start_daemon, connect, frames)
    device = _detections(start_daemon, connect, frames, preprocess_extra=DYNAMIC_AIPP, **settings)
    assert_same_detections(host, device)


def test_a_broken_aipp_rule_stops_the_daemon_at_start_up(
    start_daemon: Any, assets: dict[str, Any], tmp_path: Any
) -> None:
    settings = backend_settings("acl-sim-async", assets["blazeface_short_range"], tmp_path)
    with_dynamic_aipp(settings, 4 * 128 * 128 * 3)  # room for 4 images, the largest gear is 8
    daemon = start_daemon(preprocess_extra=DYNAMIC_AIPP, wait_ready=False, **settings)
    assert daemon.process.wait(60) != 0
    daemon.close()
    rule = "dynamic AIPP with dynamic batch: input memory for the largest batch"
    assert any(rule in json.dumps(entry) for entry in daemon.logs), daemon.logs[-5:]

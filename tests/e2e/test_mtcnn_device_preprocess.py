"""The MTCNN chain (configs/mtcnn.toml) with host-side vs device-side preprocessing, through the
daemon (issue 9): on onnxruntime with ``normalize = "model"`` (each net's graph normalises),
on the simulator with ``normalize = "device"`` (each ``.om`` has MTCNN's static AIPP, P-Net's
with its pyramid gears as resolution gears), and with every NMS as an operator too
(device-side pre- and post-processing, O-Net's NMS on IoU on both sides).

The same frames (carphone's 120 and the four test images, sent raw so every daemon decodes
identical pixels) go to a daemon that prepares everything on the host and to one that does not,
on the same backend with the same NMS kind; the detections must match: boxes and keypoints
within one pixel, scores within 1e-4. A broken AIPP rule and a ``normalize`` the model does
not take stop the daemon at start-up.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from streamer.runtime.acl.aipp_static import StaticAipp
from streamer.runtime.mtcnn_keys import MTCNN_NORMALIZATION
from streamer.transport.protocol import encode_frame

from .conftest import Client, Daemon, streamer_check
from .test_acl_sim import mtcnn_on
from .test_device_preprocess import assert_same_detections

pytestmark = pytest.mark.timeout(300)

SIZES = {"pnet": 0, "rnet": 24, "onet": 48}
"""The AIPP source size of each net (``streamer models aipp``): 0 for P-Net's resolution gears
(rule: static AIPP with dynamic resolution, source size 0)."""

Edit = Callable[[str], str]


def device_side(normalize: str) -> Edit:
    """Every stage's ``normalize`` set to ``normalize``."""
    return lambda text: text.replace('normalize = "host"', f'normalize = "{normalize}"')


def union(text: str) -> str:
    """O-Net's NMS on IoU, the NMS kind the operator runs."""
    return text.replace('nms_method = "min"', 'nms_method = "union"')


def operators(text: str) -> str:
    """Every NMS as a single operator on the backend."""
    text = text.replace("merge_nms = 0.7", 'merge_nms = 0.7\nnms = "operator"')
    return text.replace("nms_threshold = 0.7", 'nms_threshold = 0.7\nnms = "operator"')


def with_aipp(folder: Path, source: dict[str, int] = SIZES) -> None:
    """Give the simulator's manifests of the three nets laid out for ``folder`` (in
    ``folder/models``) MTCNN's static AIPP of ``source`` size, whatever the config says."""
    for net, size in source.items():
        path = folder / "models" / f"{net}.acl.json"
        manifest = json.loads(path.read_text())
        aipp = StaticAipp.from_normalization(MTCNN_NORMALIZATION, size, size)
        path.write_text(json.dumps({**manifest, "aipp": aipp.model_dump()}))


Config = tuple[Path, int, int, int]
"""A config file and its ingress, egress and HTTP ports."""


def chain_config(backend: str, folder: Path, *edits: Edit) -> Config:
    """configs/mtcnn.toml, edited, on ``backend`` (as :func:`mtcnn_on` lays it out: with
    ``normalize = "device"`` each net's manifest gets its static AIPP)."""

    def edit(text: str) -> str:
        for each in edits:
            text = each(text)
        return text

    return mtcnn_on(backend, folder, edit)


def detections(
    config: Config, frames: list[np.ndarray], probe: np.ndarray
) -> tuple[list[Any], list[str]]:
    """Each frame's detections from a daemon on ``config``, and the daemon's log events."""
    daemon = Daemon(*config)
    try:
        daemon.wait_event("ready")
        client = Client(daemon, probe)
        try:
            for seq, frame in enumerate(frames):
                client.send_parts(encode_frame("cmp", seq, frame, encoding="raw"))
            results = sorted(client.collect(len(frames), timeout_s=120.0), key=lambda r: r["seq"])
        finally:
            client.close()
        assert daemon.stop() == 0
    finally:
        daemon.close()
    assert [r["seq"] for r in results] == list(range(len(frames)))
    assert all(r["error"] is None for r in results), [r["error"] for r in results]
    return [r["detections"] for r in results], [e.get("event") for e in daemon.logs]


@pytest.fixture(scope="module")
def frames(carphone_and_stills: list[np.ndarray]) -> list[np.ndarray]:
    return carphone_and_stills


PLACES = [("onnxruntime", "model"), ("acl-sim", "device")]
"""Each backend and the device-side ``normalize`` it runs."""


def run(
    backend: str,
    place: str | None,
    edits: tuple[Edit, ...],
    folder: Path,
    frames: list[np.ndarray],
) -> tuple[list[Any], list[str]]:
    """:func:`detections` of the chain on ``backend``, edited, normalising at ``place`` (None:
    on the host); ``device`` gives the nets MTCNN's static AIPP."""
    if place is not None:
        edits = (*edits, device_side(place))
    config = chain_config(backend, folder, *edits)
    return detections(config, frames, frames[-4])


def check_reference(host: list[Any]) -> None:
    """One face in (nearly) every carphone frame, astronaut and grace; none on the cat and
    coffee (the stills in the ``stills`` fixture's order)."""
    assert sum(len(d) == 1 for d in host[:120]) >= 115
    assert [len(d) for d in host[120:]] == [1, 0, 0, 1]


@pytest.mark.parametrize(("backend", "place"), PLACES)
def test_device_side_preprocessing_matches_host(
    backend: str, place: str, tmp_path: Path, assets: dict[str, Path], frames: list[np.ndarray]
) -> None:
    host, _ = run(backend, None, (), tmp_path / "host", frames)
    device, _ = run(backend, place, (), tmp_path / "device", frames)
    check_reference(host)
    assert_same_detections(host, device)


@pytest.mark.parametrize(("backend", "place"), PLACES)
def test_device_side_pre_and_post_processing_match_host(
    backend: str, place: str, tmp_path: Path, assets: dict[str, Path], frames: list[np.ndarray]
) -> None:
    """Every NMS an operator too (IoU, so O-Net's on IoU on the host side as well)."""
    host, _ = run(backend, None, (union,), tmp_path / "host", frames)
    device, events = run(backend, place, (union, operators), tmp_path / "device", frames)
    assert ("acl_operator_stream_created" in events) is (backend == "acl-sim")
    check_reference(host)
    assert_same_detections(host, device)


def check(config: Config) -> subprocess.CompletedProcess[str]:
    """``streamer check`` on ``config``: loads every model, opens no socket."""
    return streamer_check(config[0])


def test_a_broken_aipp_rule_or_a_normalize_the_model_does_not_take_stops_the_start(
    tmp_path: Path, assets: dict[str, Path]
) -> None:
    onnx = check(chain_config("onnxruntime", tmp_path / "ort", device_side("device")))
    assert onnx.returncode == 2, onnx.stdout + onnx.stderr
    assert 'postprocess.normalize: "device" is ACL AIPP' in onnx.stdout + onnx.stderr
    gear = tmp_path / "gear"
    config = chain_config("acl-sim", gear, device_side("device"))
    with_aipp(gear, {**SIZES, "pnet": 384})  # a source size with P-Net's resolution gears
    ruled = check(config)
    assert ruled.returncode == 2, ruled.stdout + ruled.stderr
    rule = "rule 'static AIPP with dynamic resolution: source size 0'"
    assert rule in ruled.stdout + ruled.stderr
    host = tmp_path / "host"
    config = chain_config("acl-sim", host)
    with_aipp(host)
    refused = check(config)
    assert refused.returncode == 2, refused.stdout + refused.stderr
    assert "normalize: 'host' sends float32 tensors" in refused.stdout + refused.stderr
    graph = tmp_path / "graph"
    config = chain_config("acl-sim", graph)
    with_aipp(graph)  # AIPP takes the pixels with H and W exchanged; "model" does not
    # set after the layout, which lays "model" out as what ATC builds for it (static AIPP)
    config[0].write_text(device_side("model")(config[0].read_text()))
    untransposed = check(config)
    assert untransposed.returncode == 2, untransposed.stdout + untransposed.stderr
    assert 'normalize: "model" is the onnxruntime' in untransposed.stdout + untransposed.stderr

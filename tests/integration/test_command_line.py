"""``streamer``'s command line as a user starts it: ``--version`` and ``--help`` answer
without loading the libraries that only the commands need."""

from __future__ import annotations

import subprocess
import sys

import pytest

HEAVY = frozenset({"onnxruntime", "onnx", "cv2", "numpy", "zmq", "streamer.pipeline"})
"""What the commands import when they run (about a second together), not before."""


@pytest.mark.parametrize(
    "args",
    [
        ["--version"],
        ["--help"],
        ["run", "--help"],
        ["check", "--help"],
        ["bench", "--help"],
        ["models", "fetch", "--help"],
        ["models", "list", "--help"],
    ],
)
def test_version_and_help_load_no_heavy_library(args: list[str]) -> None:
    """They took over a second, the command line importing onnxruntime, OpenCV, numpy,
    ZeroMQ and the pipeline first (``-X importtime`` lists what a process imports)."""
    done = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "streamer", *args],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    imported = {
        line.rsplit("|", 1)[-1].strip()
        for line in done.stderr.splitlines()
        if line.startswith("import time:")
    }
    assert not HEAVY & imported
    assert done.stdout.strip()

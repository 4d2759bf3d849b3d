"""The ACL backend on its simulator gives the onnxruntime backend's detections, in every mode."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from streamer.clients.producer import produce

from .conftest import BACKENDS, Client, backend_settings


def carphone_detections(start_daemon: Any, connect: Any, settings: dict[str, Any]) -> list[Any]:
    daemon = start_daemon(**settings)
    client: Client = connect(daemon)
    produce("carphone.mp4", daemon.ingress, source="carphone", encoding="raw")
    results = client.collect(121)
    assert daemon.stop() == 0
    assert [r["seq"] for r in results[:-1]] == list(range(120))
    return [r["detections"] for r in results[:-1]]


@pytest.mark.parametrize("name", [b for b in BACKENDS if b != "onnxruntime"])
def test_detections_match_onnxruntime(
    name: str, start_daemon: Any, connect: Any, tmp_path: Path, assets: dict[str, Path]
) -> None:
    reference = carphone_detections(start_daemon, connect, {})
    settings = backend_settings(name, assets["blazeface_short_range"], tmp_path / "models")
    simulated = carphone_detections(start_daemon, connect, settings)
    for expected, got in zip(reference, simulated, strict=True):
        assert len(expected) == len(got)
        for a, b in zip(expected, got, strict=True):
            assert abs(a["score"] - b["score"]) <= 2e-4  # 1e-4 plus the 4-decimal rounding
            assert max(abs(x - y) for x, y in zip(a["box"], b["box"], strict=True)) <= 0.02


def test_two_dynamic_kinds_fail_at_start(tmp_path: Path, assets: dict[str, Path]) -> None:
    """ATC allows one dynamic option per model; such a model is refused before any frame."""
    settings = backend_settings("acl-sim-async", assets["blazeface_short_range"], tmp_path)
    model = settings["model_path"]
    model.with_suffix(".acl.json").write_text(
        json.dumps(
            {
                "input_shape": {"input": [-1, 3, -1, -1]},
                "dynamic_batch_size": [1, 2, 4, 8],
                "dynamic_image_size": [[128, 128], [192, 192]],
            }
        )
    )
    root = Path(__file__).resolve().parents[2]
    text = (root / "configs" / "default.toml").read_text()
    text = text.replace('backend = "onnxruntime"', 'backend = "acl-sim"')
    text = text.replace('asset = "blazeface_short_range"', f'path = "{model}"')
    config = tmp_path / "both.toml"
    config.write_text(text.replace("intra_op_threads = 1", ""))
    result = subprocess.run(
        [sys.executable, "-m", "streamer", "check", "--config", str(config)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 2, result.stdout + result.stderr
    assert "model 'face'" in result.stderr
    assert "mutually exclusive" in result.stdout + result.stderr

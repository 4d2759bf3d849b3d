"""The ACL backend on its simulator gives the onnxruntime backend's detections, in every mode."""

from __future__ import annotations

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

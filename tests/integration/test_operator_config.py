"""``nms = "operator"`` in a shipped config: the pipeline hands its backend's operators to
every stage that asks for them (MTCNN's three item stages), and refuses O-Net's ``min``
overlap, which the ONNX / ACL NMS operator does not compute."""

from __future__ import annotations

from pathlib import Path

import pytest

from streamer.config import load_config
from streamer.errors import ConfigError
from streamer.pipeline import Pipeline

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.timeout(60)


def _mtcnn(tmp_path: Path, onet_method: str) -> Path:
    """configs/mtcnn.toml with every NMS as an operator and O-Net's overlap ``onet_method``."""
    text = (ROOT / "configs" / "mtcnn.toml").read_text()
    text = text.replace("merge_nms = 0.7", 'merge_nms = 0.7\nnms = "operator"')
    text = text.replace("nms_threshold = 0.7", 'nms_threshold = 0.7\nnms = "operator"')
    text = text.replace('nms_method = "min"', f'nms_method = "{onet_method}"')
    path = tmp_path / "mtcnn.toml"
    path.write_text(text)
    return path


def test_mtcnn_stages_get_the_backends_operators(tmp_path: Path, assets: dict[str, Path]) -> None:
    pipeline = Pipeline.load(load_config(_mtcnn(tmp_path, "union")))
    pipeline.close()
    with pytest.raises(
        ConfigError, match=r"models\[2\] \('onet'\)\.postprocess: .*nms_method = .min."
    ):
        Pipeline.load(load_config(_mtcnn(tmp_path, "min")))

"""BlazeFace cut into backbone and head: the two parts compute what the whole model does."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest

from streamer.assets import SPLITS, Split
from streamer.assets.split import split_model
from streamer.errors import AssetError


def session(path: Path) -> ort.InferenceSession:
    return ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])


def test_backbone_then_head_equals_the_whole_model(tmp_path: Path, short_range_model: Path) -> None:
    backbone, head = SPLITS
    split_model(backbone, short_range_model, tmp_path / "backbone.onnx")
    split_model(head, short_range_model, tmp_path / "head.onnx")
    parts = session(tmp_path / "backbone.onnx"), session(tmp_path / "head.onnx")
    assert [i.shape for i in parts[1].get_inputs()] == [
        ["batch", 88, 16, 16],
        ["batch", 96, 8, 8],
    ]
    x = np.random.default_rng(3).uniform(-1, 1, (3, 3, 128, 128)).astype(np.float32)
    features = parts[0].run(None, {"input": x})
    outputs = parts[1].run(None, dict(zip(head.inputs, features, strict=True)))
    expected = session(short_range_model).run(None, {"input": x})
    for got, want in zip(outputs, expected, strict=True):
        np.testing.assert_array_equal(got, want)


def test_a_tensor_the_model_lacks_is_an_asset_error(
    tmp_path: Path, short_range_model: Path
) -> None:
    wrong = Split("x", "blazeface_short_range", ("input",), ("nope",))
    with pytest.raises(AssetError, match="cannot cut x out of blazeface_short_range.onnx"):
        split_model(wrong, short_range_model, tmp_path / "x.onnx")

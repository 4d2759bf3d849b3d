"""The converted BlazeFace models really have a dynamic batch: a batch equals single runs."""

from __future__ import annotations

from pathlib import Path

import cv2
import numpy as np
import onnxruntime as ort
import pytest


def _session(path: Path) -> ort.InferenceSession:
    options = ort.SessionOptions()
    options.log_severity_level = 3
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


def _inputs(frames: list[np.ndarray], size: int) -> np.ndarray:
    """8 different frames, stretched to size², RGB in [-1, 1], NCHW float32 (8, 3, s, s)."""
    chosen = frames[::15][:8]
    assert len(chosen) == 8
    batch = [cv2.resize(f, (size, size), interpolation=cv2.INTER_AREA)[:, :, ::-1] for f in chosen]
    return np.ascontiguousarray(np.stack(batch).transpose(0, 3, 1, 2), np.float32) / 127.5 - 1


@pytest.mark.parametrize("model", ["short_range_model", "full_range_model"])
def test_batch_of_8_equals_8_single_runs(
    request: pytest.FixtureRequest, model: str, carphone_frames: list[np.ndarray]
) -> None:
    session = _session(request.getfixturevalue(model))
    (tensor,) = session.get_inputs()
    assert not isinstance(tensor.shape[0], int)  # symbolic: dynamic batch
    x = _inputs(carphone_frames, tensor.shape[2])
    batched = session.run(None, {tensor.name: x})
    singles = [session.run(None, {tensor.name: x[i : i + 1]}) for i in range(8)]
    for k, output in enumerate(batched):
        assert output.shape[0] == 8
        expected = np.concatenate([single[k] for single in singles])
        assert np.abs(output - expected).max() <= 1e-4
    # The frames differ, so the check is not vacuous.
    assert np.abs(batched[0][0] - batched[0][7]).max() > 1

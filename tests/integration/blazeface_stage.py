"""BlazeFace inputs and their onnxruntime reference, for the tests that run one stage's
threads over simulated devices (replica retries, queue-mode recovery)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from streamer.config import RuntimeConfig
from streamer.frames import Frame
from streamer.runtime import ModelSpec, open_backend


def tensors(count: int) -> list[np.ndarray]:
    """``count`` BlazeFace inputs, float32 (3, 128, 128) in [-1, 1]."""
    rng = np.random.default_rng(count)
    return [rng.uniform(-1, 1, (3, 128, 128)).astype(np.float32) for _ in range(count)]


def reference(short_range_model: Path, inputs: Sequence[np.ndarray]) -> np.ndarray:
    """The regressors output of every input, run at once on onnxruntime."""
    with (
        open_backend(RuntimeConfig()) as backend,
        backend.load(ModelSpec("ref", short_range_model)) as model,
    ):
        model.enqueue([np.stack(inputs)])
        done = model.dequeue(10_000)
        assert done is not None and done.outputs is not None
        return np.asarray(done.outputs[0])


def keep_regressors(outputs: Sequence[Any], frames: list[Frame]) -> None:
    """A postprocess that keeps each frame's row of the regressors output."""
    for row, frame in enumerate(frames):
        frame.results = {"regressors": np.asarray(outputs[0])[row].copy()}

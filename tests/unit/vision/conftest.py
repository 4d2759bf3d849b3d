"""Fixtures for the vision tests: real BlazeFace sessions and the full detection chain."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort
import pytest

from streamer.config import PluginConfig
from streamer.runtime.base import ModelInfo
from streamer.runtime.onnx import session_model_info
from streamer.vision.postprocess import Postprocessor
from streamer.vision.preprocess import Preprocessor
from streamer.vision.registry import POSTPROCESSORS, PREPROCESSORS


@dataclass
class Chain:
    """letterbox → onnxruntime → blazeface for one model, default parameters."""

    session: ort.InferenceSession
    info: ModelInfo
    preprocess: Preprocessor
    postprocess: Postprocessor

    def infer(self, images: Sequence[np.ndarray]) -> tuple[list[np.ndarray], list[Any]]:
        """Preprocess ``images`` and run them as one batch; (outputs, transforms)."""
        tensors, transforms = zip(*(self.preprocess(image) for image in images), strict=True)
        outputs = self.session.run(None, {self.info.inputs[0].name: np.stack(tensors)})
        return outputs, list(transforms)

    def detect(self, images: Sequence[np.ndarray], **params: Any) -> list[list[dict[str, Any]]]:
        """Detections per image, in batches of 16; ``params`` override the defaults."""
        post = self.postprocess
        if params:
            post = POSTPROCESSORS.create(
                PluginConfig(kind="blazeface", **params), self.info, "test"
            )
        results = []
        for start in range(0, len(images), 16):
            outputs, transforms = self.infer(images[start : start + 16])
            results += [r["detections"] for r in post(outputs, transforms)]
        return results


def _session(path: Path) -> ort.InferenceSession:
    options = ort.SessionOptions()
    options.log_severity_level = 3
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


def _chain(path: Path, name: str) -> Chain:
    session = _session(path)
    info = session_model_info(name, session)
    pre = PREPROCESSORS.create(PluginConfig(kind="letterbox"), info, "models[0].preprocess")
    post = POSTPROCESSORS.create(PluginConfig(kind="blazeface"), info, "models[0].postprocess")
    return Chain(session, info, pre, post)


@pytest.fixture(scope="session")
def short_chain(short_range_model: Path) -> Chain:
    return _chain(short_range_model, "blazeface_short_range")


@pytest.fixture(scope="session")
def full_chain(full_range_model: Path) -> Chain:
    return _chain(full_range_model, "blazeface_full_range")


@pytest.fixture(scope="session", params=["short", "full"])
def chain(request: pytest.FixtureRequest) -> Chain:
    """Each BlazeFace variant in turn."""
    return request.getfixturevalue(f"{request.param}_chain")


@pytest.fixture(scope="session")
def carphone_detections(
    short_chain: Chain, full_chain: Chain, carphone_frames: list[np.ndarray]
) -> Callable[[str], list[list[dict[str, Any]]]]:
    """Detections for every carphone frame, per variant, computed once."""
    cache: dict[str, list[list[dict[str, Any]]]] = {}

    def get(variant: str) -> list[list[dict[str, Any]]]:
        if variant not in cache:
            chain = short_chain if variant == "short" else full_chain
            cache[variant] = chain.detect(carphone_frames)
        return cache[variant]

    return get

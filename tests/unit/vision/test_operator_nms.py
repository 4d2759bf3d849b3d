"""NMS on the host vs as single operators on the backend (``nms = "operator"``), same kind of
NMS on both sides: BlazeFace (weighted NMS) and the MTCNN cascade (hard NMS), on onnxruntime
and on the ACL simulator, give the same detections on carphone and the test images."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort
import pytest

from streamer.config import PluginConfig
from streamer.errors import ConfigError
from streamer.runtime.acl.operators import AclOperators
from streamer.runtime.acl.options import SimOptions
from streamer.runtime.acl.sim.simulator import Simulator
from streamer.runtime.ops import OnnxOperators, Operators
from streamer.vision.mtcnn import Cascade, ONet, ONetParams, PNet, PNetParams, RNet, RNetParams
from streamer.vision.preprocess import LetterboxTransform
from streamer.vision.registry import POSTPROCESSORS

pytestmark = pytest.mark.timeout(120)

Chain = Any  # tests/unit/vision/conftest.py's Chain (conftest modules are not importable)
Detections = list[list[dict[str, Any]]]


@pytest.fixture(scope="module", params=["onnxruntime", "acl-sim"])
def operators(request: pytest.FixtureRequest) -> Iterator[Operators]:
    """The operators of each backend; on the simulator with a device context current in the
    test thread, checked for leaks and broken rules at the end."""
    if request.param == "onnxruntime":
        with OnnxOperators() as onnx_ops:
            yield onnx_ops
        return
    sim = Simulator(SimOptions())
    acl = sim.acl
    assert acl.init() == 0 and acl.rt.set_device(0) == 0
    with AclOperators(acl, sim.run_mode, {}) as acl_ops:
        yield acl_ops
    assert acl.rt.reset_device(0) == 0 and acl.finalize() == 0
    assert sim.live_resources() == {} and sim.violations == []


@pytest.fixture(scope="module")
def images(carphone_and_stills: list[np.ndarray]) -> list[np.ndarray]:
    return carphone_and_stills


def assert_same(expected: Detections, got: Detections) -> None:
    """Same detections per image: boxes and keypoints within a pixel, scores within 1e-4."""
    assert len(expected) == len(got)
    for want, have in zip(expected, got, strict=True):
        assert len(want) == len(have)
        for a, b in zip(want, have, strict=True):
            assert np.abs(np.subtract(a["box"], b["box"])).max() <= 1.0
            assert abs(a["score"] - b["score"]) <= 1e-4
            assert np.abs(np.subtract(a["keypoints"], b["keypoints"])).max() <= 1.0


def _blazeface(
    chain: Chain, images: Sequence[np.ndarray], params: dict[str, Any], ops: Operators | None
) -> Detections:
    post = POSTPROCESSORS.create(PluginConfig(kind="blazeface", **params), chain.info, "t", ops)
    found: Detections = []
    for start in range(0, len(images), 16):
        outputs, transforms = chain.infer(images[start : start + 16])
        found += [r["detections"] for r in post(outputs, transforms)]
    return found


@pytest.mark.parametrize("threshold", [None, 0.1])
def test_blazeface_operator_nms_matches_the_host(
    chain: Chain, operators: Operators, images: list[np.ndarray], threshold: float | None
) -> None:
    """At the default threshold (one face per carphone frame) and at 0.1 (many candidates,
    clusters of several boxes, more than one detection on some images)."""
    params = {"score_threshold": threshold}
    host = _blazeface(chain, images, params, None)
    device = _blazeface(chain, images, {**params, "nms": "operator"}, operators)
    assert_same(host, device)
    assert sum(len(d) for d in device) >= 120


def test_blazeface_zero_one_and_many_faces_in_one_batch(
    short_chain: Chain, operators: Operators
) -> None:
    """Frame 0 has no candidate, frame 1 one, frame 2 two clusters of three: the batch's
    padding rows (top-k rows past a frame's own candidates) never become detections."""
    regressors = np.zeros((4, 896, 16), np.float32)
    logits = np.full((4, 896, 1), -10, np.float32)
    regressors[:, :, 2:4] = 16  # 16x16 boxes around each anchor
    logits[1, 300] = 2.0
    logits[2, [100, 101, 102], 0] = [3.0, 2.5, 2.0]  # 100, 101: one centre; 102: 8 px right
    logits[2, [700, 701, 702], 0] = [1.5, 1.4, 1.3]
    logits[3] = 5.0  # batch padding: ignored
    transform = LetterboxTransform.fit(128, 128, 128, 128)
    table = {"kind": "blazeface", "score_threshold": 0.5}
    device = POSTPROCESSORS.create(
        PluginConfig(**table, nms="operator"), short_chain.info, "t", operators
    )
    host = POSTPROCESSORS.create(PluginConfig(**table), short_chain.info, "t")
    outputs = [regressors, logits]
    got = [r["detections"] for r in device(outputs, [transform] * 3)]
    assert [len(d) for d in got] == [0, 1, 2]
    assert_same([r["detections"] for r in host(outputs, [transform] * 3)], got)


@pytest.fixture(scope="module")
def mtcnn_infer(assets: dict[str, Path]) -> Any:
    sessions = {
        name: ort.InferenceSession(str(assets[f"mtcnn_{name}"]), providers=["CPUExecutionProvider"])
        for name in ("pnet", "rnet", "onet")
    }

    def infer(stage: str, batch: np.ndarray) -> list[np.ndarray]:
        session = sessions[stage]
        outputs: list[np.ndarray] = session.run(None, {session.get_inputs()[0].name: batch})
        return outputs

    return infer


def test_mtcnn_operator_nms_matches_the_host(
    operators: Operators, images: list[np.ndarray], mtcnn_infer: Any
) -> None:
    """Every NMS of the cascade on the backend (O-Net with IoU on both sides)."""
    host = Cascade(PNet(), RNet(), ONet(ONetParams(nms_method="union")))
    device = Cascade(
        PNet(PNetParams(nms="operator"), operators),
        RNet(RNetParams(nms="operator"), operators),
        ONet(ONetParams(nms_method="union", nms="operator"), operators),
    )
    sample = images[:120:12] + images[-4:]
    expected = [host.detect(image, mtcnn_infer) for image in sample]
    assert_same(expected, [device.detect(image, mtcnn_infer) for image in sample])
    assert sum(len(d) == 1 for d in expected[:10]) >= 9


def test_operator_nms_needs_operators_and_iou(short_chain: Chain) -> None:
    with pytest.raises(ConfigError, match=r"models\[0\]\.postprocess: blazeface: nms"):
        POSTPROCESSORS.create(
            PluginConfig(kind="blazeface", nms="operator"),
            short_chain.info,
            "models[0].postprocess",
        )
    with pytest.raises(ConfigError, match='nms_method = "min" needs nms = "host"'):
        ONet(ONetParams(nms="operator"), OnnxOperators())

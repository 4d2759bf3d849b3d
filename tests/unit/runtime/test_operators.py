"""The post-processing operators (NMS, top-k, row gather) on every backend: onnxruntime
single-node graphs and ACL single operators on the simulator (host and device run mode) give
the same, exact results; an NMS whose kept count differs per image returns exactly each
image's rows; an operand read with other dims reads its leading elements."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest

from streamer.errors import FrameError
from streamer.runtime.acl.constants import RunMode
from streamer.runtime.acl.operators import AclOperators
from streamer.runtime.acl.options import SimOptions
from streamer.runtime.acl.sim.simulator import Simulator
from streamer.runtime.ops import NO_SCORE_THRESHOLD, OnnxOperators, Operators
from streamer.vision.mtcnn.boxes import nms as host_nms

pytestmark = pytest.mark.timeout(60)


@pytest.fixture(params=["onnxruntime", "acl-sim-host", "acl-sim-device"])
def operators(request: pytest.FixtureRequest) -> Iterator[Operators]:
    """Each backend's operators; on the simulator with a device context current in the test's
    thread, everything released and checked for leaks and broken rules afterwards."""
    if request.param == "onnxruntime":
        with OnnxOperators() as onnx_ops:
            yield onnx_ops
        return
    run_mode = "host" if request.param.endswith("host") else "device"
    sim = Simulator(SimOptions(run_mode=run_mode))
    acl = sim.acl
    assert acl.init() == 0 and acl.rt.set_device(0) == 0
    context, ret = acl.rt.create_context(0)
    assert ret == 0
    with AclOperators(acl, sim.run_mode, {}) as acl_ops:
        yield acl_ops
    assert acl.rt.destroy_context(context) == 0
    assert acl.rt.reset_device(0) == 0 and acl.finalize() == 0
    assert sim.live_resources() == {}
    assert sim.violations == []


def _image(rng: np.random.Generator, count: int) -> tuple[np.ndarray, np.ndarray]:
    """``count`` boxes in clusters of overlapping ones (pixels) and distinct scores."""
    centres = rng.uniform(20, 200, (max(count // 4, 1), 2))
    picks = centres[rng.integers(0, len(centres), count)] + rng.normal(0, 4, (count, 2))
    sizes = rng.uniform(10, 30, (count, 2))
    boxes = np.concatenate([picks - sizes / 2, picks + sizes / 2], axis=1).astype(np.float32)
    return boxes, rng.permutation(count).astype(np.float32) / count + 0.01


def test_nms_each_returns_exactly_each_images_kept_boxes(operators: Operators) -> None:
    """0, 1 and many boxes per image in one call: every image gets the host NMS's indices,
    in order, and never an index of a padding row."""
    rng = np.random.default_rng(7)
    many = _image(rng, 40)
    one = (np.array([[5, 5, 25, 25]], np.float32), np.array([0.4], np.float32))
    none = (np.zeros((0, 4), np.float32), np.zeros(0, np.float32))
    images = [many, none, one, none, _image(rng, 9)]
    kept = operators.nms_each([b for b, _ in images], [s for _, s in images], 0.5)
    assert len(kept) == len(images)
    for (boxes, scores), got in zip(images, kept, strict=True):
        expected = host_nms(boxes.astype(np.float64), scores, 0.5, "union")
        assert got.dtype == np.int64
        assert got.tolist() == expected.tolist()
        assert len(set(got.tolist())) == len(got) and all(0 <= i < len(boxes) for i in got)
    assert [len(k) for k in kept[1:4]] == [0, 1, 0] and 1 < len(kept[0]) < 40


def test_nms_kept_rows_threshold_and_limit(operators: Operators) -> None:
    boxes = np.array([[[0, 0, 10, 10], [1, 1, 11, 11], [50, 50, 60, 60], [0, 0, 4, 4]]], np.float32)
    scores = np.array([[[0.9, 0.8, 0.7, 0.75]]], np.float32)
    selected = operators.nms(boxes, scores, 10, 0.5)
    assert selected.tolist() == [[0, 0, 0], [0, 0, 3], [0, 0, 2]]
    assert operators.nms(boxes, scores, 2, 0.5).tolist() == [[0, 0, 0], [0, 0, 3]]
    assert operators.nms(boxes, scores, 10, 0.5, 0.75).tolist() == [[0, 0, 0]]  # score > 0.75
    assert operators.nms(boxes, scores, 0, 0.5).shape == (0, 3)
    two = operators.nms(np.concatenate([boxes, boxes]), np.concatenate([scores, scores]), 1, 0.5)
    assert two.tolist() == [[0, 0, 0], [1, 0, 0]]


def test_nms_iou_at_the_threshold_is_kept(operators: Operators) -> None:
    """Two 12x12 windows 4 pixels apart overlap with IoU exactly 0.5: kept at 0.5."""
    boxes = np.array([[[0, 0, 12, 12], [4, 0, 16, 12]]], np.float32)
    scores = np.array([[[0.9, 0.8]]], np.float32)
    assert len(operators.nms(boxes, scores, 10, 0.5, NO_SCORE_THRESHOLD)) == 2
    assert len(operators.nms(boxes, scores, 10, 0.49)) == 1


def test_top_k(operators: Operators) -> None:
    rng = np.random.default_rng(3)
    x = rng.normal(size=(3, 50)).astype(np.float32)
    x[1, 10] = x[1, 20] = 9.0  # a tie: the lower index first
    values, indices = operators.top_k(x, 5)
    order = np.argsort(-x, axis=1, kind="stable")[:, :5]
    assert indices.dtype == np.int64 and indices.tolist() == order.tolist()
    assert np.array_equal(values, np.take_along_axis(x, order, axis=1))
    assert [a.shape for a in operators.top_k(x, 0)] == [(3, 0), (3, 0)]
    assert operators.top_k(x[0], 50)[1].tolist() == np.argsort(-x[0], kind="stable").tolist()


def test_gather_rows_and_operands_read_with_other_dims(operators: Operators) -> None:
    """The layout of a BlazeFace batch: 3 frames' (N, 16) rows and (N, 1) logits of which the
    first 2 frames are real; top-k over their logits read as (2, N), then their best rows
    gathered from the regressors read as (2 * N, 16)."""
    rng = np.random.default_rng(5)
    regressors = rng.normal(size=(3, 40, 16)).astype(np.float32)
    logits = rng.normal(size=(3, 40, 1)).astype(np.float32)
    values, order = operators.top_k(logits, 4, shape=(2, 40))
    expected = np.argsort(-logits[:2, :, 0], axis=1, kind="stable")[:, :4]
    assert order.tolist() == expected.tolist()
    assert np.array_equal(values, np.take_along_axis(logits[:2, :, 0], expected, axis=1))
    rows = (np.arange(2)[:, None] * 40 + order).reshape(-1)
    gathered = operators.gather_rows(regressors, rows, shape=(80, 16))
    assert gathered.dtype == np.float32 and gathered.shape == (8, 16)
    assert np.array_equal(gathered, regressors[:2].reshape(80, 16)[rows])
    picked = operators.gather_rows(regressors[0], np.array([39, 0, 39]))
    assert np.array_equal(picked, regressors[0][[39, 0, 39]])


def test_contract_violations_raise_value_error(operators: Operators) -> None:
    boxes = np.zeros((1, 3, 4), np.float32)
    with pytest.raises(ValueError, match="float32"):
        operators.nms(boxes.astype(np.float64), np.zeros((1, 1, 3), np.float32), 1, 0.5)
    with pytest.raises(ValueError, match=r"\(B, C, N\)"):
        operators.nms(boxes, np.zeros((1, 1, 4), np.float32), 1, 0.5)
    with pytest.raises(ValueError, match="k = 4"):
        operators.top_k(np.zeros((2, 3), np.float32), 4)
    with pytest.raises(ValueError, match="one score per box"):
        operators.nms_each([boxes[0]], [np.zeros(2)], 0.5)
    x = np.zeros((2, 3), np.float32)
    with pytest.raises(ValueError, match=r"cannot read \[2, 3\] as \[7\]"):
        operators.top_k(x, 1, shape=(7,))
    with pytest.raises(ValueError, match=r"rows must be in 0\.\.1"):
        operators.gather_rows(x, np.array([0, 2]))
    with pytest.raises(ValueError, match="non-empty 1-D int rows"):
        operators.gather_rows(x, np.zeros(0, np.int64))


def test_closed_acl_operators_fail_the_batch() -> None:
    sim = Simulator(SimOptions())
    acl = sim.acl
    assert acl.init() == 0 and acl.rt.set_device(0) == 0
    ops = AclOperators(acl, RunMode.HOST, {})
    ops.close()
    with pytest.raises(FrameError, match="closed"):
        ops.top_k(np.zeros((1, 3), np.float32), 1)
    assert acl.rt.reset_device(0) == 0 and acl.finalize() == 0

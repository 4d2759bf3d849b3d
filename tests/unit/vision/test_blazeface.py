"""blazeface: anchors, decoding, weighted NMS, and the acceptance on real images and video.

Numbers measured with these tests (onnxruntime CPU, streamer's letterbox), which set the
defaults (short range 0.75, full range 0.5):

=========== ======================================= =========== ========== ============
model       carphone best score per frame           chelsea max coffee max carphone 1-face
=========== ======================================= =========== ========== ============
short range 0.868 .. 0.974 (median 0.947)           0.493       0.266      120 / 120
full range  0.647 .. 0.917 (median 0.825)           0.011       0.167      120 / 120
=========== ======================================= =========== ========== ============
"""

from __future__ import annotations

from typing import Any

import cv2
import numpy as np
import pytest

from streamer.errors import FrameError, Reason
from streamer.vision.decode import DecodeLimits, decode_image
from streamer.vision.postprocess.blazeface import (
    FULL_RANGE,
    SHORT_RANGE,
    decode_boxes,
    ssd_anchors,
    weighted_nms,
)
from streamer.vision.preprocess import LetterboxTransform

Chain = Any  # tests/unit/vision/conftest.py's Chain (conftest modules are not importable)

ASTRONAUT_FACE = (177, 81, 95, 95)


def _iou(a: list[float] | tuple[float, ...], b: list[float] | tuple[float, ...]) -> float:
    ax2, ay2, bx2, by2 = a[0] + a[2], a[1] + a[3], b[0] + b[2], b[1] + b[3]
    w = max(0.0, min(ax2, bx2) - max(a[0], b[0]))
    h = max(0.0, min(ay2, by2) - max(a[1], b[1]))
    inter = w * h
    return inter / (a[2] * a[3] + b[2] * b[3] - inter)


def _max_score(detections: list[dict[str, Any]]) -> float:
    return max((d["score"] for d in detections), default=0.0)


# ---- anchors, decoding, NMS --------------------------------------------------------------


def test_short_range_anchors() -> None:
    anchors = ssd_anchors(SHORT_RANGE)
    assert anchors.shape == (896, 2) and anchors.dtype == np.float32
    # 16x16 cells of stride 8, 2 anchors each, then 8x8 cells of stride 16, 6 anchors each.
    assert np.array_equal(anchors[:4], [[4, 4], [4, 4], [12, 4], [12, 4]])
    assert np.array_equal(anchors[511], [124, 124])
    assert np.array_equal(anchors[512:518], [[8, 8]] * 6)
    assert np.array_equal(anchors[-1], [120, 120])


def test_full_range_anchors() -> None:
    anchors = ssd_anchors(FULL_RANGE)
    assert anchors.shape == (2304, 2)
    assert np.array_equal(anchors[:2], [[2, 2], [6, 2]])
    assert np.array_equal(anchors[48], [2, 6])
    assert np.array_equal(anchors[-1], [190, 190])


def test_decode_boxes_relative_to_anchors() -> None:
    row = np.zeros((1, 16), np.float32)
    row[0, :4] = (3, -2, 20, 10)
    row[0, 4:6] = (-5, 1)
    boxes, points = decode_boxes(row, np.array([[64, 32]], np.float32))
    assert np.array_equal(boxes, [[57, 25, 77, 35]])
    assert np.array_equal(points[0, 0], [59, 33])
    assert np.array_equal(points[0, 1:], [[64, 32]] * 5)


def test_weighted_nms_merges_overlaps_by_score() -> None:
    boxes = np.array([[0, 0, 10, 10], [1, 1, 11, 11], [50, 50, 60, 60]], np.float32)
    points = boxes[:, None, :2].copy()
    scores = np.array([0.6, 0.9, 0.8])
    out_boxes, out_points, out_scores = weighted_nms(boxes, points, scores, 0.3, 10)
    assert np.allclose(out_scores, [0.9, 0.8])
    merged = (0.9 * boxes[1] + 0.6 * boxes[0]) / 1.5
    assert np.allclose(out_boxes, [merged, boxes[2]])
    assert np.allclose(out_points[:, 0], [merged[:2], boxes[2, :2]])


def test_weighted_nms_threshold_is_strict_and_max_detections_holds() -> None:
    # IoU of these two is exactly 1/3.
    boxes = np.array([[0, 0, 10, 10], [5, 0, 15, 10]], np.float32)
    points = np.zeros((2, 6, 2), np.float32)
    scores = np.array([0.9, 0.8])
    assert len(weighted_nms(boxes, points, scores, 1 / 3, 10)[2]) == 2
    assert len(weighted_nms(boxes, points, scores, 0.3, 10)[2]) == 1
    assert len(weighted_nms(boxes, points, scores, 0.5, 1)[2]) == 1
    empty = weighted_nms(boxes[:0], points[:0], scores[:0], 0.3, 10)
    assert [a.shape for a in empty] == [(0, 4), (0, 6, 2), (0,)]


# ---- the postprocessor on synthetic outputs --------------------------------------------


def _synthetic(batch: int) -> list[np.ndarray]:
    regressors = np.zeros((batch, 896, 16), np.float32)
    logits = np.full((batch, 896, 1), -10, np.float32)
    return [regressors, logits]


def test_detections_are_clipped_and_rounded(short_chain: Chain) -> None:
    regressors, logits = _synthetic(1)
    logits[0, 0] = 3.0  # anchor (4, 4): a 20x20 box centred there sticks out top-left
    regressors[0, 0, 2:4] = 20
    regressors[0, 0, 4:16] = -10  # keypoints at (-6, -6): outside
    transform = LetterboxTransform.fit(300, 300, 128, 128)  # no padding
    [result] = short_chain.postprocess([regressors, logits], [transform])
    [det] = result["detections"]
    assert det["label"] == "face"
    assert det["score"] == round(1 / (1 + np.exp(-3.0)), 4)
    assert det["box"][:2] == [0.0, 0.0]
    assert det["box"][2:] == [round(14 * 300 / 128, 2)] * 2
    assert det["keypoints"] == [[0.0, 0.0]] * 6
    assert all(round(v, 2) == v for v in det["box"])


def test_a_box_entirely_in_the_padding_is_dropped(short_chain: Chain) -> None:
    regressors, logits = _synthetic(1)
    logits[0, 0] = 3.0
    regressors[0, 0, 2:4] = 4  # (2, 2)-(6, 6): inside the top border
    transform = LetterboxTransform.fit(300, 200, 128, 128)  # pad_y 21
    assert short_chain.postprocess([regressors, logits], [transform]) == [{"detections": []}]


def test_padded_batch_rows_are_ignored(short_chain: Chain, astronaut: np.ndarray) -> None:
    outputs, transforms = short_chain.infer([astronaut, astronaut])
    padded = [np.concatenate([o, np.full_like(o[:1], 50)]) for o in outputs]
    assert short_chain.postprocess(padded, transforms) == short_chain.postprocess(
        outputs, transforms
    )


def test_wrong_output_shapes_fail_the_batch(short_chain: Chain) -> None:
    regressors, logits = _synthetic(2)
    transform = LetterboxTransform.fit(10, 10, 128, 128)
    for outputs in ([regressors[:, :100], logits[:, :100]], [regressors[:1], logits[:1]]):
        with pytest.raises(FrameError) as info:
            short_chain.postprocess(outputs, [transform, transform])
        assert info.value.reason == Reason.POSTPROCESS_FAILED


# ---- acceptance: decode → letterbox → onnxruntime → blazeface ------------------------------


def test_astronaut_has_one_face(chain: Chain, astronaut: np.ndarray) -> None:
    [detections] = chain.detect([astronaut])
    assert len(detections) == 1
    face = detections[0]
    assert _iou(face["box"], ASTRONAUT_FACE) >= 0.5
    assert face["score"] > 0.9
    x, y, w, h = face["box"]
    assert all(x <= px <= x + w and y <= py <= y + h for px, py in face["keypoints"][:4])
    # Keypoint 0 is the subject's right eye: on the image's left for a frontal face.
    assert face["keypoints"][0][0] < face["keypoints"][1][0]


def test_coffee_has_no_face(chain: Chain, coffee: np.ndarray) -> None:
    assert chain.detect([coffee]) == [[]]
    assert _max_score(chain.detect([coffee], score_threshold=0.01)[0]) < 0.3


def test_chelsea_the_cat_has_no_face_at_the_default_threshold(
    chain: Chain, chelsea: np.ndarray
) -> None:
    assert chain.detect([chelsea]) == [[]]
    # The margin: the short model's best guess on the cat stays well under its 0.75 default.
    assert _max_score(chain.detect([chelsea], score_threshold=0.01)[0]) < 0.55


@pytest.mark.parametrize(("variant", "floor"), [("short", 0.8), ("full", 0.6)])
def test_carphone_has_one_face_per_frame(
    carphone_detections: Any, variant: str, floor: float
) -> None:
    detections = carphone_detections(variant)
    assert len(detections) == 120
    assert sum(len(d) == 1 for d in detections) >= 115
    assert min(_max_score(d) for d in detections) > floor  # margin over the default


def test_full_chain_from_wire_bytes(short_chain: Chain, carphone_frames: list[np.ndarray]) -> None:
    """Raw and JPEG payloads of the same frame give the same face."""
    frame = carphone_frames[60]
    fields = {"shape": list(frame.shape), "dtype": "uint8", "color": "bgr"}
    raw = decode_image("raw", frame.tobytes(), fields, DecodeLimits())
    jpeg = decode_image("jpeg", cv2.imencode(".jpg", frame)[1].tobytes(), {}, DecodeLimits())
    a, b = short_chain.detect([raw, jpeg])
    assert len(a) == len(b) == 1
    assert _iou(a[0]["box"], b[0]["box"]) > 0.9

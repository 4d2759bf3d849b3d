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

import math
from typing import Any

import cv2
import numpy as np
import pytest

from streamer.config import PluginConfig
from streamer.errors import FrameError, Reason
from streamer.runtime.ops import OnnxOperators
from streamer.vision.decode import DecodeLimits, decode_image
from streamer.vision.postprocess.blazeface import (
    FULL_RANGE,
    SHORT_RANGE,
    decode_boxes,
    ssd_anchors,
)
from streamer.vision.postprocess.blazeface_nms import OperatorNms
from streamer.vision.postprocess.weighted_nms import (
    BATCH_CANDIDATES_MAX,
    weighted_nms,
    weighted_nms_batch,
)
from streamer.vision.preprocess import LetterboxTransform
from streamer.vision.registry import POSTPROCESSORS

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


def _plain_weighted_nms(
    boxes: np.ndarray, points: np.ndarray, scores: np.ndarray, threshold: float, most: int
) -> list[tuple[np.ndarray, np.ndarray, float]]:
    """MediaPipe's weighted NMS as written in its calculator: one candidate at a time."""

    def overlap(a: np.ndarray, b: np.ndarray) -> float:
        w = max(0.0, min(a[2], b[2]) - max(a[0], b[0]))
        h = max(0.0, min(a[3], b[3]) - max(a[1], b[1]))
        union = (a[2] - a[0]) * (a[3] - a[1]) + (b[2] - b[0]) * (b[3] - b[1]) - w * h
        return float(w * h / union) if union > 0 else 0.0

    remaining = sorted(range(len(scores)), key=lambda i: -scores[i])
    out = []
    while remaining and len(out) < most:
        best = remaining[0]
        members = [j for j in remaining if j == best or overlap(boxes[best], boxes[j]) > threshold]
        remaining = [j for j in remaining if j not in members]
        weights = scores[members] / scores[members].sum()
        out.append(
            (
                weights @ boxes[members],
                weights @ points[members].reshape(len(members), -1),
                float(scores[best]),
            )
        )
    return out


@pytest.mark.parametrize("per_frame", [(0, 3, 1, 9, 0, 40, 2), (60, 90, 0, 120)])
def test_weighted_nms_batch_gives_each_frame_its_own_result(per_frame: tuple[int, ...]) -> None:
    """Random overlapping candidates, below and above BATCH_CANDIDATES_MAX, equal scores
    included, with and without a max_detections that binds: each frame gets what the
    calculator's rule gives it alone; frames never merge."""
    rng = np.random.default_rng(sum(per_frame))
    total = sum(per_frame)
    corners = rng.uniform(0, 40, (total, 2))
    boxes = np.concatenate([corners, corners + rng.uniform(0, 30, (total, 2))], 1)
    boxes = boxes.astype(np.float32)
    points = rng.uniform(0, 80, (total, 6, 2)).astype(np.float32)
    scores = rng.choice([0.8, 0.9, 0.95], total) + rng.uniform(0, 0.01, total) * (total > 100)
    assert (total > BATCH_CANDIDATES_MAX) == (per_frame[0] == 60)
    for threshold, most in [(0.3, 100), (0.1, 2)]:
        got = weighted_nms_batch(boxes, points, scores, per_frame, threshold, most)
        end = 0
        for count, (out_boxes, out_points, out_scores) in zip(per_frame, got, strict=True):
            start, end = end, end + count
            expected = _plain_weighted_nms(
                boxes[start:end], points[start:end], scores[start:end], threshold, most
            )
            assert len(out_scores) == len(expected) <= most and (count == 0) == (not expected)
            for box, pts, score, (e_box, e_pts, e_score) in zip(
                out_boxes, out_points, out_scores, expected, strict=True
            ):
                assert np.allclose(box, e_box, atol=1e-4) and score == np.float32(e_score)
                assert np.allclose(pts.reshape(-1), e_pts, atol=1e-4)
            assert out_boxes.dtype == out_points.dtype == out_scores.dtype == np.float32


@pytest.mark.parametrize("bad", [np.inf, np.nan])
def test_a_non_finite_candidate_spoils_only_its_own_frame(bad: float) -> None:
    boxes = np.array([[0, 0, 10, 10], [1, 1, 11, 11], [0, 0, 10, 10], [1, 1, 11, 11]], np.float32)
    points = np.repeat(boxes[:, None, :2], 6, axis=1)
    scores = np.array([0.9, 0.8, 0.9, 0.8])
    for spoiled in (boxes, points):
        spoiled_copy = spoiled.copy()
        spoiled_copy[0, 0] = bad
        args = (spoiled_copy, points) if spoiled is boxes else (boxes, spoiled_copy)
        first, second = weighted_nms_batch(*args, scores, [2, 2], 0.3, 10)
        assert not np.isfinite(np.concatenate([first[0].ravel(), first[1].ravel()])).all()
        alone = weighted_nms(boxes[2:], points[2:], scores[2:], 0.3, 10)
        for a, b in zip(second, alone, strict=True):
            assert np.array_equal(a, b)


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


# ---- the batched postprocessor against a per-frame reference --------------------------------

Found = tuple[np.ndarray, np.ndarray, np.ndarray]
Results = list[dict[str, Any]]


def _reference_to_image(found: Found, transform: LetterboxTransform) -> list[dict[str, Any]]:
    """One frame's boxes and keypoints mapped, clipped and rounded on their own, through its
    transform's ``to_image``."""
    boxes, points, scores = found
    size = np.array([transform.image_width, transform.image_height], np.float64)
    corners = np.clip(transform.to_image(boxes.reshape(-1, 2, 2)), 0, size)
    sides = corners[:, 1] - corners[:, 0]
    kept = (sides > 0).all(axis=1)
    xywh = np.round(np.concatenate([corners[kept, 0], sides[kept]], axis=1), 2).tolist()
    keypoints = np.round(np.clip(transform.to_image(points[kept]), 0, size), 2).tolist()
    return [
        {"box": box, "score": round(float(score), 4), "label": "face", "keypoints": pts}
        for box, pts, score in zip(xywh, keypoints, scores[kept], strict=True)
    ]


def _logit_threshold(post: Any) -> float:
    return math.log(post.score_threshold / (1 - post.score_threshold))


def _reference_nms(post: Any, regressors: np.ndarray, logits: np.ndarray) -> Found:
    """One frame's host NMS from its (N, 16) regressors and (N, 1) logits."""
    logits = logits.reshape(-1)
    kept = np.flatnonzero(logits >= _logit_threshold(post))
    scores = 1.0 / (1.0 + np.exp(-np.clip(logits[kept].astype(np.float64), -100, 100)))
    boxes, points = decode_boxes(regressors[kept], post.anchors[kept])
    return weighted_nms(boxes, points, scores, post.iou_threshold, post.max_detections)


def _reference(
    post: Any, outputs: list[np.ndarray], transforms: list[LetterboxTransform]
) -> Results:
    """The host path frame by frame, from the public pieces."""
    regressors, logits = outputs  # both BlazeFace models give the regressors first
    return [
        {"detections": _reference_to_image(_reference_nms(post, regressors[i], logits[i]), t)}
        for i, t in enumerate(transforms)
    ]


def _blazeface(chain: Chain, params: dict[str, Any], operators: OnnxOperators | None = None) -> Any:
    table = PluginConfig(kind="blazeface", **params)
    return POSTPROCESSORS.create(table, chain.info, "test", operators)


def _padded(outputs: list[np.ndarray]) -> list[np.ndarray]:
    """The outputs with one more batch row full of confident candidates (batch padding)."""
    return [np.concatenate([o, np.full_like(o[:1], 8)]) for o in outputs]


HOST_PARAMS: list[dict[str, Any]] = [
    {},
    {"score_threshold": 0.1},
    {"score_threshold": 0.1, "max_detections": 1},
]


def test_batch_equals_the_per_frame_reference_on_model_outputs(
    chain: Chain, carphone_and_stills: list[np.ndarray]
) -> None:
    """Carphone and the stills in batches of 8 (and a padding row): at the default threshold
    (one face per carphone frame), at 0.1 (clusters of many candidates; 208 on chelsea) and
    with one detection per frame at most."""
    posts = [_blazeface(chain, params) for params in HOST_PARAMS]
    for start in range(0, len(carphone_and_stills), 8):
        outputs, transforms = chain.infer(carphone_and_stills[start : start + 8])
        for post in posts:
            assert post(_padded(outputs), transforms) == _reference(post, outputs, transforms)


IMAGE_SIZES = [(176, 144), (640, 480), (300, 200), (200, 300), (1000, 100), (37, 53), (128, 128)]
"""(width, height) of the random batch's frames; the third one's top border is 21 pixels or
more on either model (a box inside it is dropped)."""


def _random_batch(
    rng: np.random.Generator, post: Any, frames: int
) -> tuple[list[np.ndarray], list[LetterboxTransform]]:
    """Outputs of ``frames`` frames and one padding row, and a transform per frame.

    Frame 0 has no candidate, frame 1 one in the middle, frame 2 one whose box lies in the top
    border, the others 5..80 candidates with boxes of 4..60 pixels near their anchors, some
    sticking out of the input or the image. Every logit below the threshold is at least 1
    below it.
    """
    n_anchors, size = len(post.anchors), post.variant.input_size
    threshold = _logit_threshold(post)
    regressors = rng.normal(0, 6, (frames + 1, n_anchors, 16)).astype(np.float32)
    regressors[:, :, 2:4] = rng.uniform(4, 60, (frames + 1, n_anchors, 2))
    logits = rng.uniform(-20, threshold - 1, (frames + 1, n_anchors, 1)).astype(np.float32)
    centre = np.argmin(np.abs(post.anchors - size / 2).sum(axis=1))
    logits[1, centre] = threshold + 1
    regressors[1, centre, :4] = (0, 0, 20, 20)
    logits[2, 0] = threshold + 2  # the anchor nearest the top-left corner
    regressors[2, 0, :4] = (0, 0, 4, 4)
    for i in range(3, frames):
        anchors = rng.choice(n_anchors, rng.integers(5, 81), replace=False)
        logits[i, anchors, 0] = rng.uniform(threshold, 8, len(anchors))
    logits[frames] = 8  # padding
    sizes = [IMAGE_SIZES[i % len(IMAGE_SIZES)] for i in range(frames)]
    transforms = [LetterboxTransform.fit(w, h, size, size) for w, h in sizes]
    transforms[-1] = LetterboxTransform.fit(88, 72, size, size).enlarged(2, 176, 144)
    return [regressors, logits], transforms


@pytest.mark.parametrize("seed", range(4))
def test_batch_equals_the_per_frame_reference_on_random_outputs(chain: Chain, seed: int) -> None:
    """Frames of 0, 1 and many candidates, of different sizes, in one batch with padding."""
    rng = np.random.default_rng(seed)
    for params in [{}, {"iou_threshold": 0.1, "max_detections": 3}]:
        post = _blazeface(chain, params)
        outputs, transforms = _random_batch(rng, post, frames=12)
        got = post(outputs, transforms)
        assert got == _reference(post, [o[:-1] for o in outputs], transforms)
        counts = [len(r["detections"]) for r in got]
        assert counts[:3] == [0, 1, 0] and max(counts) > 1


def test_operator_nms_maps_like_the_per_frame_reference(
    short_chain: Chain, carphone_frames: list[np.ndarray]
) -> None:
    """``nms = "operator"``: the operators' clusters of each frame, mapped frame by frame."""
    rng = np.random.default_rng(7)
    with OnnxOperators() as operators:
        post = _blazeface(short_chain, {"nms": "operator", "score_threshold": 0.1}, operators)
        nms = OperatorNms(
            operators,
            post.anchors,
            decode_boxes,
            _logit_threshold(post),
            post.iou_threshold,
            post.max_detections,
        )
        batches = [short_chain.infer(carphone_frames[:8]), _random_batch(rng, post, frames=12)]
        for outputs, transforms in batches:
            regressors, logits = outputs
            found = nms(regressors, logits, len(transforms))
            assert post(outputs, transforms) == [
                {"detections": _reference_to_image(f, t)}
                for f, t in zip(found, transforms, strict=True)
            ]

"""MediaPipe's weighted non-maximum suppression, for one frame and for a whole batch.

The rule (``NonMaxSuppressionCalculator``, ``overlap_type: INTERSECTION_OVER_UNION``,
``algorithm: WEIGHTED``): take the best remaining candidate, gather every remaining one whose
IoU with it is above the threshold (itself included), and output the score-weighted mean of
their boxes and keypoints with the best one's score; repeat until no candidate remains or
``max_detections`` clusters are out.

:func:`weighted_nms_batch` gives every frame of a batch exactly what :func:`weighted_nms`
gives it alone, in a fixed number of array operations per batch instead of per frame: on a
face stream most frames have a few candidates, and the per-call overhead of small array
operations, not arithmetic, is the cost.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

__all__ = ["BATCH_CANDIDATES_MAX", "Found", "iou", "weighted_nms", "weighted_nms_batch"]

Found = tuple[np.ndarray, np.ndarray, np.ndarray]
"""One frame's (boxes (D, 4), keypoints (D, K, 2), scores (D,)), float32, best first."""

BATCH_CANDIDATES_MAX = 256
"""Candidates of a batch above which :func:`weighted_nms_batch` runs frame by frame: its IoU
matrix covers every pair in the batch, so it grows with the square of the batch's candidates
where the frames' own matrices grow with each frame's."""


def iou(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """IoU of (H, 4) and (M, 4) corner boxes (x1, y1, x2, y2): (H, M); 0 where the union is
    empty."""
    lo = np.maximum(a[:, None, :2], b[None, :, :2])
    hi = np.minimum(a[:, None, 2:], b[None, :, 2:])
    wh = np.clip(hi - lo, 0, None)
    inter = wh[..., 0] * wh[..., 1]
    area_a = (a[:, 2] - a[:, 0]) * (a[:, 3] - a[:, 1])
    area_b = (b[:, 2] - b[:, 0]) * (b[:, 3] - b[:, 1])
    union = area_a[:, None] + area_b[None, :] - inter
    result: np.ndarray = np.divide(inter, union, out=np.zeros_like(inter), where=union > 0)
    return result


def weighted_nms(
    boxes: np.ndarray,
    keypoints: np.ndarray,
    scores: np.ndarray,
    iou_threshold: float,
    max_detections: int,
) -> Found:
    """One frame's weighted NMS (see the module docstring).

    Args:
        boxes: float (M, 4) corners; keypoints: float (M, K, 2); scores: float (M,).
        iou_threshold: a candidate joins the best one's cluster when IoU > this.
        max_detections: clusters to output at most.

    Returns:
        Best first: each cluster's score-weighted mean box and keypoints, with the best
        member's score.
    """
    return weighted_nms_batch(
        boxes, keypoints, scores, [len(scores)], iou_threshold, max_detections
    )[0]


@np.errstate(invalid="ignore", over="ignore")  # non-finite model outputs: NaN clusters
def weighted_nms_batch(
    boxes: np.ndarray,
    keypoints: np.ndarray,
    scores: np.ndarray,
    counts: Sequence[int],
    iou_threshold: float,
    max_detections: int,
) -> list[Found]:
    """Each frame's weighted NMS, for the candidates of a whole batch.

    Args:
        boxes: float (C, 4) corners; keypoints: float (C, K, 2); scores: float (C,): the
            batch's candidates, frame after frame.
        counts: candidates per frame, summing to C.
        iou_threshold: a candidate joins a cluster when IoU > this (frames never mix).
        max_detections: clusters per frame at most.

    Returns:
        One :data:`Found` per frame, as :func:`weighted_nms` gives it for that frame alone:
        also with a non-finite coordinate, which makes only its own frame's clusters NaN
        (the batch then runs frame by frame, since 0 x inf in the batch's weighted means
        would reach every frame).
    """
    if len(counts) > 1 and (sum(counts) > BATCH_CANDIDATES_MAX or not _finite(boxes, keypoints)):
        ends = np.cumsum(counts).tolist()
        return [
            weighted_nms(
                boxes[e - n : e],
                keypoints[e - n : e],
                scores[e - n : e],
                iou_threshold,
                max_detections,
            )
            for n, e in zip(counts, ends, strict=True)
        ]
    frame_of = np.repeat(np.arange(len(counts)), counts)
    order = np.lexsort((-scores, frame_of))  # stable: equal scores keep their order
    boxes, scores, frame_of = boxes[order], scores[order], frame_of[order]
    k = keypoints.shape[1]
    points = keypoints[order].reshape(len(order), 2 * k)
    overlaps = (iou(boxes, boxes) > iou_threshold) & (frame_of[:, None] == frame_of[None, :])
    heads, clusters, per_frame = _clusters(overlaps, frame_of.tolist(), len(counts), max_detections)
    if heads:
        membership = np.array(clusters, np.float64) * scores
        weights = membership / membership.sum(axis=1, keepdims=True)
        out = (
            (weights @ boxes).astype(np.float32),
            (weights @ points).astype(np.float32).reshape(-1, k, 2),
            scores[heads].astype(np.float32),
        )
    else:
        out = (
            np.zeros((0, 4), np.float32),
            np.zeros((0, k, 2), np.float32),
            np.zeros(0, np.float32),
        )
    ends = np.cumsum(per_frame).tolist()
    return [
        (out[0][e - n : e], out[1][e - n : e], out[2][e - n : e])
        for n, e in zip(per_frame, ends, strict=True)
    ]


def _finite(boxes: np.ndarray, keypoints: np.ndarray) -> bool:
    return bool(np.isfinite(boxes).all() and np.isfinite(keypoints).all())


def _clusters(
    overlaps: np.ndarray, frame_of: list[int], frames: int, max_detections: int
) -> tuple[list[int], list[np.ndarray], list[int]]:
    """The greedy pass over candidates sorted by frame, then score, best first.

    Returns:
        Each cluster's head (index), its members (bool (C,)), in order, and the clusters of
        each frame.
    """
    remaining = np.ones(len(frame_of), bool)
    heads: list[int] = []
    clusters: list[np.ndarray] = []
    per_frame = [0] * frames
    for best, frame in enumerate(frame_of):
        if per_frame[frame] == max_detections or not remaining[best]:
            continue
        members = overlaps[best] & remaining
        members[best] = True  # a degenerate (empty) box still forms its own cluster
        remaining &= ~members
        heads.append(best)
        clusters.append(members)
        per_frame[frame] += 1
    return heads, clusters, per_frame

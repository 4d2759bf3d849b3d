"""BlazeFace's NMS as single operators (``nms = "operator"``): top-k, hard NMS, then
MediaPipe's weighted blend of each cluster on the host.

Per batch, on the pipeline's backend (:class:`streamer.runtime.ops.Operators`):

1. **top-k** over each frame's N logits, ``k`` = the most anchors any frame of the batch has
   at or above the score threshold: each frame's best ``k`` anchors, best first. A frame with
   ``c`` such anchors takes its first ``c``; the rest of its rows are padding.
2. host: decode the boxes and keypoints of those anchors only.
3. **NMS** of every frame in one call (:meth:`~streamer.runtime.ops.Operators.nms_each`, IoU
   ``iou_threshold``, ``max_detections`` per frame): the cluster heads, best first.
4. host: the weighted blend (``NonMaxSuppressionCalculator``, ``algorithm: WEIGHTED``): each
   head, in order, takes every candidate not taken yet whose IoU with it is above
   ``iou_threshold``; the cluster's box and keypoints are the score-weighted mean, its score
   the head's.

Same kind of NMS as the host path (:func:`~streamer.vision.postprocess.blazeface.weighted_nms`):
MediaPipe's weighted NMS starts each cluster at the best candidate left once every candidate
whose IoU with an earlier cluster's head is above the threshold is gone, and hard NMS keeps a
box exactly when its IoU with every box kept before it is at most the threshold: the heads are
the boxes hard NMS keeps, in the same order, and ``max_detections`` caps both alike. The
operator NMS decides which boxes start a cluster; the blend only averages.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from streamer.runtime.ops.base import Operators

__all__ = ["Decode", "OperatorNms", "blend_clusters"]

Decode = Callable[[np.ndarray, np.ndarray], tuple[np.ndarray, np.ndarray]]
"""``decode(regressors (M, 16), anchors (M, 2)) -> (boxes (M, 4), keypoints (M, K, 2))``."""

Found = tuple[np.ndarray, np.ndarray, np.ndarray]
"""One frame's (boxes (D, 4), keypoints (D, K, 2), scores (D,)), float32, best first."""


class OperatorNms:
    """Steps 1-4 of the module docstring for one batch. Thread-safe.

    Args:
        operators: the backend's operators.
        anchors: float32 (N, 2) anchor centres, model-input pixels.
        decode: :func:`~streamer.vision.postprocess.blazeface.decode_boxes`.
        logit_threshold: an anchor is a candidate when its logit is >= this.
        iou_threshold: IoU above which candidates join a cluster.
        max_detections: clusters per frame at most.
    """

    def __init__(
        self,
        operators: Operators,
        anchors: np.ndarray,
        decode: Decode,
        logit_threshold: float,
        iou_threshold: float,
        max_detections: int,
    ) -> None:
        self._operators = operators
        self._anchors = anchors
        self._decode = decode
        self._logit_threshold = logit_threshold
        self._iou_threshold = iou_threshold
        self._max_detections = max_detections

    def __call__(self, regressors: np.ndarray, logits: np.ndarray) -> list[Found]:
        """Each frame's clusters.

        Args:
            regressors: float (n, N, 16); logits: float (n, N); n = the batch's real frames.

        Returns:
            One :data:`Found` per frame, in model-input pixels.

        Raises:
            FrameError: ``postprocess_failed``: an operator failed.
        """
        counts = (logits >= self._logit_threshold).sum(axis=1)
        values, order = self._top(logits, int(counts.max(initial=0)))
        candidates = [
            self._candidates(regressors[i], values[i, :c], order[i, :c])
            for i, c in enumerate(counts.tolist())
        ]
        heads = self._operators.nms_each(
            [boxes for boxes, _, _ in candidates],
            [scores.astype(np.float32) for _, _, scores in candidates],
            self._iou_threshold,
            self._max_detections,
        )
        return [
            blend_clusters(*found, kept, self._iou_threshold)
            for found, kept in zip(candidates, heads, strict=True)
        ]

    def _top(self, logits: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        """Each frame's ``k`` best logits and their anchors; no operator call for ``k = 0``
        (no frame has a candidate)."""
        if k == 0:
            return np.zeros((len(logits), 0), np.float32), np.zeros((len(logits), 0), np.int64)
        return self._operators.top_k(np.ascontiguousarray(logits, np.float32), k)

    def _candidates(
        self, regressors: np.ndarray, values: np.ndarray, anchors: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Boxes, keypoints and float64 scores of one frame's candidate anchors."""
        boxes, points = self._decode(regressors[anchors], self._anchors[anchors])
        scores = 1.0 / (1.0 + np.exp(-np.clip(values.astype(np.float64), -100, 100)))
        return boxes, points, scores


def blend_clusters(
    boxes: np.ndarray,
    keypoints: np.ndarray,
    scores: np.ndarray,
    heads: np.ndarray,
    iou_threshold: float,
) -> Found:
    """MediaPipe's weighted blend around given cluster heads (step 4).

    Args:
        boxes: float32 (M, 4) corners; keypoints: float32 (M, K, 2); scores: float (M,);
            candidates best first.
        heads: int (D,) indices of the cluster heads, in the order they were kept.
        iou_threshold: a candidate joins a head's cluster when their IoU is above this.

    Returns:
        (boxes (D, 4), keypoints (D, K, 2), scores (D,)) float32: each cluster's
        score-weighted mean box and keypoints, and its head's score.
    """
    k = keypoints.shape[1]
    if not len(heads):
        return (
            np.zeros((0, 4), np.float32),
            np.zeros((0, k, 2), np.float32),
            np.zeros(0, np.float32),
        )
    overlaps = _iou(boxes[heads], boxes) > iou_threshold
    remaining = np.ones(len(boxes), bool)
    clusters = []
    for row, head in enumerate(heads.tolist()):
        members = overlaps[row] & remaining
        members[head] = True  # a degenerate (empty) box still forms its own cluster
        remaining &= ~members
        clusters.append(members)
    membership = np.array(clusters, np.float64) * scores
    weights = membership / membership.sum(axis=1, keepdims=True)
    points = keypoints.reshape(len(boxes), 2 * k)
    return (
        (weights @ boxes).astype(np.float32),
        (weights @ points).astype(np.float32).reshape(-1, k, 2),
        scores[heads].astype(np.float32),
    )


def _iou(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """IoU of (H, 4) and (M, 4) corner boxes: (H, M); 0 where the union is empty."""
    lo = np.maximum(a[:, None, :2], b[None, :, :2])
    hi = np.minimum(a[:, None, 2:], b[None, :, 2:])
    wh = np.clip(hi - lo, 0, None)
    inter = wh[..., 0] * wh[..., 1]
    area_a = (a[:, 2] - a[:, 0]) * (a[:, 3] - a[:, 1])
    area_b = (b[:, 2] - b[:, 0]) * (b[:, 3] - b[:, 1])
    union = area_a[:, None] + area_b[None, :] - inter
    iou: np.ndarray = np.divide(inter, union, out=np.zeros_like(inter), where=union > 0)
    return iou

"""BlazeFace's NMS as single operators (``nms = "operator"``): top-k and a gather of the
candidates' rows where the model's outputs are, hard NMS, then MediaPipe's weighted blend of
each cluster on the host.

Per batch of ``n`` frames, on the pipeline's backend (:class:`streamer.runtime.ops.Operators`),
which reads the model's outputs where it left them (on ACL in device memory, read in place;
:mod:`streamer.runtime.ops.views`):

1. **top-k** over each frame's N logits (read as ``(n, N)``), ``k`` = :data:`FIRST_K` first:
   each frame's best ``k`` anchors, best first; only these ``n x k`` values and indices come
   to the host. A frame's candidates (its anchors at or above the score threshold) are the
   first ``c`` of its row. When a frame has ``k`` of them it may have more: top-k runs again
   with twice the ``k`` (at most N), so every candidate of every frame is found. A frame's
   rows past its own ``c`` are padding.
2. **gather** of the candidates' regressor rows (the regressors read as ``(n * N, 16)``: row
   ``i * N + a`` is anchor ``a`` of frame ``i``): only these rows come to the host.
3. host: decode the boxes and keypoints of those anchors only.
4. **NMS** of every frame in one call (:meth:`~streamer.runtime.ops.Operators.nms_each`, IoU
   ``iou_threshold``, ``max_detections`` per frame), on the decoded boxes (uploaded): the
   cluster heads, best first.
5. host: the weighted blend (``NonMaxSuppressionCalculator``, ``algorithm: WEIGHTED``): each
   head, in order, takes every candidate not taken yet whose IoU with it is above
   ``iou_threshold``; the cluster's box and keypoints are the score-weighted mean, its score
   the head's.

Same kind of NMS as the host path (:func:`~streamer.vision.postprocess.weighted_nms.weighted_nms`):
MediaPipe's weighted NMS starts each cluster at the best candidate left once every candidate
whose IoU with an earlier cluster's head is above the threshold is gone, and hard NMS keeps a
box exactly when its IoU with every box kept before it is at most the threshold: the heads are
the boxes hard NMS keeps, in the same order, and ``max_detections`` caps both alike. The
operator NMS decides which boxes start a cluster; the blend only averages.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from streamer.runtime.base import Tensor
from streamer.runtime.ops.base import Operators
from streamer.vision.postprocess.weighted_nms import Found, iou

__all__ = ["FIRST_K", "Decode", "OperatorNms", "blend_clusters"]

FIRST_K = 32
"""The ``k`` of a batch's first top-k (step 1): above the most candidates any frame of the test
media has at the default thresholds (short range 8, full range 5), so one call is the rule and
a second one the exception (0.1 on skimage's cat "chelsea": 208 candidates, four calls)."""

Decode = Callable[[np.ndarray, np.ndarray], tuple[np.ndarray, np.ndarray]]
"""``decode(regressors (M, 16), anchors (M, 2)) -> (boxes (M, 4), keypoints (M, K, 2))``."""


class OperatorNms:
    """Steps 1-5 of the module docstring for one batch. Thread-safe.

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

    def __call__(self, regressors: Tensor, logits: Tensor, frames: int) -> list[Found]:
        """Each frame's clusters.

        Args:
            regressors: float32 (B, N, 16); logits: float32 (B, N, 1); host arrays or device
                tensors of the operators' backend (read in place, not released); B >= frames.
            frames: the batch's real frames, the first ``frames`` rows.

        Returns:
            One :data:`Found` per frame, in model-input pixels.

        Raises:
            FrameError: ``postprocess_failed``: an operator failed.
        """
        if frames == 0:
            return []
        values, order, counts = self._top(logits, frames)
        rows = np.split(self._rows(regressors, order, counts), np.cumsum(counts)[:-1])
        candidates = [
            self._candidates(rows[i], values[i, :c], order[i, :c])
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

    def _top(self, logits: Tensor, frames: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Step 1: each frame's best logits (n, k) and their anchors (n, k), ``k`` large
        enough to hold every frame's candidates, and the candidates per frame (n,)."""
        n_anchors = len(self._anchors)
        k = min(FIRST_K, n_anchors)
        while True:
            values, order = self._operators.top_k(logits, k, shape=(frames, n_anchors))
            counts = (values >= self._logit_threshold).sum(axis=1)
            if k == n_anchors or counts.max() < k:
                return values, order, counts
            k = min(2 * k, n_anchors)

    def _rows(self, regressors: Tensor, order: np.ndarray, counts: np.ndarray) -> np.ndarray:
        """Step 2: the regressor rows of every frame's candidates, frame after frame,
        float32 (sum(counts), 16); no operator call when there is none."""
        n_anchors, width = len(self._anchors), regressors.shape[-1]
        wanted = [i * n_anchors + order[i, :c] for i, c in enumerate(counts.tolist())]
        rows = np.concatenate(wanted)
        if not len(rows):
            return np.zeros((0, width), np.float32)
        return self._operators.gather_rows(regressors, rows, shape=(len(counts) * n_anchors, width))

    def _candidates(
        self, rows: np.ndarray, values: np.ndarray, anchors: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Boxes, keypoints and float64 scores of one frame's candidate anchors, from their
        regressor rows (C, 16), logits (C,) and anchor indices (C,)."""
        boxes, points = self._decode(rows, self._anchors[anchors])
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
    overlaps = iou(boxes[heads], boxes) > iou_threshold
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

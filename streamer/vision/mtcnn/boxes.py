"""Box arithmetic of the MTCNN cascade: NMS, bounding-box regression, the detection schema.

Boxes are float64 (N, 4) corners (x1, y1, x2, y2) in continuous pixel coordinates (a pixel
spans [i, i + 1)), so a box is ``x2 - x1`` wide. The reference implementation (ipazc/mtcnn
0.1, ported from Zhang et al.'s MATLAB code) counts pixels inclusively (``x2 - x1 + 1``); the
difference is under one pixel and below the accuracy of the regression.
"""

from __future__ import annotations

from typing import Any, Literal

import numpy as np

__all__ = ["LABEL", "NmsMethod", "nms", "overlap", "regress", "to_detections"]

LABEL = "face"

NmsMethod = Literal["union", "min"]
"""How :func:`overlap` normalises an intersection: by the union (IoU), or by the smaller box's
area (``'Min'`` in the reference, used after O-Net)."""


def overlap(box: np.ndarray, boxes: np.ndarray, method: NmsMethod) -> np.ndarray:
    """Overlap of one box with each of ``boxes``.

    Args:
        box: float (4,) corners; boxes: float (M, 4) corners; pixels.
        method: ``union`` (intersection / union) or ``min`` (intersection / smaller area).

    Returns:
        float64 (M,) in [0, 1]; 0 where the denominator is 0.
    """
    lo = np.maximum(box[:2], boxes[:, :2])
    hi = np.minimum(box[2:], boxes[:, 2:])
    inter = np.prod(np.clip(hi - lo, 0, None), axis=1)
    area = np.prod(np.clip(box[2:] - box[:2], 0, None))
    areas = np.prod(np.clip(boxes[:, 2:] - boxes[:, :2], 0, None), axis=1)
    denominator = area + areas - inter if method == "union" else np.minimum(area, areas)
    out: np.ndarray = np.divide(
        inter, denominator, out=np.zeros_like(inter, np.float64), where=denominator > 0
    )
    return out


def nms(boxes: np.ndarray, scores: np.ndarray, threshold: float, method: NmsMethod) -> np.ndarray:
    """Greedy non-maximum suppression (ipazc/mtcnn 0.1 ``__nms``).

    The best remaining box is kept and every remaining box whose :func:`overlap` with it is
    above ``threshold`` is dropped, until none remain.

    Args:
        boxes: float (N, 4) corners, pixels.
        scores: float (N,).
        threshold: overlap above which a box is suppressed, 0..1.
        method: see :func:`overlap`.

    Returns:
        int64 (K,) indices of the kept boxes, best score first (ties: lower index first).
    """
    order = np.argsort(-np.asarray(scores), kind="stable")
    keep = []
    while len(order):
        best, rest = order[0], order[1:]
        keep.append(best)
        order = rest[overlap(boxes[best], boxes[rest], method) <= threshold]
    return np.array(keep, np.int64)


def regress(boxes: np.ndarray, offsets: np.ndarray) -> np.ndarray:
    """Bounding-box regression: move each corner by its offset times the box's size.

    ``x1 + dx1 · w, y1 + dy1 · h, x2 + dx2 · w, y2 + dy2 · h`` (the paper's bounding box
    regression, Zhang et al. 2016 §2.1; ipazc/mtcnn 0.1 ``__bbreg``).

    Args:
        boxes: float (N, 4) corners, pixels.
        offsets: float (N, 4) (dx1, dy1, dx2, dy2), fractions of the box's width/height.

    Returns:
        float64 (N, 4) corners, pixels.
    """
    boxes = np.asarray(boxes, np.float64)
    size = boxes[:, 2:] - boxes[:, :2]
    out: np.ndarray = boxes + offsets * np.tile(size, 2)
    return out


def to_detections(
    boxes: np.ndarray,
    scores: np.ndarray,
    keypoints: np.ndarray | None = None,
    clip: tuple[int, int] | None = None,
) -> list[dict[str, Any]]:
    """Detections in streamer's result schema (as :mod:`streamer.vision.postprocess.blazeface`).

    Args:
        boxes: float (N, 4) corners, image pixels.
        scores: float (N,) face probabilities.
        keypoints: float (N, K, 2) (x, y), image pixels, or None for no ``keypoints`` key.
        clip: (width, height) of the image to clip boxes and keypoints to, or None to keep
            them as they are (boxes between stages may extend past the image).

    Returns:
        ``[{"box": [x, y, w, h], "score": s, "label": "face", "keypoints": [[x, y], …]}, …]``
        in input order; coordinates rounded to 2 decimals, scores to 4; boxes that are empty
        (after clipping) are dropped.
    """
    boxes = np.asarray(boxes, np.float64).reshape(-1, 4)
    if clip is not None:
        size = np.array(clip, np.float64)
        boxes = np.concatenate([np.clip(boxes[:, :2], 0, size), np.clip(boxes[:, 2:], 0, size)], 1)
        keypoints = None if keypoints is None else np.clip(keypoints, 0, size)
    detections = []
    for k, (x1, y1, x2, y2) in enumerate(boxes.tolist()):
        if x2 <= x1 or y2 <= y1:
            continue
        detection: dict[str, Any] = {
            "box": [round(x1, 2), round(y1, 2), round(x2 - x1, 2), round(y2 - y1, 2)],
            "score": round(float(scores[k]), 4),
            "label": LABEL,
        }
        if keypoints is not None:
            detection["keypoints"] = [[round(x, 2), round(y, 2)] for x, y in keypoints[k].tolist()]
        detections.append(detection)
    return detections

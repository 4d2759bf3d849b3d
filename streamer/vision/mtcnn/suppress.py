"""Where the MTCNN stages run their NMS: on the host (:func:`.boxes.nms`, image by image) or,
with ``nms = "operator"``, as one single operator over every image of the call on the
pipeline's backend (:meth:`streamer.runtime.ops.Operators.nms_each`: ONNX
``NonMaxSuppression``, padded per image, each image getting exactly its own kept boxes).

Both are the same greedy hard NMS: best score first, ties lower index first, a box dropped
when its IoU with a kept box is above the threshold. The operator computes IoU only
(``union``), so O-Net's ``nms_method = "min"`` (overlap over the smaller box) stays on the host.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from streamer.errors import ConfigError
from streamer.runtime.ops.base import Operators
from streamer.vision.mtcnn.boxes import NmsMethod, nms

__all__ = ["Suppress"]


class Suppress:
    """NMS of several images at once, on the host or as an operator. Thread-safe.

    Args:
        method: how overlap is measured (:data:`.boxes.NmsMethod`).
        operators: the backend's operators for ``nms = "operator"``, or None for the host.

    Raises:
        ConfigError: ``method`` is ``min`` with operators.
    """

    def __init__(self, method: NmsMethod, operators: Operators | None) -> None:
        if operators is not None and method != "union":
            raise ConfigError(
                f'nms: "operator" runs ONNX NonMaxSuppression, which measures IoU only; '
                f'nms_method = "{method}" needs nms = "host", or use nms_method = "union"'
            )
        self._method = method
        self._operators = operators

    def __call__(
        self, boxes: Sequence[np.ndarray], scores: Sequence[np.ndarray], threshold: float
    ) -> list[np.ndarray]:
        """The boxes each image keeps.

        Args:
            boxes: per image, float (M_i, 4) corners, pixels.
            scores: per image, float (M_i,).
            threshold: overlap above which a box is suppressed, 0..1.

        Returns:
            Per image, int64 (K_i,) indices of its kept boxes, best score first.

        Raises:
            FrameError: ``postprocess_failed``: the operator failed.
        """
        if self._operators is None:
            return [nms(b, s, threshold, self._method) for b, s in zip(boxes, scores, strict=True)]
        return self._operators.nms_each(
            [np.asarray(b, np.float32) for b in boxes],
            [np.asarray(s, np.float32) for s in scores],
            threshold,
        )

"""R-Net and O-Net, MTCNN's second and third stages: each re-scores crops of the previous
stage's boxes and refines them; O-Net adds five landmarks.

Both crop the previous boxes squared around their centre (``rerec``), cut from the image with
zero padding where they leave it (``pad``), resized to 24 × 24 (R-Net) or 48 × 48 (O-Net)
(:func:`streamer.vision.crops.crop`). Then, per frame (Zhang et al. 2016 §2.1; ipazc/mtcnn 0.1
``__stage2`` and ``__stage3``):

- R-Net: keep crops whose face probability is > 0.7, NMS (IoU 0.7) on the crop regions, then
  the regression moves each region to its box;
- O-Net: keep crops whose face probability is > 0.7, the regression moves each region to its
  box, the landmarks are placed in the region, then NMS (0.7, overlap over the smaller box:
  the reference's ``'Min'``) on the boxes.

A regression offset or landmark is a fraction of the crop region, so it maps to image pixels
through the crop's :class:`streamer.vision.crops.CropTransform`, whichever adapter made it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar

import numpy as np
from pydantic import Field

from streamer.runtime.ops.base import Operators
from streamer.vision.crops import CropTransform, crop, detection_boxes
from streamer.vision.mtcnn.boxes import NmsMethod, regress, to_detections
from streamer.vision.mtcnn.layout import (
    LANDMARKS,
    PROBABILITY,
    REGRESSION,
    InputParams,
    split_outputs,
    to_input,
)
from streamer.vision.mtcnn.suppress import Suppress
from streamer.vision.nms_place import NmsPlace, operators_for

__all__ = ["KEYPOINTS", "ONet", "ONetParams", "RNet", "RNetParams"]

KEYPOINTS = ("left_eye", "right_eye", "nose", "mouth_left", "mouth_right")
"""O-Net's landmarks in output order, named as in ipazc/mtcnn: left and right as seen in the
image (the subject's right eye is ``left_eye``)."""


class RNetParams(InputParams):
    """R-Net's parameters; defaults are the reference's.

    Attributes:
        normalize: where the input normalisation happens (:class:`.layout.InputParams`).
        score_threshold: a crop is kept when its face probability is above this.
        nms_threshold: IoU above which a kept crop is suppressed by a better one.
        nms: ``host``, or ``operator``: NMS as a single operator on the pipeline's backend
            (:mod:`.suppress`).
    """

    score_threshold: float = Field(0.7, ge=0, le=1)
    nms_threshold: float = Field(0.7, ge=0, le=1)
    nms: NmsPlace = "host"


class ONetParams(InputParams):
    """O-Net's parameters; defaults are the reference's.

    Attributes:
        normalize: where the input normalisation happens (:class:`.layout.InputParams`).
        score_threshold: a crop is kept when its face probability is above this.
        nms_threshold: overlap above which a box is suppressed by a better one.
        nms_method: ``min`` (intersection over the smaller box, the reference) or ``union``.
        nms: ``host``, or ``operator``: NMS as a single operator on the pipeline's backend,
            which takes ``nms_method = "union"`` (:mod:`.suppress`).
    """

    score_threshold: float = Field(0.7, ge=0, le=1)
    nms_threshold: float = Field(0.7, ge=0, le=1)
    nms_method: NmsMethod = "min"
    nms: NmsPlace = "host"


class _Refine:
    """What R-Net and O-Net share: square crops of ``size`` pixels in, scores out."""

    size: ClassVar[int]
    name: ClassVar[str]
    params: InputParams

    def prepare(
        self, image: np.ndarray, detections: Sequence[dict[str, Any]]
    ) -> tuple[np.ndarray, list[CropTransform]]:
        """The model inputs for one frame's boxes: square crops, MTCNN's layout.

        Args:
            image: the decoded frame, BGR uint8 (H, W, 3).
            detections: the previous stage's detections, ``box`` [x, y, w, h], pixels.

        Returns:
            (N, size, size, 3) inputs as ``normalize`` wants them (:func:`.layout.to_input`:
            float32, or uint8 BGR), N = ``len(detections)``, and each crop's transform.

        Raises:
            FrameError: ``preprocess_failed`` when a box is not 4 finite numbers.
        """
        crops, transforms = crop(
            image, detection_boxes(detections), (self.size, self.size), square=True
        )
        return to_input(crops, self.params.normalize), transforms

    def _scored(
        self, probabilities: np.ndarray, transforms: Sequence[CropTransform], threshold: float
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(indices, regions (K, 4), scores (K,)) of the crops scoring above ``threshold``."""
        scores = probabilities[:, 1].astype(np.float64)
        kept = np.flatnonzero(scores > threshold)
        regions = np.array([transforms[k].region for k in kept.tolist()]).reshape(-1, 4)
        return kept, regions, scores[kept]


class RNet(_Refine):
    """The R-Net stage. Thread-safe (read-only after construction).

    Args:
        params: validated :class:`RNetParams`.
        operators: the pipeline backend's operators, for ``nms = "operator"``.

    Raises:
        ConfigError: ``nms = "operator"`` without operators.
    """

    size = 24
    name = "rnet"
    params: RNetParams

    def __init__(
        self, params: RNetParams | None = None, operators: Operators | None = None
    ) -> None:
        self.params = params or RNetParams()
        self._suppress = Suppress("union", operators_for(self.params.nms, operators))

    def finish(
        self, outputs: Sequence[np.ndarray], transforms: Sequence[CropTransform]
    ) -> list[dict[str, Any]]:
        """One frame's refined boxes from R-Net's outputs for all of that frame's crops.

        Args:
            outputs: R-Net's outputs for the frame's N crops, batch first (see
                :mod:`.layout`); rows past ``len(transforms)`` are ignored.
            transforms: the N crops' transforms, from :meth:`prepare` or a crops adapter.

        Returns:
            Boxes in the detection schema (image pixels, not clipped), best first.

        Raises:
            FrameError: ``postprocess_failed`` when the outputs do not have R-Net's layout.
        """
        offsets, probabilities = split_outputs(
            outputs, (REGRESSION, PROBABILITY), len(transforms), self.name
        )
        kept, regions, scores = self._scored(probabilities, transforms, self.params.score_threshold)
        (order,) = self._suppress([regions], [scores], self.params.nms_threshold)
        boxes = regress(regions[order], offsets[kept][order])
        return to_detections(boxes, scores[order])


class ONet(_Refine):
    """The O-Net stage. Thread-safe (read-only after construction).

    Args:
        params: validated :class:`ONetParams`.
        operators: the pipeline backend's operators, for ``nms = "operator"``.

    Raises:
        ConfigError: ``nms = "operator"`` without operators, or with ``nms_method = "min"``.
    """

    size = 48
    name = "onet"
    params: ONetParams

    def __init__(
        self, params: ONetParams | None = None, operators: Operators | None = None
    ) -> None:
        self.params = params or ONetParams()
        self._suppress = Suppress(self.params.nms_method, operators_for(self.params.nms, operators))

    def finish(
        self, outputs: Sequence[np.ndarray], transforms: Sequence[CropTransform]
    ) -> list[dict[str, Any]]:
        """One frame's faces from O-Net's outputs for all of that frame's crops.

        Args:
            outputs: O-Net's outputs for the frame's N crops, batch first (see
                :mod:`.layout`); rows past ``len(transforms)`` are ignored.
            transforms: the N crops' transforms, from :meth:`prepare` or a crops adapter.

        Returns:
            Faces in the detection schema, best first: ``box`` [x, y, w, h], ``score``,
            ``label`` ``face`` and ``keypoints``, five [x, y] in :data:`KEYPOINTS` order; image
            pixels, clipped to the image, rounded to 2 decimals (score to 4).

        Raises:
            FrameError: ``postprocess_failed`` when the outputs do not have O-Net's layout.
        """
        offsets, landmarks, probabilities = split_outputs(
            outputs, (REGRESSION, LANDMARKS, PROBABILITY), len(transforms), self.name
        )
        kept, regions, scores = self._scored(probabilities, transforms, self.params.score_threshold)
        if not len(kept):
            return []
        boxes = regress(regions, offsets[kept])
        points = _landmarks(regions, landmarks[kept])
        (order,) = self._suppress([boxes], [scores], self.params.nms_threshold)
        size = (transforms[0].image_width, transforms[0].image_height)
        return to_detections(boxes[order], scores[order], points[order], clip=size)


def _landmarks(regions: np.ndarray, landmarks: np.ndarray) -> np.ndarray:
    """Landmarks in image pixels (ipazc/mtcnn 0.1 ``__stage3``).

    Args:
        regions: float (K, 4) crop regions (x1, y1, x2, y2), image pixels.
        landmarks: float (K, 10): x of the five points, then their y, as fractions of the
            region's width and height.

    Returns:
        float64 (K, 5, 2) (x, y), image pixels.
    """
    fractions = np.stack([landmarks[:, :5], landmarks[:, 5:]], axis=2)
    origin, size = regions[:, None, :2], regions[:, None, 2:] - regions[:, None, :2]
    out: np.ndarray = origin + fractions * size
    return out

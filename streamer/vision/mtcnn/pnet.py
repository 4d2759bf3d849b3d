"""P-Net, MTCNN's first stage: an image pyramid in fixed resolution gears, and face proposals.

**Pyramid** (Zhang et al. 2016 §2.1; ipazc/mtcnn 0.1 ``__compute_scale_pyramid``): P-Net looks
at 12 × 12 windows with a stride of 2, so an image is scaled by ``12 / min_face_px`` (the
smallest face to find then fills one window) and again by ``factor`` (0.709 ≈ 1/√2: each level
halves the area) while its shorter side is still >= 12 pixels.

**Gears**: one pyramid is computed once, for the configured ``max_size`` (a canvas of
``max_height`` × ``max_width`` pixels), and each level is a gear: a fixed P-Net input of
``ceil(max_height · scale)`` × ``ceil(max_width · scale)`` pixels. Every frame's level *k* has
the same shape, so the pipeline batches it across frames. An image of H × W pixels is fitted
into the canvas by ``fit = min(1, max_height / H, max_width / W)`` (never enlarged, so
``min_face_px`` keeps its meaning; larger images find faces from ``min_face_px / fit``), and in
gear *k* it is resized by ``fit · scale_k`` (each side rounded) and placed at the top-left;
the rest of the gear is zero (mid-grey after normalisation; :data:`.layout.PIXEL_PAD` when the
model normalises, ``normalize`` ``model`` / ``device``). Gears that would scale the image's
shorter side under 12 pixels are skipped: for an image no larger than the canvas this is the
reference's pyramid exactly. Proposals whose window reaches into the padding are discarded,
so the padding never makes a proposal. Each gear's :class:`LetterboxTransform` (padding 0,
``scale = fit · scale_k``) maps gear pixels back to image pixels.

**Proposals** (ipazc/mtcnn 0.1 ``__generate_bounding_box`` and ``__stage1``): heatmap cell
(i, j) (i along x: P-Net's outputs are transposed, see :mod:`.layout`) is the window
``[2i, 2i + 12) × [2j, 2j + 12)`` of its gear; cells with a face probability >= 0.6 become
candidates with their window, score and regression offsets, and NMS (IoU 0.5) runs per gear.
Then, per frame, NMS (IoU 0.7) across the gears, and the regression moves each window to its
proposal box. The next stage squares the boxes when it crops them (:mod:`.refine`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import cv2
import numpy as np
from pydantic import Field

from streamer.errors import ConfigError
from streamer.runtime.ops.base import Operators
from streamer.vision.mtcnn.boxes import regress, to_detections
from streamer.vision.mtcnn.layout import (
    PIXEL_PAD,
    PROBABILITY,
    REGRESSION,
    InputParams,
    Normalize,
    split_outputs,
    to_input,
    to_tensor,
)
from streamer.vision.mtcnn.suppress import Suppress
from streamer.vision.nms_place import NmsPlace, operators_for
from streamer.vision.preprocess import LetterboxTransform

__all__ = [
    "CELL",
    "MAX_LEVEL_PIXELS",
    "STRIDE",
    "Candidates",
    "Gear",
    "PNet",
    "PNetParams",
    "pnet_gears",
    "pyramid_scales",
]

CELL = 12
"""P-Net's window: the side of the square one heatmap cell sees, gear pixels."""
STRIDE = 2
"""Gear pixels between neighbouring heatmap cells."""


def pyramid_scales(
    height: int, width: int, min_face_px: float = 20.0, factor: float = 0.709
) -> tuple[float, ...]:
    """The scales of MTCNN's image pyramid for an image of ``height`` × ``width`` pixels.

    Args:
        height, width: image size, pixels.
        min_face_px: the smallest face to detect, pixels (the reference's ``min_face_size``).
        factor: ratio between consecutive scales, 0 < factor < 1.

    Returns:
        ``(12 / min_face_px) · factor ** k`` for k = 0, 1, … while ``min(height, width)`` times
        the scale is >= 12; largest first; empty when the image is too small.
    """
    first = CELL / min_face_px
    count = 0
    while min(height, width) * first * factor**count >= CELL:
        count += 1
    return tuple(first * factor**k for k in range(count))


@dataclass(frozen=True, slots=True)
class Gear:
    """One fixed P-Net input size: a pyramid level of the canvas.

    Attributes:
        scale: gear pixels per canvas pixel.
        height, width: the gear's size in image orientation, pixels.
    """

    scale: float
    height: int
    width: int

    @property
    def input_shape(self) -> tuple[int, int, int]:
        """The P-Net input of this gear without the batch axis: (width, height, 3) (what the
        host sends with ``normalize`` ``host`` and ``device``; (height, width, 3) with
        ``model``)."""
        return (self.width, self.height, 3)


MAX_LEVEL_PIXELS = 40_000_000
"""The largest pyramid level a P-Net stage builds, pixels: as many as the largest image an
ingress takes by default (``max_pixels``). A canvas of [100000, 100000] made a level of
60000 x 60000 (40 GiB for every frame: MemoryError), ``min_face_px = 1`` one 144 times the
canvas."""


def pnet_gears(
    max_height: int, max_width: int, min_face_px: float = 20.0, factor: float = 0.709
) -> tuple[Gear, ...]:
    """The gears of a ``max_height`` × ``max_width`` canvas, largest first (module docstring).

    Args:
        max_height, max_width: the canvas, pixels.
        min_face_px, factor: see :func:`pyramid_scales`.
    """
    return tuple(
        Gear(scale, math.ceil(max_height * scale), math.ceil(max_width * scale))
        for scale in pyramid_scales(max_height, max_width, min_face_px, factor)
    )


class PNetParams(InputParams):
    """P-Net's parameters; defaults are the reference's.

    Attributes:
        normalize: where the input normalisation happens (:class:`.layout.InputParams`).
        max_size: (height, width) of the canvas the gears are built for, pixels.
        min_face_px: smallest face to detect in an image that fits the canvas, pixels
            (>= 1: P-Net's 12-pixel window on the image enlarged 12 / min_face_px times).
        factor: ratio between pyramid scales, at most 0.95 (closer to 1, the levels, and
            the time and memory they take, grow without bound).
        score_threshold: minimum face probability of a heatmap cell.
        gear_nms: IoU above which candidates of one gear are suppressed.
        merge_nms: IoU above which candidates of all gears are suppressed.
        nms: ``host``, or ``operator``: both NMS as single operators on the pipeline's
            backend, the per-gear one over every item of a batch in one call
            (:mod:`.suppress`).
    """

    max_size: tuple[int, int] = (480, 640)
    min_face_px: float = Field(20.0, ge=1)
    factor: float = Field(0.709, gt=0, le=0.95)
    score_threshold: float = Field(0.6, ge=0, le=1)
    gear_nms: float = Field(0.5, ge=0, le=1)
    merge_nms: float = Field(0.7, ge=0, le=1)
    nms: NmsPlace = "host"


@dataclass(frozen=True, slots=True)
class Candidates:
    """One gear's proposals for one frame, before regression.

    Attributes:
        windows: float64 (K, 4) corners (x1, y1, x2, y2) of the 12 × 12 windows, image pixels.
        scores: float (K,) face probabilities.
        offsets: float (K, 4) regression (dx1, dy1, dx2, dy2), fractions of the window size.
    """

    windows: np.ndarray
    scores: np.ndarray
    offsets: np.ndarray


class PNet:
    """The P-Net stage: gears in, proposals out. Thread-safe (read-only after construction).

    Args:
        params: validated :class:`PNetParams`.
        operators: the pipeline backend's operators, for ``nms = "operator"``.

    Raises:
        ConfigError: ``max_size`` gives no gear (its shorter side is under ``min_face_px``);
            ``nms = "operator"`` without operators.
    """

    def __init__(
        self, params: PNetParams | None = None, operators: Operators | None = None
    ) -> None:
        self.params = params or PNetParams()
        self._suppress = Suppress("union", operators_for(self.params.nms, operators))
        self.max_height, self.max_width = self.params.max_size
        self.gears = pnet_gears(
            self.max_height, self.max_width, self.params.min_face_px, self.params.factor
        )
        if not self.gears:
            raise ConfigError(
                f"max_size: {list(self.params.max_size)} is smaller than min_face_px "
                f"{self.params.min_face_px}: no pyramid level"
            )
        largest = self.gears[0]
        if largest.height * largest.width > MAX_LEVEL_PIXELS:
            raise ConfigError(
                f"max_size {list(self.params.max_size)} with min_face_px "
                f"{self.params.min_face_px} makes a first pyramid level of "
                f"{largest.width}x{largest.height} pixels (the canvas enlarged "
                f"{largest.scale:.3g} times), more than {MAX_LEVEL_PIXELS:,}: every frame would "
                "take that memory and time; use a smaller max_size or a larger min_face_px"
            )

    def prepare(self, image: np.ndarray) -> tuple[list[np.ndarray], list[LetterboxTransform]]:
        """One P-Net input per gear the image uses (module docstring), largest first.

        Args:
            image: BGR uint8 (H, W, 3).

        Returns:
            Tensors, the k-th of shape ``self.gears[k].input_shape`` (W_k, H_k, 3), float32
            (or uint8 BGR with ``normalize = "device"``; uint8 BGR (H_k, W_k, 3) with
            ``"model"``: :func:`.layout.to_input`), and each one's transform from gear pixels
            to image pixels. Empty when the image is too small for any gear (under
            ``min_face_px`` on its shorter side).
        """
        h, w = image.shape[:2]
        fit = min(1.0, self.max_height / h, self.max_width / w)
        tensors, transforms = [], []
        for gear in self.gears:
            if min(h, w) * fit * gear.scale < CELL:
                break
            t = LetterboxTransform(fit * gear.scale, 0, 0, gear.width, gear.height, w, h)
            tensors.append(_gear_tensor(image, gear, t, self.params.normalize))
            transforms.append(t)
        return tensors, transforms

    def decode(
        self, outputs: Sequence[np.ndarray], transforms: Sequence[LetterboxTransform]
    ) -> list[Candidates]:
        """Candidates of each item of one P-Net batch (items of one gear, any frames).

        Args:
            outputs: P-Net's outputs, batch first (see :mod:`.layout`); rows past
                ``len(transforms)`` (batch padding) are ignored.
            transforms: each item's transform, from :meth:`prepare`.

        Returns:
            One :class:`Candidates` per item, after the per-gear NMS.

        Raises:
            FrameError: ``postprocess_failed`` when the outputs do not have P-Net's layout.
        """
        offsets, probabilities = split_outputs(
            outputs, (REGRESSION, PROBABILITY), len(transforms), "pnet"
        )
        cells = [
            self._candidates(probabilities[k, :, :, 1], offsets[k], t)
            for k, t in enumerate(transforms)
        ]
        keeps = self._suppress(
            [grid for _, grid in cells], [c.scores for c, _ in cells], self.params.gear_nms
        )
        return [
            Candidates(c.windows[keep], c.scores[keep], c.offsets[keep])
            for (c, _), keep in zip(cells, keeps, strict=True)
        ]

    def merge(self, candidates: Sequence[Candidates]) -> list[dict[str, Any]]:
        """One frame's proposals from the candidates of all its gears.

        Args:
            candidates: the frame's :class:`Candidates`, one per gear (any order).

        Returns:
            Proposals in the detection schema (``box`` [x, y, w, h] in image pixels, not
            clipped: a box may extend past the image; ``score``; ``label``), best first.
        """
        if not candidates:
            return []
        windows = np.concatenate([c.windows for c in candidates])
        scores = np.concatenate([c.scores for c in candidates])
        offsets = np.concatenate([c.offsets for c in candidates])
        (keep,) = self._suppress([windows], [scores], self.params.merge_nms)
        return to_detections(regress(windows[keep], offsets[keep]), scores[keep])

    def _candidates(
        self, face: np.ndarray, offsets: np.ndarray, transform: LetterboxTransform
    ) -> tuple[Candidates, np.ndarray]:
        """Candidates of one gear, before NMS, from its (w, h) face probabilities and
        (w, h, 4) offsets; and their windows in gear pixels, (K, 4) integers, where IoU is
        exact in float32 and float64 alike (the gear NMS runs on them: a tie with the
        threshold, common on the stride-2 grid, is then decided the same way on the host and
        by an operator)."""
        cols = (transform.resized_width - CELL) // STRIDE + 1
        rows = (transform.resized_height - CELL) // STRIDE + 1
        face = face[:cols, :rows]  # cells whose window lies inside the resized image
        xi, yi = np.nonzero(face >= self.params.score_threshold)
        corners = np.stack([xi, yi, xi, yi], axis=1) * STRIDE + (0, 0, CELL, CELL)
        windows = transform.to_image(corners.reshape(-1, 2, 2)).reshape(-1, 4)
        return Candidates(windows, face[xi, yi], offsets[xi, yi]), corners


def _gear_tensor(
    image: np.ndarray, gear: Gear, transform: LetterboxTransform, normalize: Normalize
) -> np.ndarray:
    """The P-Net input of one gear: the resized image at the top-left, zeros elsewhere (on
    the host only the image is normalised), or :data:`PIXEL_PAD` when the model normalises."""
    size = (transform.resized_width, transform.resized_height)
    interpolation = cv2.INTER_AREA if transform.scale < 1 else cv2.INTER_LINEAR
    resized = cv2.resize(image, size, interpolation=interpolation)
    if normalize == "host":
        tensor = np.zeros(gear.input_shape, np.float32)
        tensor[: size[0], : size[1]] = to_tensor(resized)
        return tensor
    pixels = np.full((gear.height, gear.width, 3), PIXEL_PAD, np.uint8)
    pixels[: size[1], : size[0]] = resized
    return to_input(pixels, normalize)

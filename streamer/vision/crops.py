"""Crops: a decoded image and its detections → one fixed-size crop per detection.

This is the ``crops`` chain adapter (issue 5): a downstream model (O-Net, a classifier) runs on
the regions an upstream detector found, batched across detections and frames. Geometry, in
continuous pixel coordinates of the decoded image (a pixel spans [i, i + 1), x right, y down):

1. ``box`` ``[x, y, w, h]`` gives the corners ``(x, y)`` and ``(x + w, y + h)``;
2. ``margin``: each side moves out by ``margin`` times the box's size along that axis;
3. ``square``: the shorter side grows to the longer one around the centre (MTCNN's ``rerec``:
   Zhang et al. 2016, "Joint Face Detection and Alignment using Multi-task Cascaded
   Convolutional Networks", and ipazc/mtcnn ``__rerec``), so the face keeps its aspect;
4. the top-left corner and the size are rounded to whole pixels (apart, so a square stays
   square), giving the region ``[x1, x2) × [y1, y2)`` of at least 1 pixel each way (MTCNN
   truncates its boxes to integers before cropping);
5. the region is cut from the image; where it leaves the image it is filled with zeros (black,
   as MTCNN's ``pad``), so the crop keeps the region's geometry;
6. the cut is resized to the model's (height, width), ``cv2.INTER_AREA`` when shrinking,
   ``cv2.INTER_LINEAR`` otherwise (as :mod:`streamer.vision.preprocess`).

A region whose zero-padded cut would hold more than four times the image's pixels (and more
than 65536: the square of an 8192 x 1 strip holds 67 million for its 8192) is not cut whole:
the part inside the image is resized straight to its place in the black crop, which is the
same geometry within a pixel at the image's edge, and costs the image's pixels rather than the
region's (an 8192 x 1 frame would otherwise cost a 200 MB cut and its resize).

A :class:`CropTransform` per crop maps crop coordinates back to image pixels. Config::

    margin = 0.0       # fraction of the box size added on each side, >= 0
    square = false     # expand the shorter side to a square around the centre
    # size = [h, w]    # required only when the downstream model's height/width are dynamic

Pure functions of their arguments: thread-safe, called on the decode worker pool.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import cv2
import numpy as np
from pydantic import Field

from streamer.errors import ConfigError, FrameError, Reason
from streamer.runtime.base import ModelInfo
from streamer.vision.preprocess import input_size
from streamer.vision.registry import PluginParams

__all__ = ["CropParams", "CropTransform", "Crops", "crop", "crop_regions", "detection_boxes"]

_MAX_PADDED_CUT_RATIO = 4
"""Largest zero-padded cut, in image pixels (and at least ``_MIN_PADDED_CUT_PX``), that is
cut whole; a larger region's in-image part is resized into its place instead."""
_MIN_PADDED_CUT_PX = 1 << 16


class CropParams(PluginParams):
    """Parameters of the ``crops`` adapter (see the module docstring)."""

    margin: float = Field(0.0, ge=0, description="fraction of the box size added on each side")
    square: bool = Field(False, description="expand the shorter side to a square (centred)")
    size: tuple[int, int] | None = Field(None, description="(height, width) for dynamic inputs")


@dataclass(frozen=True, slots=True)
class CropTransform:
    """Where one crop came from; maps coordinates between the crop and the image.

    The region ``[x1, x2) × [y1, y2)`` of the image (pixels; it may extend past the image,
    where the crop is black) was resized to ``input_width`` × ``input_height``. It has the
    coordinate methods of :class:`streamer.vision.preprocess.LetterboxTransform`, so a
    postprocessor can take either.

    Attributes:
        x1, y1, x2, y2: the region's corners, image pixels (integers, ``x2 > x1``, ``y2 > y1``).
        input_width, input_height: the crop's size, pixels.
        image_width, image_height: the decoded image's size, pixels.
    """

    x1: int
    y1: int
    x2: int
    y2: int
    input_width: int
    input_height: int
    image_width: int
    image_height: int

    @property
    def region(self) -> np.ndarray:
        """float64 (4,): the region's corners (x1, y1, x2, y2), image pixels."""
        return np.array([self.x1, self.y1, self.x2, self.y2], np.float64)

    def to_image(self, xy: np.ndarray) -> np.ndarray:
        """Map crop pixel coordinates to image pixels; float (..., 2) (x, y) → float64 (..., 2)."""
        return self.normalized_to_image(np.asarray(xy, np.float64) / self._input_size())

    def normalized_to_image(self, xy: np.ndarray) -> np.ndarray:
        """Map crop coordinates normalised to 0..1 (0 and 1 are the region's edges) to image
        pixels; float (..., 2) (x, y) → float64 (..., 2), not clipped."""
        out: np.ndarray = self.region[:2] + np.asarray(xy, np.float64) * self._region_size()
        return out

    def to_input(self, xy: np.ndarray) -> np.ndarray:
        """Map image pixel coordinates to crop pixels; float (..., 2) → float64 (..., 2)."""
        unit = (np.asarray(xy, np.float64) - self.region[:2]) / self._region_size()
        out: np.ndarray = unit * self._input_size()
        return out

    def _region_size(self) -> np.ndarray:
        return np.array([self.x2 - self.x1, self.y2 - self.y1], np.float64)

    def _input_size(self) -> np.ndarray:
        return np.array([self.input_width, self.input_height], np.float64)


def detection_boxes(detections: Sequence[dict[str, Any]]) -> np.ndarray:
    """The ``box`` of each detection as float64 (N, 4) ``[x, y, w, h]``, image pixels.

    Raises:
        FrameError: ``preprocess_failed`` when a box is not 4 finite numbers.
    """
    try:
        boxes = np.array([d["box"] for d in detections], np.float64).reshape(-1, 4)
    except (KeyError, TypeError, ValueError) as exc:
        raise FrameError(Reason.PREPROCESS_FAILED, f"crops: bad detection box: {exc}") from exc
    if len(boxes) != len(detections) or not np.isfinite(boxes).all():
        raise FrameError(Reason.PREPROCESS_FAILED, "crops: boxes must be 4 finite numbers")
    return boxes


def crop_regions(boxes: np.ndarray, margin: float = 0.0, square: bool = False) -> np.ndarray:
    """Steps 1–4 of the module docstring: boxes → whole-pixel regions.

    Args:
        boxes: float (N, 4) ``[x, y, w, h]``, image pixels.
        margin: fraction of the box size added on each side, >= 0.
        square: expand the shorter side to the longer one around the centre.

    Returns:
        int64 (N, 4) regions (x1, y1, x2, y2), image pixels, ``x2 > x1`` and ``y2 > y1``.
    """
    boxes = np.asarray(boxes, np.float64).reshape(-1, 4)
    size = boxes[:, 2:] * (1 + 2 * margin)
    if square:
        size = np.repeat(size.max(axis=1, keepdims=True), 2, axis=1)
    centre = boxes[:, :2] + boxes[:, 2:] / 2
    low = np.floor(centre - size / 2 + 0.5)  # corner and size rounded apart: squares stay square
    whole = np.maximum(np.floor(size + 0.5), 1)
    return np.concatenate([low, low + whole], axis=1).astype(np.int64)


def crop(
    image: np.ndarray,
    boxes: np.ndarray,
    size: tuple[int, int],
    margin: float = 0.0,
    square: bool = False,
) -> tuple[np.ndarray, list[CropTransform]]:
    """Cut one crop per box out of ``image`` (the module docstring's steps 1–6).

    Args:
        image: uint8 (H, W, C), e.g. BGR (H, W, 3) from :func:`streamer.vision.decode.decode_image`.
        boxes: float (N, 4) ``[x, y, w, h]``, image pixels; N may be 0.
        size: (height, width) of each crop, pixels.
        margin: fraction of the box size added on each side, >= 0.
        square: expand the shorter side to the longer one around the centre.

    Returns:
        The crops, ``image.dtype`` (N, height, width, C), C-contiguous, and each crop's
        transform back to image pixels.
    """
    height, width = size
    image_h, image_w = image.shape[:2]
    regions = crop_regions(boxes, margin, square)
    crops = np.empty((len(regions), height, width, *image.shape[2:]), image.dtype)
    transforms = []
    largest_cut = max(_MAX_PADDED_CUT_RATIO * image_h * image_w, _MIN_PADDED_CUT_PX)
    for k, (x1, y1, x2, y2) in enumerate(regions.tolist()):
        if (x2 - x1) * (y2 - y1) > largest_cut:  # leaves the image: a region inside fits
            crops[k] = 0
            _place(image, (x1, y1, x2, y2), crops[k])
        else:
            cut = _cut(image, x1, y1, x2, y2)
            resized = cv2.resize(cut, (width, height), interpolation=_interpolation(cut, size))
            crops[k] = resized.reshape(crops.shape[1:])  # cv2 drops a single channel's axis
        transforms.append(CropTransform(x1, y1, x2, y2, width, height, image_w, image_h))
    return crops, transforms


def _interpolation(cut: np.ndarray, size: tuple[int, int]) -> int:
    """``cv2.INTER_AREA`` when ``cut`` shrinks to ``size`` (height, width) both ways, else
    ``cv2.INTER_LINEAR``."""
    shrink = cut.shape[0] >= size[0] and cut.shape[1] >= size[1]
    return cv2.INTER_AREA if shrink else cv2.INTER_LINEAR


def _inside(image: np.ndarray, x1: int, y1: int, x2: int, y2: int) -> bool:
    h, w = image.shape[:2]
    return x1 >= 0 and y1 >= 0 and x2 <= w and y2 <= h


def _place(image: np.ndarray, region: tuple[int, int, int, int], out: np.ndarray) -> None:
    """Write the crop of ``region`` (x1, y1, x2, y2) into ``out`` (zeros, (height, width)
    or (height, width, C)) without cutting the padded region: the part inside the image is
    resized to the crop pixels it reaches, those it covers only in part dimmed by the fraction
    covered (as the area average of the padded cut would), so a sliver of the image stays a
    faint line and costs no more than its own pixels."""
    x1, y1, x2, y2 = region
    h, w = image.shape[:2]
    height, width = out.shape[:2]
    ix1, iy1, ix2, iy2 = max(x1, 0), max(y1, 0), min(x2, w), min(y2, h)
    if ix2 <= ix1 or iy2 <= iy1:
        return
    fx, fy = width / (x2 - x1), height / (y2 - y1)
    ax1, ax2, ay1, ay2 = (ix1 - x1) * fx, (ix2 - x1) * fx, (iy1 - y1) * fy, (iy2 - y1) * fy
    ox1, ox2 = math.floor(ax1), min(math.ceil(ax2), width)
    oy1, oy2 = math.floor(ay1), min(math.ceil(ay2), height)
    part = image[iy1:iy2, ix1:ix2]
    size = (oy2 - oy1, ox2 - ox1)
    resized = cv2.resize(part, size[::-1], interpolation=_interpolation(part, size))
    cover = np.outer(_coverage(ay1, ay2, oy1, oy2), _coverage(ax1, ax2, ox1, ox2))
    cover = cover.reshape(*size, *(1,) * (out.ndim - 2))
    out[oy1:oy2, ox1:ox2] = np.rint(resized.reshape(cover.shape[:2] + out.shape[2:]) * cover)


def _coverage(start: float, stop: float, first: int, end: int) -> np.ndarray:
    """float64 (end - first,): the fraction of each pixel ``first .. end - 1`` that the span
    [start, stop) covers."""
    pixels = np.arange(first, end, dtype=np.float64)
    return np.clip(np.minimum(stop, pixels + 1) - np.maximum(start, pixels), 0.0, 1.0)


def _cut(image: np.ndarray, x1: int, y1: int, x2: int, y2: int) -> np.ndarray:
    """The region [x1, x2) × [y1, y2) of ``image``: a view when inside it, else a zero-padded
    copy of the same size."""
    h, w = image.shape[:2]
    if _inside(image, x1, y1, x2, y2):
        return image[y1:y2, x1:x2]
    out = np.zeros((y2 - y1, x2 - x1, *image.shape[2:]), image.dtype)
    ix1, iy1, ix2, iy2 = max(x1, 0), max(y1, 0), min(x2, w), min(y2, h)
    if ix2 > ix1 and iy2 > iy1:
        out[iy1 - y1 : iy2 - y1, ix1 - x1 : ix2 - x1] = image[iy1:iy2, ix1:ix2]
    return out


class Crops:
    """The ``crops`` adapter for the downstream model described by ``info``.

    Thread-safe (it holds only its parameters).

    Args:
        params: validated :class:`CropParams`.
        info: the downstream model; its first input is 4-D, NCHW when its dim 1 is 3, NHWC
            otherwise, and gives the crop size unless ``params.size`` does.

    Raises:
        ConfigError: the first input is not 4-D, or its height/width are dynamic and ``size``
            is not set, or ``size`` disagrees with a static size.
    """

    def __init__(self, params: CropParams, info: ModelInfo) -> None:
        self.margin = params.margin
        self.square = params.square
        self.size = _crop_size(params, info)

    def __call__(
        self, image: np.ndarray, detections: Sequence[dict[str, Any]]
    ) -> tuple[np.ndarray, list[CropTransform]]:
        """Crops of one frame's detections; see :func:`crop`.

        Args:
            image: the decoded frame, BGR uint8 (H, W, 3).
            detections: the upstream detections, each with a ``box`` ``[x, y, w, h]``, pixels.

        Returns:
            uint8 (N, height, width, 3) crops (BGR) and their transforms, N = len(detections).

        Raises:
            FrameError: ``preprocess_failed`` when a box is not 4 finite numbers.
        """
        boxes = detection_boxes(detections)
        return crop(image, boxes, self.size, self.margin, self.square)


def _crop_size(params: CropParams, info: ModelInfo) -> tuple[int, int]:
    """(height, width) of the crops for the model ``info``.

    Raises:
        ConfigError: see :class:`Crops`.
    """
    if not info.inputs or len(info.inputs[0].shape) != 4:
        raise ConfigError(f"model {info.name!r}: crops need a 4-D image input")
    tensor = info.inputs[0]
    h, w = tensor.shape[2:4] if tensor.shape[1] == 3 else tensor.shape[1:3]
    return input_size(params.size, tensor.name, h, w)

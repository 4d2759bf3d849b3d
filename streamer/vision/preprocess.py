"""Preprocessors: one decoded BGR image → one model input tensor (no batch axis).

A :class:`Preprocessor` runs on the decode worker pool, one frame per call, and must be
thread-safe (the built-ins hold only read-only tables). It returns the tensor and the
:class:`LetterboxTransform` that the postprocessor uses to map results back to the image.

The built-in ``letterbox`` preprocessor (MediaPipe's ``ImageToTensorCalculator`` with
``keep_aspect_ratio: true`` does the same for BlazeFace) resizes the image to fit the model's
input, keeping its aspect ratio, centres it and pads the borders::

    [models.preprocess]
    kind = "letterbox"
    color = "rgb"        # channel order the model wants: "rgb" (default) | "bgr"
    mean = 0.5           # per channel on the 0..1 scale: a number or [c0, c1, c2]
    std = 0.5            # idem; (x / 255 - mean) / std, so 0.5 / 0.5 gives [-1, 1]
    pad_value = 0        # border pixel value, 0..255, before normalisation
    layout = "NCHW"      # the model input's layout: "NCHW" (default) | "NHWC"
    # size = [h, w]      # required only when the model's input height/width are dynamic
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Protocol

import cv2
import numpy as np
from pydantic import Field

from streamer.errors import ConfigError
from streamer.runtime.base import ModelInfo
from streamer.vision.registry import PREPROCESSORS, PluginParams

__all__ = ["Letterbox", "LetterboxParams", "LetterboxTransform", "Preprocessor"]


@dataclass(frozen=True, slots=True)
class LetterboxTransform:
    """Where an image was placed inside the model input; maps coordinates both ways.

    The image (``image_width`` × ``image_height`` pixels) was resized by ``scale`` to
    ``resized_width`` × ``resized_height`` (each rounded, at least 1) and placed with its
    top-left corner at (``pad_x``, ``pad_y``) in the ``input_width`` × ``input_height`` model
    input. Coordinates are continuous (a pixel spans [i, i + 1)), x right, y down. The maps use
    the per-axis ratio of the rounded size, so they match the resized pixels exactly.

    Attributes:
        scale: model-input pixels per image pixel, ``min(input_w / image_w, input_h / image_h)``.
        pad_x, pad_y: left and top border widths, model-input pixels.
        input_width, input_height: model input size, pixels.
        image_width, image_height: decoded image size, pixels.
    """

    scale: float
    pad_x: int
    pad_y: int
    input_width: int
    input_height: int
    image_width: int
    image_height: int

    @classmethod
    def fit(
        cls, image_width: int, image_height: int, input_width: int, input_height: int
    ) -> LetterboxTransform:
        """The centred, aspect-preserving placement of an image in a model input (pixels)."""
        scale = min(input_width / image_width, input_height / image_height)
        resized_w = _resized(image_width, scale, input_width)
        resized_h = _resized(image_height, scale, input_height)
        pad_x, pad_y = (input_width - resized_w) // 2, (input_height - resized_h) // 2
        return cls(scale, pad_x, pad_y, input_width, input_height, image_width, image_height)

    @property
    def resized_width(self) -> int:
        return _resized(self.image_width, self.scale, self.input_width)

    @property
    def resized_height(self) -> int:
        return _resized(self.image_height, self.scale, self.input_height)

    def to_image(self, xy: np.ndarray) -> np.ndarray:
        """Map model-input pixel coordinates to image pixels.

        Args:
            xy: float array (..., 2) of (x, y) in model-input pixels.

        Returns:
            float array (..., 2) of (x, y) in image pixels (not clipped).
        """
        pad = np.array([self.pad_x, self.pad_y], np.float64)
        out: np.ndarray = (np.asarray(xy, np.float64) - pad) / self._ratio()
        return out

    def normalized_to_image(self, xy: np.ndarray) -> np.ndarray:
        """Map model-input coordinates normalised to 0..1 (MediaPipe's convention) to image
        pixels; float (..., 2) → float (..., 2)."""
        return self.to_image(np.asarray(xy) * (self.input_width, self.input_height))

    def to_input(self, xy: np.ndarray) -> np.ndarray:
        """Map image pixel coordinates to model-input pixels; float (..., 2) → float (..., 2)."""
        pad = np.array([self.pad_x, self.pad_y], np.float64)
        out: np.ndarray = np.asarray(xy, np.float64) * self._ratio() + pad
        return out

    def _ratio(self) -> np.ndarray:
        """Model-input pixels per image pixel along x and y, float64 (2,)."""
        return np.array(
            [self.resized_width / self.image_width, self.resized_height / self.image_height]
        )


def _resized(size: int, scale: float, limit: int) -> int:
    return max(1, min(limit, round(size * scale)))


class Preprocessor(Protocol):
    """Turns one decoded image into one model input; thread-safe, called per frame."""

    def __call__(self, image: np.ndarray) -> tuple[np.ndarray, LetterboxTransform]:
        """Preprocess one frame.

        Args:
            image: BGR uint8 (H, W, 3) as returned by :func:`streamer.vision.decode.decode_image`.

        Returns:
            The model input for this frame without the batch axis, C-contiguous, in the
            model's input dtype and layout (e.g. float32 (3, 128, 128) for BlazeFace), and the
            transform from model-input to image coordinates.
        """
        ...


_Triple = tuple[float, float, float]


class LetterboxParams(PluginParams):
    """Parameters of ``letterbox`` (see the module docstring)."""

    color: Literal["rgb", "bgr"] = "rgb"
    mean: float | _Triple = 0.5
    std: float | _Triple = 0.5
    pad_value: int = Field(0, ge=0, le=255)
    layout: Literal["NCHW", "NHWC"] = "NCHW"
    size: tuple[int, int] | None = Field(None, description="(height, width) for dynamic inputs")

    def per_channel(self) -> tuple[np.ndarray, np.ndarray]:
        """``mean`` and ``std`` as float64 (3,) arrays, in the model's channel order.

        Raises:
            ConfigError: a ``std`` is not positive.
        """
        mean = np.broadcast_to(np.asarray(self.mean, np.float64), (3,))
        std = np.broadcast_to(np.asarray(self.std, np.float64), (3,))
        if not (std > 0).all():
            raise ConfigError(f"std: must be positive, got {self.std}")
        return mean, std


@PREPROCESSORS.register("letterbox", LetterboxParams)
class Letterbox:
    """The ``letterbox`` preprocessor for the model described by ``info``.

    Resizing uses ``cv2.INTER_AREA`` when shrinking (no aliasing) and ``cv2.INTER_LINEAR``
    when enlarging. Normalisation ``(x / 255 - mean) / std`` and the BGR → RGB swap and
    HWC → CHW transpose are fused into one table lookup per channel (``np.take`` with a
    256-entry table in the model's dtype), written straight into the output tensor; the
    borders are filled with the normalised ``pad_value``.

    Args:
        params: validated :class:`LetterboxParams`.
        info: the loaded model; its first input gives the size, dtype and (with ``layout``)
            the channel axis.

    Raises:
        ConfigError: the first input is not 4-D with 3 channels, is not floating point, or
            its height/width are dynamic and ``size`` is not set (or disagrees with them).
    """

    def __init__(self, params: LetterboxParams, info: ModelInfo) -> None:
        self.height, self.width, self.dtype = _input_geometry(params, info)
        self.layout = params.layout
        mean, std = params.per_channel()
        levels = np.arange(256, dtype=np.float64)[:, None] / 255.0
        # tables[:, c]: value of model channel c for each 0..255 level of its source channel.
        self._tables = np.ascontiguousarray(((levels - mean) / std).T.astype(self.dtype))
        self._sources = (2, 1, 0) if params.color == "rgb" else (0, 1, 2)
        self._pad = self._tables[:, params.pad_value].copy()

    def __call__(self, image: np.ndarray) -> tuple[np.ndarray, LetterboxTransform]:
        """Letterbox one BGR uint8 (H, W, 3) image; see :meth:`Preprocessor.__call__`."""
        h, w = image.shape[:2]
        transform = LetterboxTransform.fit(w, h, self.width, self.height)
        resized = _resize(image, transform)
        out, planes = self._output()
        rows = slice(transform.pad_y, transform.pad_y + transform.resized_height)
        cols = slice(transform.pad_x, transform.pad_x + transform.resized_width)
        for c, src in enumerate(self._sources):
            np.take(self._tables[c], resized[:, :, src], out=planes[c][rows, cols], mode="clip")
        return out, transform

    def _output(self) -> tuple[np.ndarray, list[np.ndarray]]:
        """A new output tensor pre-filled with the border value, and its 3 channel views."""
        if self.layout == "NCHW":
            out = np.empty((3, self.height, self.width), self.dtype)
            out[...] = self._pad[:, None, None]
            return out, [out[0], out[1], out[2]]
        out = np.empty((self.height, self.width, 3), self.dtype)
        out[...] = self._pad
        return out, [out[:, :, 0], out[:, :, 1], out[:, :, 2]]


def _resize(image: np.ndarray, transform: LetterboxTransform) -> np.ndarray:
    """Resize ``image`` to the transform's resized size (no-op when already that size)."""
    size = (transform.resized_width, transform.resized_height)
    if (image.shape[1], image.shape[0]) == size:
        return image
    interpolation = cv2.INTER_AREA if transform.scale < 1 else cv2.INTER_LINEAR
    return cv2.resize(image, size, interpolation=interpolation)


def _input_geometry(params: LetterboxParams, info: ModelInfo) -> tuple[int, int, np.dtype]:
    """(height, width, dtype) of the model's first input.

    Raises:
        ConfigError: see :class:`Letterbox`.
    """
    if not info.inputs:
        raise ConfigError(f"model {info.name!r} has no inputs")
    tensor = info.inputs[0]
    if len(tensor.shape) != 4:
        raise ConfigError(f"input {tensor.name!r} is {list(tensor.shape)}, expected 4-D")
    if params.layout == "NCHW":
        _, c, h, w = tensor.shape
    else:
        _, h, w, c = tensor.shape
    if c not in (3, -1):
        raise ConfigError(
            f"layout: input {tensor.name!r} {list(tensor.shape)} has {c} channels as "
            f"{params.layout}, expected 3"
        )
    if not np.issubdtype(tensor.dtype, np.floating):
        raise ConfigError(f"input {tensor.name!r} is {tensor.dtype}, expected floating point")
    return (*_input_size(params, tensor.name, h, w), tensor.dtype)


def _input_size(params: LetterboxParams, name: str, h: int, w: int) -> tuple[int, int]:
    """The (height, width) to letterbox to: the model's, or ``size`` for dynamic dims.

    Raises:
        ConfigError: both unknown, or ``size`` disagrees with a static model size.
    """
    if params.size is None:
        if h < 1 or w < 1:
            raise ConfigError(f"size: input {name!r} has dynamic height/width; set size = [h, w]")
        return h, w
    sh, sw = params.size
    if sh < 1 or sw < 1 or (h > 0 and h != sh) or (w > 0 and w != sw):
        raise ConfigError(f"size: {list(params.size)} does not fit input {name!r} ({h}x{w})")
    return sh, sw

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
    # size = [h, w]      # required when the model's input height/width are dynamic and it
                         # has no resolution gears; with gears, pins every frame to that gear
    normalize = "host"   # where (x / 255 - mean) / std, the colour swap and the layout change
                         # happen: "host" (default, here), "model" (onnxruntime composes them
                         # into the graph at load time) or "device" (ACL AIPP; see
                         # ``streamer models aipp``)
    aipp = "static"      # with normalize = "device": "static" (the parameters baked into the
                         # .om by ATC) or "dynamic" (an .om built with aipp_mode: dynamic; the
                         # ACL backend sets the parameters on every execution)

With ``normalize = "model"`` or ``"device"`` the host only resizes and pads: the tensor is the
resized image as uint8 (h, w, 3) in the decoded BGR order with ``pad_value`` borders, and the
model's first input must be uint8 NHWC with 3 channels (the rewritten graph, or the AIPP
input of the .om). ``color``, ``mean``, ``std`` and ``layout`` then describe what the graph or
AIPP does; the results match host normalisation up to float rounding (issue 9). ``aipp`` is
only meaningful with ``normalize = "device"``.

For a model with resolution gears (ACL ``--dynamic_image_size``, or ``--dynamic_dims`` gears
that set the input's H and W) each frame is letterboxed into the gear whose aspect ratio is
closest to its own (see :meth:`Letterbox.choose_size`), so its tensor has that gear's H × W.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Literal, Protocol

import cv2
import numpy as np
from pydantic import Field, model_validator

from streamer.errors import ConfigError
from streamer.runtime.base import ModelInfo
from streamer.runtime.graph_preprocess import per_channel_mean_std
from streamer.vision.registry import PREPROCESSORS, PluginParams

__all__ = [
    "Letterbox",
    "LetterboxParams",
    "LetterboxTransform",
    "Preprocessor",
    "input_size",
    "rows_to_image",
]


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
        resized_width, resized_height: the resized image inside the input, pixels: derived
            from ``scale`` when not given (0).
    """

    scale: float
    pad_x: int
    pad_y: int
    input_width: int
    input_height: int
    image_width: int
    image_height: int
    resized_width: int = field(default=0, repr=False, compare=False)
    resized_height: int = field(default=0, repr=False, compare=False)
    _pad: np.ndarray = field(init=False, repr=False, compare=False)
    _ratio: np.ndarray = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        # Derived once: postprocessing maps every detection through them.
        width = self.resized_width or _resized(self.image_width, self.scale, self.input_width)
        height = self.resized_height or _resized(self.image_height, self.scale, self.input_height)
        object.__setattr__(self, "resized_width", width)
        object.__setattr__(self, "resized_height", height)
        object.__setattr__(self, "_pad", np.array([self.pad_x, self.pad_y], np.float64))
        ratio = np.array([width / self.image_width, height / self.image_height])
        object.__setattr__(self, "_ratio", ratio)

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

    def enlarged(self, factor: int, image_width: int, image_height: int) -> LetterboxTransform:
        """The same placement for an image ``factor`` times larger (``image_width`` ×
        ``image_height`` pixels) than the one letterboxed, so coordinates map to full-frame
        pixels after a reduced-size decode.

        A reduced pixel ``i`` covers full pixels ``[factor * i, factor * i + factor)`` (libjpeg's
        scaled decode; the last one fewer when the size is not a multiple of ``factor``), so
        the map is this one's times ``factor``, and the resized size is the one the tensor
        has: a size rounded again from the full image's differs by a pixel for some sizes
        (513 x 932 at 1/2), which would move boxes by 1 % of their distance from the origin.
        """
        enlarged = LetterboxTransform(
            self.scale / factor,
            self.pad_x,
            self.pad_y,
            self.input_width,
            self.input_height,
            image_width,
            image_height,
            self.resized_width,
            self.resized_height,
        )
        object.__setattr__(enlarged, "_ratio", self._ratio / factor)
        return enlarged

    def to_image(self, xy: np.ndarray) -> np.ndarray:
        """Map model-input pixel coordinates to image pixels.

        Args:
            xy: float array (..., 2) of (x, y) in model-input pixels.

        Returns:
            float array (..., 2) of (x, y) in image pixels (not clipped).
        """
        out: np.ndarray = (np.asarray(xy, np.float64) - self._pad) / self._ratio
        return out

    def normalized_to_image(self, xy: np.ndarray) -> np.ndarray:
        """Map model-input coordinates normalised to 0..1 (MediaPipe's convention) to image
        pixels; float (..., 2) → float (..., 2)."""
        return self.to_image(np.asarray(xy) * (self.input_width, self.input_height))

    def to_input(self, xy: np.ndarray) -> np.ndarray:
        """Map image pixel coordinates to model-input pixels; float (..., 2) → float (..., 2)."""
        out: np.ndarray = np.asarray(xy, np.float64) * self._ratio + self._pad
        return out


def rows_to_image(
    transforms: Sequence[LetterboxTransform], frames: np.ndarray, xy: np.ndarray
) -> np.ndarray:
    """:meth:`LetterboxTransform.to_image` of the points of several frames in one call.

    Row ``r`` goes through ``transforms[frames[r]]`` with the same arithmetic per element as
    ``to_image``, so the results are bit-identical to mapping each frame's rows on its own.

    Args:
        transforms: one per frame.
        frames: int (R,) the frame of each row, an index into ``transforms``.
        xy: float (R, ..., 2) (x, y) in model-input pixels.

    Returns:
        float64 (R, ..., 2) (x, y) in image pixels (not clipped).
    """
    per_row = (len(frames),) + (1,) * (np.ndim(xy) - 2) + (2,)
    pad = np.array([t._pad for t in transforms]).reshape(-1, 2)[frames].reshape(per_row)
    ratio = np.array([t._ratio for t in transforms]).reshape(-1, 2)[frames].reshape(per_row)
    out: np.ndarray = (np.asarray(xy, np.float64) - pad) / ratio
    return out


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
    size: tuple[int, int] | None = Field(
        None, description="(height, width) for dynamic inputs; with gears, one of them"
    )
    normalize: Literal["host", "model", "device"] = "host"
    aipp: Literal["static", "dynamic"] = "static"

    @model_validator(mode="after")
    def _aipp_on_the_device(self) -> LetterboxParams:
        if self.aipp == "dynamic" and self.normalize != "device":
            raise ValueError(
                f'aipp = "dynamic" sets AIPP parameters on the device and needs normalize = '
                f'"device", not {self.normalize!r}'
            )
        return self

    def per_channel(self) -> tuple[np.ndarray, np.ndarray]:
        """``mean`` and ``std`` as float64 (3,) arrays, in the model's channel order.

        Raises:
            ConfigError: see :func:`~streamer.runtime.graph_preprocess.per_channel_mean_std`.
        """
        return per_channel_mean_std(self.mean, self.std)


@PREPROCESSORS.register("letterbox", LetterboxParams)
class Letterbox:
    """The ``letterbox`` preprocessor for the model described by ``info``.

    Resizing uses ``cv2.INTER_AREA`` when shrinking below half size (no aliasing) and
    ``cv2.INTER_LINEAR`` otherwise (:data:`AREA_BELOW_SCALE`). Normalisation
    ``(x / 255 - mean) / std`` and the BGR → RGB swap and HWC → CHW transpose are fused
    into one table lookup per channel (``np.take`` with a 256-entry table in the model's
    dtype), written straight into the output tensor; the borders are filled with the
    normalised ``pad_value``.

    **Resolution gears** (ACL's 档位 for ``--dynamic_image_size`` / ``--dynamic_dims``, seeds
    "动态Batch/动态分辨率/动态维度"; ``acl.mdl.set_dynamic_hw_size`` accepts only those sizes,
    RT ``python/docs/zh/api_ref/ge/function-set_dynamic_hw_size.md``). When the first input's
    height and width are dynamic, the candidate sizes are ``info.hw_gears``, or else the
    distinct (H, W) of ``info.dims_gears`` (their first values are the first input's dims);
    each frame goes to the one :meth:`choose_size` picks. ``size`` pins every frame to one
    gear. The batcher groups frames by tensor shape, so frames of different gears never share
    a batch.

    Args:
        params: validated :class:`LetterboxParams`.
        info: the loaded model; its first input gives the size, dtype and (with ``layout``)
            the channel axis; ``hw_gears`` / ``dims_gears`` the resolution gears.

    Attributes:
        sizes: the (height, width) the tensors can have, pixels: one, or the gears.

    Raises:
        ConfigError: the first input is not 4-D with 3 channels, is not floating point, or
            its height/width are dynamic with no gears and ``size`` is not set (or disagrees
            with them); ``size`` is not one of the gears; the model has resolution gears but
            ``layout`` does not put both dynamic dims at H and W.
    """

    def __init__(self, params: LetterboxParams, info: ModelInfo) -> None:
        self.sizes, self.dtype = _input_geometry(params, info)
        self.layout = params.layout
        self.on_host = params.normalize == "host"
        self._pixel_pad = np.uint8(params.pad_value)
        mean, std = params.per_channel()
        # tables[:, c]: value of model channel c for each 0..255 level of its source channel.
        self._tables = _tables(mean, std, self.dtype if self.on_host else np.dtype(np.float32))
        self._sources = (2, 1, 0) if params.color == "rgb" else (0, 1, 2)
        self._pad = self._tables[:, params.pad_value].copy()

    def __call__(self, image: np.ndarray) -> tuple[np.ndarray, LetterboxTransform]:
        """Letterbox one BGR uint8 (H, W, 3) image; see :meth:`Preprocessor.__call__`.

        The tensor is (3, h, w) for NCHW or (h, w, 3) for NHWC in the model's float dtype,
        (h, w) from :meth:`choose_size`; with ``normalize`` ``model`` / ``device`` it is the
        uint8 (h, w, 3) BGR pixels.
        """
        h, w = image.shape[:2]
        height, width = self.choose_size(w, h)
        return self._place(image, LetterboxTransform.fit(w, h, width, height))

    def reduced(
        self, image: np.ndarray, factor: int, full_width: int, full_height: int
    ) -> tuple[np.ndarray, LetterboxTransform]:
        """Letterbox a JPEG decoded at 1/``factor`` of its ``full_width`` x ``full_height``
        pixels (libjpeg's scaled decode, :func:`~streamer.vision.decode.decode_jpeg_reduced`)
        into the size and place the full decode's letterbox gives it, so the model sees the
        full decode's geometry (a size rounded from the reduced one differs by a pixel for some
        sizes, e.g. 71 columns of 128 for 513 x 932 instead of 70, and moves detections by a
        model-input pixel and more).

        Args:
            image: the reduced decode, uint8 (height, width, 3) BGR, each side the full one's
                divided by ``factor``, rounded up.
            factor: the reduction, 2, 4 or 8.
            full_width, full_height: the JPEG's own size, pixels.

        Returns:
            The tensor, as :meth:`__call__` gives it, and the transform to full-image pixels.
        """
        h, w = image.shape[:2]
        height, width = self.choose_size(full_width, full_height)
        full = LetterboxTransform.fit(full_width, full_height, width, height)
        placed = LetterboxTransform(
            full.scale * factor,
            full.pad_x,
            full.pad_y,
            width,
            height,
            w,
            h,
            full.resized_width,
            full.resized_height,
        )
        tensor, _ = self._place(image, placed)
        return tensor, placed.enlarged(factor, full_width, full_height)

    def _place(
        self, image: np.ndarray, transform: LetterboxTransform
    ) -> tuple[np.ndarray, LetterboxTransform]:
        """The tensor of ``image`` resized and placed as ``transform`` says, and it."""
        height, width = transform.input_height, transform.input_width
        resized = _resize(image, transform)
        rows = slice(transform.pad_y, transform.pad_y + transform.resized_height)
        cols = slice(transform.pad_x, transform.pad_x + transform.resized_width)
        if not self.on_host:
            pixels = np.full((height, width, 3), self._pixel_pad, np.uint8)
            pixels[rows, cols] = resized
            return pixels, transform
        out, planes = self._output(height, width)
        for c, src in enumerate(self._sources):
            np.take(self._tables[c], resized[:, :, src], out=planes[c][rows, cols], mode="clip")
        return out, transform

    def choose_size(self, image_width: int, image_height: int) -> tuple[int, int]:
        """The (height, width) in pixels an image of that size is letterboxed into.

        With one size, that one. With resolution gears, the gear whose aspect ratio
        (width / height) is closest to the image's, distance measured as the larger of the two
        ratios divided by the smaller (``|log r_gear - log r_image|``, so 2:1 and 1:2 are
        equally far from 1:1; compared exactly, as fractions). Ties go to the larger gear (more
        pixels), then to the earlier one in the model's gear list. A wide frame thus gets a
        wide gear and loses the least area to padding (streamer's rule, issue 4).
        """
        if len(self.sizes) == 1:
            return self.sizes[0]
        image = Fraction(image_width, image_height)

        def key(item: tuple[int, tuple[int, int]]) -> tuple[Fraction, int, int]:
            index, (height, width) = item
            ratio = Fraction(width, height) / image
            return max(ratio, 1 / ratio), -height * width, index

        return min(enumerate(self.sizes), key=key)[1]

    def _output(self, height: int, width: int) -> tuple[np.ndarray, list[np.ndarray]]:
        """A new output tensor pre-filled with the border value, and its 3 channel views."""
        if self.layout == "NCHW":
            out = np.empty((3, height, width), self.dtype)
            out[...] = self._pad[:, None, None]
            return out, [out[0], out[1], out[2]]
        out = np.empty((height, width, 3), self.dtype)
        out[...] = self._pad
        return out, [out[:, :, 0], out[:, :, 1], out[:, :, 2]]


def _tables(mean: np.ndarray, std: np.ndarray, dtype: np.dtype) -> np.ndarray:
    """Per model channel, ``(level / 255 - mean) / std`` for each level 0..255: (3, 256).

    Raises:
        ConfigError: a value is beyond ``dtype`` (a float16 model input with a tiny ``std``).
    """
    levels = np.arange(256, dtype=np.float64)[:, None] / 255.0
    tables = ((levels - mean) / std).T
    largest = float(np.abs(tables).max())
    if largest > float(np.finfo(dtype).max):
        raise ConfigError(
            f"mean, std: (x / 255 - mean) / std reaches {largest:.3g}, beyond the model "
            f"input's {dtype}"
        )
    return np.ascontiguousarray(tables.astype(dtype))


AREA_BELOW_SCALE = 0.5
"""Shrinking below this scale averages (``INTER_AREA``); milder shrinking and enlarging
interpolate (``INTER_LINEAR``). At a scale >= 0.5 bilinear sampling still reads every
source pixel, so it does not alias, and it costs a fifth of ``INTER_AREA`` at a non-integer
scale (176x144 → 128x105: 0.03 vs 0.17 ms of CPU)."""


def _resize(image: np.ndarray, transform: LetterboxTransform) -> np.ndarray:
    """Resize ``image`` to the transform's resized size (no-op when already that size)."""
    size = (transform.resized_width, transform.resized_height)
    if (image.shape[1], image.shape[0]) == size:
        return image
    interpolation = cv2.INTER_AREA if transform.scale < AREA_BELOW_SCALE else cv2.INTER_LINEAR
    return cv2.resize(image, size, interpolation=interpolation)


Size = tuple[int, int]
"""(height, width), pixels."""


def _input_geometry(params: LetterboxParams, info: ModelInfo) -> tuple[tuple[Size, ...], np.dtype]:
    """The (height, width) sizes the tensors can have, and the dtype of the first input.

    Raises:
        ConfigError: see :class:`Letterbox`.
    """
    if not info.inputs:
        raise ConfigError(f"model {info.name!r} has no inputs")
    tensor = info.inputs[0]
    if len(tensor.shape) != 4:
        raise ConfigError(f"input {tensor.name!r} is {list(tensor.shape)}, expected 4-D")
    if params.normalize != "host":
        return _pixel_geometry(params, info)
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
    gears = _resolution_gears(params, info, h, w)
    if not gears:
        return (input_size(params.size, tensor.name, h, w),), tensor.dtype
    return _pinned(params, gears), tensor.dtype


def _pixel_geometry(params: LetterboxParams, info: ModelInfo) -> tuple[tuple[Size, ...], np.dtype]:
    """Sizes and dtype for ``normalize`` ``model`` / ``device``: a uint8 NHWC 3-channel input.

    Raises:
        ConfigError: the input is not uint8 (N, H, W, 3), naming the backend setting that
            makes it so.
    """
    tensor = info.inputs[0]
    if tensor.dtype != np.uint8 or tensor.shape[3] not in (3, -1):
        how = {
            "model": "the onnxruntime backend rewrites the graph to take them",
            "static": "the .om needs static AIPP (ATC --insert_op_conf; the simulator's "
            "manifest `aipp` section)",
            "dynamic": "the .om needs dynamic AIPP (ATC --insert_op_conf with aipp_mode: "
            "dynamic; the simulator's manifest `aipp` section)",
        }[params.normalize if params.normalize == "model" else params.aipp]
        raise ConfigError(
            f"normalize: {params.normalize!r} sends uint8 NHWC pixels and {how}; input "
            f"{tensor.name!r} is {list(tensor.shape)} {tensor.dtype}"
        )
    pixels = params.model_copy(update={"layout": "NHWC"})
    _, h, w, _ = tensor.shape
    gears = _resolution_gears(pixels, info, h, w)
    if not gears:
        return (input_size(pixels.size, tensor.name, h, w),), tensor.dtype
    return _pinned(pixels, gears), tensor.dtype


def _resolution_gears(params: LetterboxParams, info: ModelInfo, h: int, w: int) -> tuple[Size, ...]:
    """The model's resolution gears for its first input (class docstring), or () when its
    height and width are static or it has none.

    Raises:
        ConfigError: the model has ``hw_gears`` but only one of H, W (per ``layout``) is
            dynamic.
    """
    if h > 0 and w > 0:
        return ()
    if info.hw_gears:
        if h > 0 or w > 0:
            shape = list(info.inputs[0].shape)
            raise ConfigError(
                f"layout: input {info.inputs[0].name!r} {shape} read as {params.layout} has "
                f"one dynamic dim at H/W, but the model's resolution gears "
                f"{[list(g) for g in info.hw_gears]} set both"
            )
        return tuple((int(gh), int(gw)) for gh, gw in info.hw_gears)
    h_axis, w_axis = (2, 3) if params.layout == "NCHW" else (1, 2)
    sizes = ((g[h_axis], g[w_axis]) for g in info.dims_gears if len(g) > w_axis)
    return tuple(dict.fromkeys(sizes))


def _pinned(params: LetterboxParams, gears: tuple[Size, ...]) -> tuple[Size, ...]:
    """``gears``, or just ``size`` when it is set.

    Raises:
        ConfigError: ``size`` is not one of ``gears``.
    """
    if params.size is None:
        return gears
    size = (params.size[0], params.size[1])
    if size not in gears:
        raise ConfigError(
            f"size: {list(size)} is not one of the model's resolution gears "
            f"{[list(g) for g in gears]}"
        )
    return (size,)


def input_size(size: Size | None, name: str, h: int, w: int) -> Size:
    """The (height, width) in pixels an image input is fed at: the model's own, or the
    configured ``size`` where the model leaves height or width free.

    Args:
        size: the configured ``size`` (height, width), pixels, or None.
        name: the input's name, for messages.
        h, w: the input's height and width in the model, pixels; < 1 when free.

    Raises:
        ConfigError: both unknown, or ``size`` disagrees with a static model size.
    """
    if size is None:
        if h < 1 or w < 1:
            raise ConfigError(f"size: input {name!r} has dynamic height/width; set size = [h, w]")
        return h, w
    sh, sw = size
    if sh < 1 or sw < 1 or (h > 0 and h != sh) or (w > 0 and w != sw):
        raise ConfigError(f"size: {list(size)} does not fit input {name!r} ({h}x{w})")
    return sh, sw

"""Frame payloads → BGR uint8 images (DESIGN.md §5 encodings ``jpeg``, ``png``, ``raw``).

:func:`decode_image` is pure and thread-safe; it runs on the decode worker pool (OpenCV
releases the GIL while it decodes). Every failure is a :class:`FrameError` with a stable
reason; no ``cv2.error`` or ``ValueError`` escapes.

Conversion rules, the same for every encoding:

- 16-bit samples (16-bit PNG, raw ``uint16`` arrays) keep their high byte (``v >> 8``), what
  libpng's ``png_set_strip_16`` does and what ``cv2.IMREAD_COLOR`` gives for a 16-bit PNG
  (checked against OpenCV 4.14 and 5.0). Samples are never stretched, clipped or wrapped:
  12-bit data (0-4095) becomes 0-15, so such a producer shifts its samples left by 4 first.
- Gray becomes BGR by repeating the channel.
- An alpha channel (RGBA, gray + alpha, or a palette with a ``tRNS`` chunk, which OpenCV
  expands to BGRA) is composited over **black**: ``c' = round(c * a / 255)``. Black matches
  the default letterbox border, so a transparent region looks like padding to the model.
- EXIF orientation is not applied (``cv2.IMREAD_UNCHANGED``): pixels are used as stored, and
  detections refer to them.

:func:`check_payload` validates everything that can be known without decoding a pixel: the
raw header fields and payload size, or the PNG ``IHDR`` / JPEG ``SOFn`` size, against the
:class:`DecodeLimits`. :func:`decode_image` runs it first, so a small file that declares a
huge image is refused without allocating it; an ingress runs it too, to refuse a frame before
it is queued.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import cv2
import numpy as np

from streamer.errors import FrameError, Reason

__all__ = [
    "decode_jpeg_reduced",
    "RAW_DTYPES",
    "DecodeLimits",
    "check_payload",
    "decode_image",
    "encoded_size",
]

_PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
_JPEG_SOI = b"\xff\xd8"
# SOF0..SOF15 carry the frame size; C4 (DHT), C8 (JPG, reserved) and CC (DAC) do not.
# Source: ITU-T T.81 (JPEG), table B.1 "Marker code assignments".
_JPEG_SOF = frozenset(range(0xC0, 0xD0)) - {0xC4, 0xC8, 0xCC}
# Markers without a length field: TEM (01), RST0..RST7 (D0..D7), SOI (D8); ITU-T T.81 B.1.1.3.
_JPEG_STANDALONE = frozenset({0x01, *range(0xD0, 0xD9)})
_JPEG_EOI, _JPEG_SOS = 0xD9, 0xDA
_RAW_COLORS = {1: ("gray",), 3: ("bgr", "rgb"), 4: ("bgr", "rgb")}
RAW_DTYPES = {"uint8": 1, "uint16": 2}
"""Sample types a ``raw`` payload may have, with their size in bytes; ``uint16`` is
little-endian (numpy's ``uint16`` on every platform the daemon runs on)."""


@dataclass(frozen=True, slots=True)
class DecodeLimits:
    """The largest image a frame may carry; larger ones fail with reason ``too_large``.

    Attributes:
        max_width: pixels.
        max_height: pixels.
        max_pixels: width × height.
    """

    max_width: int = 8192
    max_height: int = 8192
    max_pixels: int = 40_000_000

    def check(self, width: int, height: int) -> None:
        """Refuse a ``width`` × ``height`` image that exceeds a limit.

        Raises:
            FrameError: reason ``too_large``.
        """
        if width > self.max_width or height > self.max_height or width * height > self.max_pixels:
            raise FrameError(
                Reason.TOO_LARGE,
                f"image is {width}x{height} ({width * height} pixels); limits are "
                f"{self.max_width}x{self.max_height} and {self.max_pixels} pixels",
            )


def decode_image(
    encoding: str, payload: bytes | memoryview, fields: Mapping[str, Any], limits: DecodeLimits
) -> np.ndarray:
    """Decode one frame's payload into a BGR image.

    Args:
        encoding: ``jpeg`` | ``png`` | ``raw`` (the header's ``encoding``).
        payload: the encoded bytes, or for ``raw`` the C-order array bytes.
        fields: the wire header; ``raw`` reads ``shape`` (``[h, w]`` or ``[h, w, c]`` with c in
            1, 3, 4), ``dtype`` (``uint8``, or ``uint16`` little-endian) and ``color``
            (``bgr`` | ``rgb`` | ``gray``; ``gray`` exactly when there is one channel).
        limits: the size limits, checked before decoding.

    Returns:
        uint8 array of shape (height, width, 3), BGR, C-contiguous. A raw ``uint8`` ``bgr``
        payload is returned without a copy, as a read-only view of ``payload``.

    Raises:
        FrameError: as :func:`check_payload`, and ``decode_failed`` (corrupt or truncated
            payload; measured with OpenCV 4.14 and 5.0, a JPEG that ends before its final
            2-byte EOI marker is almost always rejected; the marker is not looked for, so a
            whole scan with padding in its place decodes) or ``unsupported_dtype`` (an
            encoded image with samples that are neither 8- nor 16-bit).
    """
    check_payload(encoding, payload, fields, limits)
    data = _bytes_view(payload)
    if encoding == "raw":
        return _decode_raw(data, fields)
    return _to_bgr8(_imdecode(data, encoding), limits)


_REDUCED = (
    (8, cv2.IMREAD_REDUCED_COLOR_8),
    (4, cv2.IMREAD_REDUCED_COLOR_4),
    (2, cv2.IMREAD_REDUCED_COLOR_2),
)


def decode_jpeg_reduced(
    payload: bytes | memoryview,
    fields: Mapping[str, Any],
    limits: DecodeLimits,
    min_size: tuple[int, int],
) -> tuple[np.ndarray, int, tuple[int, int]]:
    """Decode a JPEG at 1/2, 1/4 or 1/8 of its size when it still covers ``min_size``.

    libjpeg scales while it decodes (OpenCV's ``IMREAD_REDUCED_COLOR_*``), so a 1280x720
    camera frame for a 128x128 model costs a fraction of a full decode.

    Args:
        payload: the JPEG bytes.
        fields, limits: as for :func:`decode_image` (the full size is checked).
        min_size: (height, width) in pixels the decoded image must still cover.

    Returns:
        The BGR uint8 (H', W', 3) image, the reduction factor k (1, 2, 4 or 8: the full image
        is about k times larger on each axis, H' = ceil(H / k)), and the full (W, H), pixels.

    Raises:
        FrameError: as :func:`decode_image`.
    """
    width, height = check_payload("jpeg", payload, fields, limits)
    for factor, flag in _REDUCED:
        if width // factor >= min_size[1] and height // factor >= min_size[0]:
            data = np.frombuffer(_bytes_view(payload), np.uint8)
            image = cv2.imdecode(data, flag | cv2.IMREAD_IGNORE_ORIENTATION)
            if image is None:
                raise _corrupt("OpenCV cannot decode the jpeg payload (corrupt or truncated)")
            return image, factor, (width, height)
    return decode_image("jpeg", payload, fields, limits), 1, (width, height)


def check_payload(
    encoding: str, payload: bytes | memoryview, fields: Mapping[str, Any], limits: DecodeLimits
) -> tuple[int, int]:
    """Validate a frame without decoding a pixel: what an ingress can refuse at once.

    Reads only headers: the raw ``shape``, ``dtype`` and ``color`` fields and the payload's
    length, or the PNG ``IHDR`` / JPEG ``SOFn`` segment. Allocates nothing in proportion to
    the image.

    Args:
        encoding, payload, fields, limits: as for :func:`decode_image`.

    Returns:
        (width, height) of the image in pixels.

    Raises:
        FrameError: ``bad_header`` (unknown encoding, bad ``shape``, ``dtype`` or ``color``),
            ``unsupported_dtype`` (a raw ``dtype`` other than ``uint8`` and ``uint16``),
            ``too_large`` (over ``limits``; for ``raw`` checked before the payload size),
            ``decode_failed`` (empty payload, a raw payload whose size does not match its
            shape, or an encoded payload that is not that format or whose header is
            missing or corrupt).
    """
    if encoding == "raw":
        return _check_raw(payload, fields, limits)
    width, height = encoded_size(encoding, payload)
    limits.check(width, height)
    return width, height


def encoded_size(encoding: str, payload: bytes | memoryview) -> tuple[int, int]:
    """(width, height) in pixels declared by a ``jpeg`` or ``png`` header, without decoding.

    Raises:
        FrameError: ``bad_header`` for another encoding; ``decode_failed`` when the payload is
            not that format or its header is missing or corrupt.
    """
    decoder = _ENCODED.get(encoding)
    if decoder is None:
        raise FrameError(Reason.BAD_HEADER, f"no image header to read for {encoding!r}")
    return decoder(_bytes_view(payload))


def _bytes_view(payload: bytes | memoryview) -> memoryview:
    """The payload as a flat byte view (no copy).

    Raises:
        FrameError: ``decode_failed`` when empty or not a contiguous buffer.
    """
    try:
        view = memoryview(payload).cast("B")
    except (TypeError, ValueError) as exc:
        raise FrameError(Reason.DECODE_FAILED, f"payload is not a byte buffer: {exc}") from exc
    if not view.nbytes:
        raise FrameError(Reason.DECODE_FAILED, "empty payload")
    return view


def _corrupt(detail: str) -> FrameError:
    return FrameError(Reason.DECODE_FAILED, detail)


def _png_size(data: memoryview) -> tuple[int, int]:
    """(width, height) from the IHDR chunk, which must come first (PNG spec, section 5.6).

    Raises:
        FrameError: ``decode_failed`` when the signature or IHDR is missing.
    """
    if data[:8].tobytes() != _PNG_SIGNATURE:
        raise _corrupt("payload is not a PNG (bad signature)")
    if data.nbytes < 24 or data[12:16].tobytes() != b"IHDR":
        raise _corrupt("PNG header (IHDR) is missing or truncated")
    width = int.from_bytes(data[16:20], "big")
    height = int.from_bytes(data[20:24], "big")
    if not width or not height:
        raise _corrupt(f"PNG declares an empty image ({width}x{height})")
    return width, height


def _jpeg_size(data: memoryview) -> tuple[int, int]:
    """(width, height) from the first SOFn segment (ITU-T T.81, B.2.2 frame header).

    Walks the marker segments from SOI; each one is ``FF xx`` then, except for standalone
    markers, a 2-byte big-endian length that counts itself. Stops at SOS or EOI.

    Raises:
        FrameError: ``decode_failed`` when the payload is not a JPEG, a segment is corrupt, or
            no SOFn comes before the image data.
    """
    if data[:2].tobytes() != _JPEG_SOI:
        raise _corrupt("payload is not a JPEG (no SOI marker)")
    i, n = 2, data.nbytes
    while i < n:
        if data[i] != 0xFF:
            raise _corrupt(f"corrupt JPEG: no marker at byte {i}")
        while i < n and data[i] == 0xFF:  # fill bytes (T.81 B.1.1.2)
            i += 1
        if i + 2 >= n:
            break
        marker = data[i]
        if marker in _JPEG_STANDALONE:
            i += 1
            continue
        if marker in (_JPEG_EOI, _JPEG_SOS, 0x00):
            break
        length = int.from_bytes(data[i + 1 : i + 3], "big")
        if marker in _JPEG_SOF:
            return _sof_size(data, i + 3, length)
        if length < 2:
            raise _corrupt(f"corrupt JPEG: segment length {length} at byte {i + 1}")
        i += 1 + length
    raise _corrupt("JPEG has no frame header (SOFn) before its image data; truncated?")


def _sof_size(data: memoryview, start: int, length: int) -> tuple[int, int]:
    """Read P (1 byte), Y (2), X (2) of a frame header whose body starts at ``start``."""
    if length < 8 or start + 5 > data.nbytes:
        raise _corrupt("JPEG frame header (SOFn) is truncated")
    height = int.from_bytes(data[start + 1 : start + 3], "big")
    width = int.from_bytes(data[start + 3 : start + 5], "big")
    if not width or not height:
        # Y = 0 defers the height to a DNL marker, which libjpeg does not support either.
        raise _corrupt(f"JPEG declares an image of {width}x{height} pixels")
    return width, height


_ENCODED: dict[str, Callable[[memoryview], tuple[int, int]]] = {
    "jpeg": _jpeg_size,
    "png": _png_size,
}


def _imdecode(data: memoryview, encoding: str) -> np.ndarray:
    """cv2.imdecode with IMREAD_UNCHANGED, failures mapped to ``decode_failed``."""
    try:
        image = cv2.imdecode(np.frombuffer(data, np.uint8), cv2.IMREAD_UNCHANGED)
    except cv2.error as exc:
        raise _corrupt(f"OpenCV cannot decode the {encoding} payload: {exc}") from exc
    if image is None:
        raise _corrupt(f"OpenCV cannot decode the {encoding} payload (corrupt or truncated)")
    return image


def _to_bgr8(image: np.ndarray, limits: DecodeLimits) -> np.ndarray:
    """Apply the module's rules to a decoded (H, W[, C]) uint8 or uint16 image.

    Raises:
        FrameError: ``unsupported_dtype`` for other sample types, ``decode_failed`` for a
            channel count other than 1-4, ``too_large`` (defensive re-check after decoding).
    """
    limits.check(image.shape[1], image.shape[0])
    if image.dtype == np.uint16:
        image = (image >> 8).astype(np.uint8)
    elif image.dtype != np.uint8:
        raise FrameError(Reason.UNSUPPORTED_DTYPE, f"decoded samples are {image.dtype}")
    channels = 1 if image.ndim == 2 else image.shape[2]
    if channels == 2:  # gray + alpha
        gray = _over_black(image[:, :, 0].copy(), image[:, :, 1].copy())
        return cv2.cvtColor(gray, cv2.COLOR_GRAY2BGR)
    convert = _BGR_FROM.get(("bgr", channels))
    if convert is None:
        raise _corrupt(f"decoded image has {channels} channels")
    return convert(image)


def _over_black(color: np.ndarray, alpha: np.ndarray) -> np.ndarray:
    """Composite ``color`` over black with ``alpha``.

    Args:
        color: uint8 (H, W) or (H, W, 3), C-contiguous.
        alpha: uint8 (H, W), C-contiguous; 255 is opaque.

    Returns:
        ``round(color * alpha / 255)``, uint8, the shape of ``color``.
    """
    weights = alpha if color.ndim == 2 else cv2.merge([alpha, alpha, alpha])
    return cv2.multiply(color, weights, scale=1.0 / 255.0)


def _bgra_over_black(image: np.ndarray) -> np.ndarray:
    return _over_black(cv2.cvtColor(image, cv2.COLOR_BGRA2BGR), cv2.extractChannel(image, 3))


def _rgba_over_black(image: np.ndarray) -> np.ndarray:
    return _over_black(cv2.cvtColor(image, cv2.COLOR_RGBA2BGR), cv2.extractChannel(image, 3))


def _gray(image: np.ndarray) -> np.ndarray:
    return cv2.cvtColor(image.reshape(image.shape[:2]), cv2.COLOR_GRAY2BGR)


def _rgb(image: np.ndarray) -> np.ndarray:
    return cv2.cvtColor(image, cv2.COLOR_RGB2BGR)


def _bgr(image: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(image)


# (color, channels) → converter to BGR (H, W, 3) uint8, C-contiguous.
_BGR_FROM: dict[tuple[str, int], Callable[[np.ndarray], np.ndarray]] = {
    ("gray", 1): _gray,
    ("bgr", 1): _gray,  # an encoded image's single channel is gray
    ("bgr", 3): _bgr,
    ("rgb", 3): _rgb,
    ("bgr", 4): _bgra_over_black,
    ("rgb", 4): _rgba_over_black,
}


def _check_raw(
    payload: bytes | memoryview, fields: Mapping[str, Any], limits: DecodeLimits
) -> tuple[int, int]:
    """Validate a ``raw`` frame's header fields, its size limits, then its payload length.

    Raises:
        FrameError: ``bad_header``, ``unsupported_dtype``, ``too_large``, ``decode_failed``.
    """
    shape = _raw_shape(fields.get("shape"))
    itemsize = _raw_itemsize(fields.get("dtype"))
    channels = shape[2] if len(shape) == 3 else 1
    color = fields.get("color")
    if color not in _RAW_COLORS[channels]:
        allowed = " | ".join(_RAW_COLORS[channels])
        raise FrameError(
            Reason.BAD_HEADER, f"`color` must be {allowed} for {channels} channel(s), got {color!r}"
        )
    limits.check(shape[1], shape[0])
    size = _bytes_view(payload).nbytes
    expected = math.prod(shape) * itemsize
    if size != expected:
        raise _corrupt(
            f"raw payload is {size} bytes; shape {list(shape)} {fields['dtype']} needs {expected}"
        )
    return shape[1], shape[0]


def _decode_raw(data: memoryview, fields: Mapping[str, Any]) -> np.ndarray:
    """View a checked ``raw`` payload as an image and convert it to BGR uint8.

    ``uint16`` samples keep their high byte: the odd bytes of the little-endian payload, read
    through a strided view and copied once.
    """
    shape = tuple(fields["shape"])
    samples = np.frombuffer(data, np.uint8)
    if fields["dtype"] == "uint16":
        samples = np.ascontiguousarray(samples[1::2])
    channels = shape[2] if len(shape) == 3 else 1
    return _BGR_FROM[(fields["color"], channels)](samples.reshape(shape))


def _raw_shape(shape: object) -> tuple[int, ...]:
    """Validate ``shape``: ``[h, w]`` or ``[h, w, c]``, positive ints, c in 1, 3, 4.

    Raises:
        FrameError: ``bad_header``.
    """
    ok = (
        isinstance(shape, (list, tuple))
        and len(shape) in (2, 3)
        and all(isinstance(d, int) and not isinstance(d, bool) and d > 0 for d in shape)
        and (len(shape) == 2 or shape[2] in _RAW_COLORS)
    )
    if not ok:
        raise FrameError(
            Reason.BAD_HEADER,
            f"`shape` must be [h, w] or [h, w, c] (positive ints, c in 1, 3, 4), got {shape!r}",
        )
    assert isinstance(shape, (list, tuple))
    return tuple(shape)


def _raw_itemsize(dtype: object) -> int:
    """Bytes per sample of a raw ``dtype``: ``uint8`` or ``uint16`` (see :data:`RAW_DTYPES`).

    Raises:
        FrameError: ``bad_header`` when missing or not a string, ``unsupported_dtype`` else.
    """
    if not isinstance(dtype, str):
        raise FrameError(Reason.BAD_HEADER, f"`dtype` must be a string, got {dtype!r}")
    itemsize = RAW_DTYPES.get(dtype)
    if itemsize is None:
        detail = f"raw dtype {dtype!r}; supported: {', '.join(RAW_DTYPES)}"
        raise FrameError(Reason.UNSUPPORTED_DTYPE, detail)
    return itemsize

"""decode_image: the conversion rules and every failure reason, on real encoded images."""

from __future__ import annotations

import struct
import zlib
from typing import Any

import cv2
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from streamer.errors import FrameError, Reason
from streamer.vision.decode import DecodeLimits, check_payload, decode_image, encoded_size

LIMITS = DecodeLimits()


def _encode(image: np.ndarray, ext: str) -> bytes:
    ok, buf = cv2.imencode(ext, image)
    assert ok
    return buf.tobytes()


def _png_by_hand(pixels: np.ndarray, color_type: int) -> bytes:
    """A minimal PNG (IHDR, one IDAT, IEND) for layouts cv2.imencode cannot write."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        crc = zlib.crc32(kind + data)
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", crc)

    h, w = pixels.shape[:2]
    rows = b"".join(b"\x00" + pixels[y].tobytes() for y in range(h))
    ihdr = struct.pack(">IIBBBBB", w, h, 8, color_type, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", ihdr)
        + chunk(b"IDAT", zlib.compress(rows))
        + chunk(b"IEND", b"")
    )


def _raw(image: np.ndarray, color: str, **overrides: Any) -> tuple[bytes, dict[str, Any]]:
    fields = {"shape": list(image.shape), "dtype": "uint8", "color": color, **overrides}
    return image.tobytes(), fields


def _reason(encoding: str, payload: bytes | memoryview, fields: dict[str, Any]) -> FrameError:
    with pytest.raises(FrameError) as info:
        decode_image(encoding, payload, fields, LIMITS)
    return info.value


def _expect_bgr(image: np.ndarray, height: int, width: int) -> None:
    assert image.dtype == np.uint8
    assert image.shape == (height, width, 3)
    assert image.flags.c_contiguous


# ---- encoded images ----------------------------------------------------------------------


def test_jpeg_decodes_close_to_the_original(astronaut: np.ndarray) -> None:
    image = decode_image("jpeg", _encode(astronaut, ".jpg"), {}, LIMITS)
    _expect_bgr(image, 512, 512)
    assert np.abs(image.astype(int) - astronaut).mean() < 3


def test_png_decodes_exactly(astronaut: np.ndarray) -> None:
    payload = memoryview(_encode(astronaut, ".png"))
    image = decode_image("png", payload, {}, LIMITS)
    _expect_bgr(image, 512, 512)
    assert np.array_equal(image, astronaut)


def test_16_bit_png_keeps_the_high_byte(astronaut: np.ndarray) -> None:
    noise = np.random.default_rng(0).integers(0, 256, astronaut.shape, dtype=np.uint16)
    deep = astronaut.astype(np.uint16) * 256 + noise
    image = decode_image("png", _encode(deep, ".png"), {}, LIMITS)
    _expect_bgr(image, 512, 512)
    assert np.array_equal(image, astronaut)
    # The same as OpenCV's own 8-bit conversion (IMREAD_COLOR).
    assert np.array_equal(image, cv2.imdecode(np.frombuffer(_encode(deep, ".png"), np.uint8), 1))


@pytest.mark.parametrize("ext", [".png", ".jpg"])
def test_gray_becomes_bgr(astronaut: np.ndarray, ext: str) -> None:
    gray = cv2.cvtColor(astronaut, cv2.COLOR_BGR2GRAY)
    image = decode_image("png" if ext == ".png" else "jpeg", _encode(gray, ext), {}, LIMITS)
    _expect_bgr(image, 512, 512)
    assert np.array_equal(image[:, :, 0], image[:, :, 1])
    assert np.array_equal(image[:, :, 0], image[:, :, 2])
    assert np.abs(image[:, :, 0].astype(int) - gray).mean() < 3


def test_alpha_is_composited_over_black(astronaut: np.ndarray) -> None:
    alpha = np.tile(np.linspace(0, 255, 512).astype(np.uint8), (512, 1))
    bgra = np.dstack([astronaut, alpha])
    image = decode_image("png", _encode(bgra, ".png"), {}, LIMITS)
    _expect_bgr(image, 512, 512)
    expected = astronaut * (alpha[:, :, None] / 255.0)
    assert np.abs(image - expected).max() <= 0.5 + 1e-9
    assert not image[:, 0].any()  # alpha 0: black


def test_gray_alpha_png_is_composited_over_black() -> None:
    pixels = np.dstack([np.full((4, 5), 200, np.uint8), np.full((4, 5), 128, np.uint8)])
    image = decode_image("png", _png_by_hand(pixels, color_type=4), {}, LIMITS)
    _expect_bgr(image, 4, 5)
    assert (image == round(200 * 128 / 255)).all()


def _png_chunk(kind: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))


def test_palette_png_with_transparency_is_composited_over_black() -> None:
    """Palette index 0 is opaque red, index 1 transparent white (a tRNS chunk)."""
    index = np.zeros((4, 6), np.uint8)
    index[:, 3:] = 1
    rows = b"".join(b"\x00" + row.tobytes() for row in index)
    payload = (
        b"\x89PNG\r\n\x1a\n"
        + _png_chunk(b"IHDR", struct.pack(">IIBBBBB", 6, 4, 8, 3, 0, 0, 0))
        + _png_chunk(b"PLTE", bytes([255, 0, 0, 255, 255, 255]))
        + _png_chunk(b"tRNS", bytes([255, 0]))
        + _png_chunk(b"IDAT", zlib.compress(rows))
        + _png_chunk(b"IEND", b"")
    )
    image = decode_image("png", payload, {}, LIMITS)
    _expect_bgr(image, 4, 6)
    assert (image[:, :3] == (0, 0, 255)).all()
    assert not image[:, 3:].any()


def test_transparent_white_becomes_black(astronaut: np.ndarray) -> None:
    alpha = np.full((512, 512), 255, np.uint8)
    alpha[:, 256:] = 0
    bgra = np.dstack([astronaut, alpha])
    bgra[:, 256:, :3] = 255
    image = decode_image("png", _encode(bgra, ".png"), {}, LIMITS)
    assert np.array_equal(image[:, :256], astronaut[:, :256])
    assert not image[:, 256:].any()


def test_check_payload_reads_sizes_without_decoding(astronaut: np.ndarray) -> None:
    assert check_payload("png", _encode(astronaut, ".png"), {}, LIMITS) == (512, 512)
    assert check_payload("jpeg", _encode(astronaut, ".jpg")[:1000], {}, LIMITS) == (512, 512)
    fields = {"shape": [480, 640, 3], "dtype": "uint8", "color": "bgr"}
    assert check_payload("raw", bytes(480 * 640 * 3), fields, LIMITS) == (640, 480)


# ---- raw arrays --------------------------------------------------------------------------


def test_raw_bgr_is_a_view_of_the_payload(astronaut: np.ndarray) -> None:
    payload = bytearray(astronaut.tobytes())
    image = decode_image("raw", payload, _raw(astronaut, "bgr")[1], LIMITS)
    _expect_bgr(image, 512, 512)
    assert np.array_equal(image, astronaut)
    assert np.shares_memory(image, np.frombuffer(payload, np.uint8))


def test_raw_rgb_is_swapped(astronaut: np.ndarray) -> None:
    rgb = np.ascontiguousarray(astronaut[:, :, ::-1])
    image = decode_image("raw", *_raw(rgb, "rgb"), LIMITS)
    assert np.array_equal(image, astronaut)


@pytest.mark.parametrize("shape", [(144, 176), (144, 176, 1)])
def test_raw_gray(shape: tuple[int, ...]) -> None:
    gray = np.random.default_rng(1).integers(0, 256, shape, dtype=np.uint8)
    image = decode_image("raw", *_raw(gray, "gray"), LIMITS)
    _expect_bgr(image, 144, 176)
    assert all(np.array_equal(image[:, :, c], gray.reshape(144, 176)) for c in range(3))


@pytest.mark.parametrize("color", ["bgr", "rgb"])
def test_raw_with_alpha(astronaut: np.ndarray, color: str) -> None:
    alpha = np.full((512, 512), 51, np.uint8)  # 20 %
    colour = astronaut if color == "bgr" else astronaut[:, :, ::-1]
    image = decode_image("raw", *_raw(np.dstack([colour, alpha]), color), LIMITS)
    _expect_bgr(image, 512, 512)
    assert np.abs(image - astronaut * 0.2).max() <= 0.5 + 1e-9


def test_raw_uint16_keeps_the_high_byte_like_a_16_bit_png(astronaut: np.ndarray) -> None:
    noise = np.random.default_rng(4).integers(0, 256, astronaut.shape, dtype=np.uint16)
    deep = astronaut.astype(np.uint16) * 256 + noise
    fields = {"shape": list(deep.shape), "dtype": "uint16", "color": "bgr"}
    raw = decode_image("raw", deep.astype("<u2").tobytes(), fields, LIMITS)
    _expect_bgr(raw, 512, 512)
    assert np.array_equal(raw, astronaut)
    assert np.array_equal(raw, decode_image("png", _encode(deep, ".png"), {}, LIMITS))


def test_12_bit_gray_is_scaled_not_clipped_nor_wrapped() -> None:
    """Values up to 4095 keep their high byte: 0-15, the documented rule, on both paths."""
    gray = (np.arange(480 * 640) % 4096).astype(np.uint16).reshape(480, 640)
    fields = {"shape": [480, 640], "dtype": "uint16", "color": "gray"}
    raw = decode_image("raw", gray.tobytes(), fields, LIMITS)
    png = decode_image("png", _encode(gray, ".png"), {}, LIMITS)
    _expect_bgr(raw, 480, 640)
    assert np.array_equal(raw, png)
    assert np.array_equal(raw[:, :, 0], (gray >> 8).astype(np.uint8))
    assert raw.max() == 15


def test_raw_uint16_size_counts_two_bytes_per_sample() -> None:
    fields = {"shape": [4, 4], "dtype": "uint16", "color": "gray"}
    assert decode_image("raw", bytes(32), fields, LIMITS).shape == (4, 4, 3)
    error = _reason("raw", bytes(16), fields)
    assert error.reason == Reason.DECODE_FAILED and "needs 32" in error.detail


def test_raw_memoryview_payload(astronaut: np.ndarray) -> None:
    payload, fields = _raw(astronaut, "bgr")
    assert np.array_equal(decode_image("raw", memoryview(payload), fields, LIMITS), astronaut)


# ---- failures ----------------------------------------------------------------------------


@pytest.mark.parametrize("encoding", ["jpeg", "png", "raw"])
def test_empty_payload(encoding: str) -> None:
    fields = {"shape": [2, 2], "dtype": "uint8", "color": "gray"}
    error = _reason(encoding, b"", fields)
    assert error.reason == Reason.DECODE_FAILED
    assert "empty" in error.detail


@pytest.mark.parametrize("encoding", ["jpeg", "png"])
def test_random_bytes(encoding: str) -> None:
    payload = np.random.default_rng(2).bytes(100)
    assert _reason(encoding, payload, {}).reason == Reason.DECODE_FAILED


@pytest.mark.parametrize("encoding", ["jpeg", "png"])
def test_random_bytes_after_a_valid_signature(encoding: str) -> None:
    magic = b"\xff\xd8" if encoding == "jpeg" else b"\x89PNG\r\n\x1a\n"
    payload = magic + np.random.default_rng(3).bytes(100)
    assert _reason(encoding, payload, {}).reason == Reason.DECODE_FAILED


def test_jpeg_cut_to_1000_bytes(astronaut: np.ndarray) -> None:
    payload = _encode(astronaut, ".jpg")[:1000]
    assert encoded_size("jpeg", payload) == (512, 512)  # the header survives, the data not
    assert _reason("jpeg", payload, {}).reason == Reason.DECODE_FAILED


def test_jpeg_missing_only_its_eoi_marker_is_rejected(astronaut: np.ndarray) -> None:
    """Measured with OpenCV 4.14 and 5.0: imdecode returns None without the last 2 bytes."""
    payload = _encode(astronaut, ".jpg")
    assert payload[-2:] == b"\xff\xd9"
    assert _reason("jpeg", payload[:-2], {}).reason == Reason.DECODE_FAILED


def test_jpeg_whose_eoi_marker_is_replaced_by_padding_is_decoded(astronaut: np.ndarray) -> None:
    """The EOI marker is not looked for: libjpeg fails when its data runs out, so with
    enough other bytes in its place the complete scan decodes (README, "Decoding rules")."""
    payload = _encode(astronaut, ".jpg")
    whole = decode_image("jpeg", payload, {}, LIMITS)
    padded = decode_image("jpeg", payload[:-2] + bytes(16), {}, LIMITS)
    assert np.array_equal(padded, whole)


def test_png_cut_in_its_data(astronaut: np.ndarray) -> None:
    payload = _encode(astronaut, ".png")
    assert _reason("png", payload[: len(payload) // 2], {}).reason == Reason.DECODE_FAILED


def test_encoding_must_match_the_bytes(astronaut: np.ndarray) -> None:
    error = _reason("jpeg", _encode(astronaut, ".png"), {})
    assert error.reason == Reason.DECODE_FAILED
    assert "not a JPEG" in error.detail


def test_unknown_encoding() -> None:
    assert _reason("webp", b"RIFF....", {}).reason == Reason.BAD_HEADER


def _patch_png_size(payload: bytes, width: int, height: int) -> bytes:
    return payload[:16] + struct.pack(">II", width, height) + payload[24:]


def _patch_jpeg_size(payload: bytes, width: int, height: int) -> bytes:
    sof = payload.index(b"\xff\xc0")  # cv2.imencode writes baseline JPEG (SOF0)
    return payload[: sof + 5] + struct.pack(">HH", height, width) + payload[sof + 9 :]


@pytest.mark.parametrize(
    ("width", "height"), [(8193, 10), (10, 8193), (8000, 8000)], ids=["wide", "tall", "pixels"]
)
def test_too_large_png_is_refused_from_its_header(
    astronaut: np.ndarray, width: int, height: int
) -> None:
    payload = _patch_png_size(_encode(astronaut, ".png"), width, height)
    assert encoded_size("png", payload) == (width, height)
    error = _reason("png", payload, {})
    assert error.reason == Reason.TOO_LARGE
    assert f"{width}x{height}" in error.detail


def test_too_large_jpeg_is_refused_from_its_header(astronaut: np.ndarray) -> None:
    payload = _patch_jpeg_size(_encode(astronaut, ".jpg"), 65535, 65535)
    assert encoded_size("jpeg", payload) == (65535, 65535)
    assert _reason("jpeg", payload, {}).reason == Reason.TOO_LARGE


def test_custom_limits(astronaut: np.ndarray) -> None:
    small = DecodeLimits(max_width=100, max_height=100, max_pixels=10_000)
    for encoding, ext in (("jpeg", ".jpg"), ("png", ".png")):
        with pytest.raises(FrameError) as info:
            decode_image(encoding, _encode(astronaut, ext), {}, small)
        assert info.value.reason == Reason.TOO_LARGE
    with pytest.raises(FrameError) as info:
        decode_image("raw", *_raw(astronaut, "bgr"), small)
    assert info.value.reason == Reason.TOO_LARGE


def test_raw_too_large_is_refused_before_the_size_check() -> None:
    fields = {"shape": [9000, 9000, 3], "dtype": "uint8", "color": "bgr"}
    assert _reason("raw", b"\x00" * 16, fields).reason == Reason.TOO_LARGE


@pytest.mark.parametrize(
    "shape",
    [None, "144x176", [144], [1, 2, 3, 4], [144, 176, 2], [144, 0], [-1, 176], [144.0, 176]]
    + [[True, 176], [144, 176, 5]],
)
def test_raw_bad_shape(shape: object) -> None:
    fields = {"shape": shape, "dtype": "uint8", "color": "bgr"}
    error = _reason("raw", b"\x00" * 100, fields)
    assert error.reason == Reason.BAD_HEADER
    assert "shape" in error.detail


@pytest.mark.parametrize(
    ("shape", "color"),
    [([4, 4], "bgr"), ([4, 4, 1], "rgb"), ([4, 4, 3], "gray"), ([4, 4, 4], "gray")]
    + [([4, 4, 3], None), ([4, 4, 3], "BGR")],
)
def test_raw_bad_color(shape: list[int], color: object) -> None:
    fields = {"shape": shape, "dtype": "uint8", "color": color}
    error = _reason("raw", bytes(int(np.prod(shape))), fields)
    assert error.reason == Reason.BAD_HEADER
    assert "color" in error.detail


@pytest.mark.parametrize("dtype", [">u2", "<u2", "float32", "int8", "u1", "bool"])
def test_raw_unsupported_dtype(dtype: str) -> None:
    fields = {"shape": [4, 4], "dtype": dtype, "color": "gray"}
    assert _reason("raw", bytes(16), fields).reason == Reason.UNSUPPORTED_DTYPE


@pytest.mark.parametrize("dtype", [None, 8, ["uint8"]])
def test_raw_dtype_not_a_string(dtype: object) -> None:
    fields = {"shape": [4, 4], "dtype": dtype, "color": "gray"}
    assert _reason("raw", bytes(16), fields).reason == Reason.BAD_HEADER


@pytest.mark.parametrize("size", [15, 17, 48])
def test_raw_payload_size_must_match_the_shape(size: int) -> None:
    fields = {"shape": [4, 4], "dtype": "uint8", "color": "gray"}
    error = _reason("raw", bytes(size), fields)
    assert error.reason == Reason.DECODE_FAILED
    assert f"{size} bytes" in error.detail
    assert "16" in error.detail


@settings(max_examples=300, deadline=None)
@given(
    encoding=st.sampled_from(["jpeg", "png"]),
    prefix=st.sampled_from([b"", b"\xff\xd8", b"\xff\xd8\xff\xc0", b"\x89PNG\r\n\x1a\n"]),
    body=st.binary(max_size=64),
)
def test_any_bytes_fail_only_with_a_frame_error(encoding: str, prefix: bytes, body: bytes) -> None:
    try:
        decode_image(encoding, prefix + body, {}, LIMITS)
    except FrameError as exc:
        assert exc.reason in (Reason.DECODE_FAILED, Reason.TOO_LARGE)

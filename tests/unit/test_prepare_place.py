"""Where a frame is prepared: small raw frames on the ingress thread, the rest on the pool."""

from __future__ import annotations

import time

import cv2
import numpy as np

from streamer.frames import Frame
from streamer.pipeline import INLINE_MAX_PIXELS, prepared_inline
from streamer.vision.decode import DecodeLimits, check_payload


def checked(encoding: str, payload: bytes, header: dict) -> Frame:
    """A frame as the ingress leaves it: its size from :func:`check_payload`."""
    frame = Frame("cam", 0, time.monotonic_ns(), time.time(), encoding=encoding, payload=payload)
    frame.header = header
    frame.width, frame.height = check_payload(encoding, payload, header, DecodeLimits())
    return frame


def raw(height: int, width: int) -> Frame:
    image = np.zeros((height, width, 3), np.uint8)
    header = {"shape": [height, width, 3], "dtype": "uint8", "color": "bgr"}
    return checked("raw", image.tobytes(), header)


def test_small_raw_frames_are_prepared_inline() -> None:
    assert prepared_inline(raw(144, 176))
    assert prepared_inline(raw(480, 640)) and INLINE_MAX_PIXELS == 480 * 640


def test_large_raw_and_encoded_frames_go_to_the_pool() -> None:
    assert not prepared_inline(raw(720, 1280))
    jpeg = cv2.imencode(".jpg", np.zeros((144, 176, 3), np.uint8))[1].tobytes()
    assert not prepared_inline(checked("jpeg", jpeg, {}))


def test_an_unchecked_frame_goes_to_the_pool() -> None:
    frame = Frame("cam", 0, time.monotonic_ns(), time.time(), encoding="raw", payload=b"")
    assert not prepared_inline(frame)

"""ImagezmqReader on the exact messages imagezmq 1.2.0's own sockets send."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import cv2
import imagezmq
import numpy as np
import pytest
import zmq

from streamer.errors import FrameError, Reason
from streamer.frames import Frame
from streamer.transport.imagezmq import MAX_TRACKED_SOURCES, ImagezmqReader, encode_reply
from streamer.vision.decode import DecodeLimits, decode_image

Send = Callable[[Callable[[Any], object]], list[memoryview]]


@pytest.fixture
def wire() -> Iterator[Send]:
    """Runs ``send(socket)`` on an imagezmq SerializingSocket; returns the parts received."""
    context = imagezmq.imagezmq.SerializingContext()
    sender = context.socket(zmq.PAIR)
    receiver = context.socket(zmq.PAIR)
    receiver.bind("inproc://imagezmq")
    sender.connect("inproc://imagezmq")

    def send(action: Callable[[Any], object]) -> list[memoryview]:
        action(sender)
        return [frame.buffer for frame in receiver.recv_multipart(copy=False)]

    yield send
    sender.close(linger=0)
    receiver.close(linger=0)
    context.term()


def _decode(frame: Frame) -> np.ndarray:
    assert frame.payload is not None
    return decode_image(frame.encoding, frame.payload, frame.header, DecodeLimits())


def test_send_image_is_a_raw_bgr_frame(wire: Send, astronaut: np.ndarray) -> None:
    reader = ImagezmqReader(None)
    frames = [reader.read(wire(lambda s: s.send_array(astronaut, "cam")), 1, 2.0) for _ in "ab"]
    assert [(f.source, f.seq, f.encoding) for f in frames] == [("cam", 0, "raw"), ("cam", 1, "raw")]
    assert frames[0].error is None and frames[0].meta is None
    assert np.array_equal(_decode(frames[0]), astronaut)


def test_send_jpg_is_a_jpeg_frame(wire: Send, astronaut: np.ndarray) -> None:
    jpg = cv2.imencode(".jpg", astronaut)[1].tobytes()
    frame = ImagezmqReader(None).read(wire(lambda s: s.send_jpg("door", jpg)), 1, 2.0)
    assert (frame.source, frame.seq, frame.encoding, frame.error) == ("door", 0, "jpeg", None)
    assert _decode(frame).shape == (512, 512, 3)


@pytest.mark.parametrize(
    ("shape", "color"), [((48, 64), "gray"), ((48, 64, 1), "gray"), ((48, 64, 4), "bgr")]
)
def test_array_channels_follow_opencv(wire: Send, shape: tuple[int, ...], color: str) -> None:
    array = np.full(shape, 200, np.uint8)
    frame = ImagezmqReader(None).read(wire(lambda s: s.send_array(array, "cam")), 1, 2.0)
    assert frame.header["color"] == color
    assert _decode(frame).shape == (48, 64, 3)


def test_fixed_source_keeps_msg_in_meta(wire: Send) -> None:
    array = np.zeros((4, 4, 3), np.uint8)
    reader = ImagezmqReader("porch")
    frames = [
        reader.read(wire(lambda s: s.send_array(array, "x")), 1, 2.0),
        reader.read(wire(lambda s: s.send_array(array, "y")), 1, 2.0),
    ]
    assert [(f.source, f.seq, f.meta) for f in frames] == [
        ("porch", 0, {"msg": "x"}),
        ("porch", 1, {"msg": "y"}),
    ]


def test_a_msg_too_deep_to_echo_is_bad_header(wire: Send) -> None:
    """imagezmq's send_jpg takes any JSON as its msg; a fixed source echoes it in meta."""
    deep: Any = "x"
    for _ in range(300):
        deep = [deep]
    frame = ImagezmqReader("porch").read(wire(lambda s: s.send_jpg(deep, b"\xff\xd8")), 1, 2.0)
    assert frame.error is not None and frame.error.reason == Reason.BAD_HEADER
    assert "nested deeper than 32 levels" in frame.error.detail and frame.meta is None


def test_seq_is_per_source_and_memory_is_bounded(wire: Send) -> None:
    reader = ImagezmqReader(None)
    parts = wire(lambda s: s.send_jpg("a", b"\xff\xd8"))
    assert [reader.read(parts, 1, 2.0).seq for _ in range(3)] == [0, 1, 2]
    for n in range(MAX_TRACKED_SOURCES):
        reader.read([memoryview(f'{{"msg": "s{n}"}}'.encode()), parts[1]], 1, 2.0)
    assert reader.read(parts, 1, 2.0).seq == 0  # "a" was the least recently seen: forgotten


@pytest.mark.parametrize(
    ("parts", "detail"),
    [
        ([b'{"msg": "cam"}'], "2 parts"),
        ([b'{"msg": "cam"}', b"x", b"y"], "2 parts"),
        ([b'{"msg": 7}', b"x"], "msg"),
        ([b'{"msg": ""}', b"x"], "msg"),
        ([b"[1]", b"x"], "object"),
        ([b"\xff", b"x"], "JSON"),
        ([b"[" * 60_000, b"x"], "nested deeper than 1024 levels"),
    ],
)
def test_malformed_messages_fail_with_bad_header(parts: list[bytes], detail: str) -> None:
    frame = ImagezmqReader(None).read([memoryview(p) for p in parts], 1, 2.0)
    assert frame.error is not None and frame.error.reason == Reason.BAD_HEADER
    assert detail in frame.error.detail


@pytest.mark.parametrize(
    ("dtype", "reason"), [(np.float32, Reason.UNSUPPORTED_DTYPE), (np.uint16, None)]
)
def test_dtypes_follow_the_decoding_rules(wire: Send, dtype: Any, reason: str | None) -> None:
    array = np.full((8, 8, 3), 4095, dtype)
    frame = ImagezmqReader(None).read(wire(lambda s: s.send_array(array, "cam")), 1, 2.0)
    if reason is None:
        assert (_decode(frame) == 4095 >> 8).all()
    else:
        with pytest.raises(FrameError) as info:
            _decode(frame)
        assert info.value.reason == reason


def test_reply_is_ok_or_an_error_line() -> None:
    frame = Frame("cam", 0, 1, 2.0)
    assert encode_reply(frame) == b"OK"
    frame.fail(FrameError(Reason.TOO_LARGE, "image is 9000x9000"))
    assert encode_reply(frame) == b"ERROR too_large: image is 9000x9000"
    dropped = Frame("cam", 0, 1, 2.0)
    assert encode_reply(dropped, "queue_full") == (
        b"ERROR queue_full: dropped on arrival; no result follows"
    )

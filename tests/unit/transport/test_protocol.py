import json
from typing import Any

import numpy as np
import pytest

from streamer.errors import FrameError, Reason
from streamer.frames import EndOfStream, Frame
from streamer.transport.protocol import (
    MAX_META_DEPTH,
    encode_ack,
    encode_eos,
    encode_eos_result,
    encode_frame,
    encode_result,
    nested_deeper_than,
    parse_header,
    read_message,
    source_of_unparsable,
)


def test_frame_round_trip_raw_array() -> None:
    image = np.arange(2 * 3 * 3, dtype=np.uint8).reshape(2, 3, 3)
    header_raw, payload = encode_frame("cam", 7, image, encoding="raw", ts=1.5, meta={"k": 1})
    header = parse_header(header_raw)
    assert (header.source, header.seq, header.encoding, header.ts) == ("cam", 7, "raw", 1.5)
    assert header.meta == {"k": 1} and not header.eos and header.run is None
    assert header.fields["shape"] == [2, 3, 3] and header.fields["color"] == "bgr"
    assert bytes(payload) == image.tobytes()


def test_eos_header() -> None:
    header = parse_header(encode_eos("cam", 9)[0])
    assert header.eos and header.seq == 9


@pytest.mark.parametrize(
    "raw",
    [
        b"not json",
        b"\xff\xfe",
        b"[1, 2]",
        b'{"v": 2, "source": "a", "seq": 0, "encoding": "jpeg"}',
        b'{"v": 1, "source": "", "seq": 0, "encoding": "jpeg"}',
        b'{"v": 1, "source": "a", "seq": -1, "encoding": "jpeg"}',
        b'{"v": 1, "source": "a", "seq": true, "encoding": "jpeg"}',
        b'{"v": 1, "source": "a", "seq": 0, "encoding": "gif"}',
        b'{"v": 1, "source": "a", "seq": 0, "encoding": "jpeg", "ts": NaN}',
        b'{"v": 1, "source": "a", "seq": 0, "encoding": "jpeg", "meta": [1]}',
        b'{"v": 1, "source": "a", "seq": 0, "encoding": "jpeg", "run": ""}',
        b'{"v": 1, "source": "a", "seq": 0, "encoding": "jpeg", "run": 7}',
        b'{"v": 1, "source": "a", "seq": 0, "encoding": "jpeg", "run": "%s"}' % (b"r" * 65),
        b"{" * 100_000,
        b"[" * 60_000,
    ],
)
def test_bad_headers_are_bad_header(raw: bytes) -> None:
    with pytest.raises(FrameError) as info:
        parse_header(raw)
    assert info.value.reason == Reason.BAD_HEADER


def nested(levels: int) -> dict[str, Any]:
    """A meta object ``levels`` deep: ``{"d": [[...]]}``."""
    value: Any = []
    for _ in range(levels - 2):
        value = [value]
    return {"d": value}


def test_meta_nested_deeper_than_the_limit_is_bad_header() -> None:
    """A producer's meta is echoed in its result: 254 levels made the result unencodable and
    stopped the daemon (orjson refuses to write more than 254; it reads 1024)."""
    fits = encode_frame("cam", 0, b"jpeg", encoding="jpeg", meta=nested(MAX_META_DEPTH))
    assert parse_header(fits[0]).meta == nested(MAX_META_DEPTH)
    header = {"v": 1, "source": "cam", "seq": 0, "encoding": "jpeg"}
    for levels in (MAX_META_DEPTH + 1, 300):
        deep = json.dumps({**header, "meta": nested(levels)}).encode()
        with pytest.raises(FrameError, match="nested deeper than 32 levels") as info:
            parse_header(deep)
        assert info.value.reason == Reason.BAD_HEADER


def test_nested_deeper_than_counts_containers() -> None:
    assert not nested_deeper_than(7, 0) and not nested_deeper_than({}, 1)
    assert nested_deeper_than({}, 0) and nested_deeper_than({"a": [1]}, 1)
    assert not nested_deeper_than({"a": [1], "b": {"c": "d"}}, 2)


def test_source_of_unparsable_is_best_effort() -> None:
    assert source_of_unparsable(b'{"source": "a", "seq": 3, "v": 9}') == ("a", 3, None)
    assert source_of_unparsable(b'{"source": "a", "seq": 3, "run": "r"}') == ("a", 3, "r")
    assert source_of_unparsable(b'{"source": "a", "seq": 3, "run": ""}') == ("a", 3, None)
    assert source_of_unparsable(b"garbage") == ("", -1, None)


def test_result_fields_and_latency_split() -> None:
    frame = Frame("cam", 4, received_at_ns=1_000_000_000, received_at=100.0, ts=99.5)
    frame.meta, frame.width, frame.height, frame.model = {"x": 1}, 176, 144, "face"
    frame.infer_start_ns, frame.infer_end_ns = 1_002_000_000, 1_005_000_000
    frame.results = {"detections": []}
    topic, body = encode_result(frame, done_at_ns=1_010_000_000)
    result = json.loads(body)
    assert topic == b"cam"
    assert result["latency_ms"] == {"queue": 2.0, "infer": 3.0, "total": 10.0}
    assert result["done_at"] == pytest.approx(100.01)
    assert result["error"] is None and result["meta"] == {"x": 1}
    assert (result["width"], result["height"], result["detections"]) == (176, 144, [])


def test_error_result_and_eos_result() -> None:
    frame = Frame("cam", 1, received_at_ns=0, received_at=1.0)
    frame.fail(FrameError(Reason.DECODE_FAILED, "bad jpeg"))
    result = json.loads(encode_result(frame, done_at_ns=10)[1])
    assert result["error"] == {"reason": "decode_failed", "detail": "bad jpeg"}
    eos = json.loads(encode_eos_result(EndOfStream("cam", 5))[1])
    assert eos["eos"] is True and eos["seq"] == 5


def _read(*parts: bytes | memoryview) -> Frame | EndOfStream:
    return read_message([memoryview(p) for p in parts], 5, 1.0)


def test_read_message_frame_keeps_the_payload_as_a_view() -> None:
    header, payload = encode_frame("cam", 3, b"\xff\xd8jpeg", encoding="jpeg", meta={"a": 1})
    item = _read(header, payload)
    assert isinstance(item, Frame) and item.error is None
    assert (item.source, item.seq, item.encoding, item.meta) == ("cam", 3, "jpeg", {"a": 1})
    assert isinstance(item.payload, memoryview) and bytes(item.payload) == b"\xff\xd8jpeg"
    assert (item.received_at_ns, item.received_at) == (5, 1.0)


def test_read_message_eos() -> None:
    item = _read(*encode_eos("cam", 9))
    assert isinstance(item, EndOfStream) and (item.source, item.seq) == ("cam", 9)


def test_run_travels_from_header_to_results() -> None:
    """A producer's ``run`` is read into the frame and its end of stream, and echoed in
    their results (null for a producer that sends none)."""
    run = "r" * 64
    frame = _read(*encode_frame("cam", 3, b"\xff\xd8", encoding="jpeg", run=run))
    eos = _read(*encode_eos("cam", 3, run=run))
    assert isinstance(frame, Frame) and frame.error is None and frame.run == run
    assert isinstance(eos, EndOfStream) and eos.run == run
    assert json.loads(encode_result(frame, done_at_ns=10)[1])["run"] == run
    assert json.loads(encode_eos_result(eos)[1])["run"] == run
    plain = _read(*encode_frame("cam", 4, b"\xff\xd8", encoding="jpeg"))
    assert isinstance(plain, Frame) and plain.run is None
    assert json.loads(encode_result(plain, done_at_ns=10)[1])["run"] is None


@pytest.mark.parametrize(
    ("parts", "source", "seq", "detail"),
    [
        ([encode_frame("cam", 1, b"x", encoding="jpeg")[0]], "cam", 1, "got 1 parts"),
        ([encode_frame("cam", 2, b"x", encoding="jpeg")[0], b"x", b"y"], "cam", 2, "got 3 parts"),
        ([encode_eos("cam", 4)[0], b"x"], "cam", 4, "end of stream is [header]"),
        ([b"{not json", b"x"], "", -1, "not JSON"),
        ([b"[" * 60_000, b"x"], "", -1, "header is nested deeper than 1024 levels"),
        ([b"[" * 2000 + b"]" * 2000, b"x"], "", -1, "header is nested deeper than 1024 levels"),
        ([b" " * 70_000 + b"{}", b"x"], "", -1, "more than"),
        ([b'{"v": 1, "source": "s", "seq": true}', b"x"], "s", -1, "seq"),
    ],
    ids=[
        "one-part",
        "three-part",
        "eos-with-payload",
        "not-json",
        "deep",
        "deep-json",
        "huge",
        "bool-seq",
    ],
)
def test_read_message_malformed_is_one_bad_header_frame(
    parts: list[bytes], source: str, seq: int, detail: str
) -> None:
    item = _read(*parts)
    assert isinstance(item, Frame) and item.error is not None
    assert item.error.reason == Reason.BAD_HEADER and detail in item.error.detail
    assert (item.source, item.seq, item.payload) == (source, seq, None)


def test_a_refused_frame_keeps_the_run_its_header_gives() -> None:
    """Its error result names the run, and the source tracker checks its seq in that run
    (a refused next seq moves the run's count; checked against no run, it made a gap)."""
    three = _read(encode_frame("cam", 2, b"x", encoding="jpeg", run="r")[0], b"x", b"y")
    invalid = _read(b'{"v": 1, "source": "s", "seq": 5, "encoding": "gif", "run": "r"}', b"x")
    for item in (three, invalid):
        assert isinstance(item, Frame) and item.error is not None and item.run == "r"


def test_ack_says_what_the_ingress_decided() -> None:
    good = _read(*encode_frame("cam", 1, b"x", encoding="jpeg"))
    assert json.loads(encode_ack(good)) == {"ok": True, "source": "cam", "seq": 1}
    eos = _read(*encode_eos("cam", 1))
    assert json.loads(encode_ack(eos)) == {"ok": True, "source": "cam", "seq": 1, "eos": True}
    bad = _read(b"{not json", b"x")
    ack = json.loads(encode_ack(bad))
    assert ack["ok"] is False and ack["reason"] == "bad_header" and ack["detail"]
    assert (ack["source"], ack["seq"]) == ("", -1)


@pytest.mark.parametrize(
    "raw",
    [
        b'{"v": true, "source": "a", "seq": 0, "encoding": "jpeg"}',
        b'{"v": 1.0, "source": "a", "seq": 0, "encoding": "jpeg"}',
        b'{"v": 1, "source": "a", "seq": 9007199254740992, "encoding": "jpeg"}',
        b'{"v": 1, "source": "a", "seq": 0, "eos": "yes"}',
    ],
)
def test_strict_types_for_version_seq_and_eos(raw: bytes) -> None:
    with pytest.raises(FrameError) as info:
        parse_header(raw)
    assert info.value.reason == Reason.BAD_HEADER

"""Hostile and odd inputs through the real daemon: each gives exactly one result (an error
with a stable reason, or a normal result where the README's decoding rules accept it), the
daemon stays up, the next good frame is processed normally, and every message is accounted
for."""

from __future__ import annotations

import json
import signal
import struct
import time
import zlib
from pathlib import Path
from typing import Any

import cv2
import numpy as np
import zmq
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from streamer.errors import FrameError
from streamer.transport.protocol import encode_frame, parse_header

from .conftest import Client, Daemon

MiB = 1024 * 1024
BIG_SHAPE = (8000, 8000, 3)  # 192 MB of raw pixels


def peak_rss_bytes(daemon: Daemon) -> int:
    """The daemon's peak resident set size (``VmHWM``)."""
    status = Path(f"/proc/{daemon.process.pid}/status").read_text()
    line = next(line for line in status.splitlines() if line.startswith("VmHWM:"))
    return int(line.split()[1]) * 1024


def chunk(kind: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))


def palette_png(width: int, height: int) -> bytes:
    """Palette PNG: index 0 opaque red, index 1 fully transparent white (a tRNS chunk)."""
    rows = b"".join(b"\x00" + bytes([(x // 64) % 2 for x in range(width)]) for _ in range(height))
    return (
        b"\x89PNG\r\n\x1a\n"
        + chunk(b"IHDR", struct.pack(">IIBBBBB", width, height, 8, 3, 0, 0, 0))
        + chunk(b"PLTE", bytes([255, 0, 0, 255, 255, 255]))
        + chunk(b"tRNS", bytes([255, 0]))
        + chunk(b"IDAT", zlib.compress(rows))
        + chunk(b"IEND", b"")
    )


def png(image: np.ndarray) -> bytes:
    return cv2.imencode(".png", image)[1].tobytes()


def raw(
    source: str, array: np.ndarray, color: str, claims: dict[str, Any] | None = None
) -> list[Any]:
    """A raw frame of ``array``; ``claims`` replace header fields (a header that lies)."""
    header, body = encode_frame(source, 0, array, encoding="raw", color=color)
    if claims:
        header = json.dumps({**json.loads(bytes(header)), **claims}).encode()
    return [header, body]


def lie_shape(*shape: int) -> dict[str, Any]:
    return {"shape": list(shape)}


def frame(source: str, payload: bytes, encoding: str) -> list[Any]:
    return encode_frame(source, 0, payload, encoding=encoding)


def hostile_cases(image: np.ndarray) -> list[tuple[str, list[Any], str | None]]:
    """(source, message parts, expected error reason or None for a normal result)."""
    jpeg = cv2.imencode(".jpg", image)[1].tobytes()
    gray = cv2.cvtColor(image, cv2.COLOR_BGR2GRAY)
    transparent = np.dstack([image, np.full(image.shape[:2], 255, np.uint8)])
    transparent[400:] = 255  # white ...
    transparent[400:, :, 3] = 0  # ... and fully transparent: composited over black
    deep = (np.arange(480 * 640) % 4096).astype(np.uint16).reshape(480, 640)
    huge_png = bytearray(png(image[:8, :8]))
    huge_png[16:24] = struct.pack(">II", 30000, 30000)
    header, _ = frame("one-part", jpeg, "jpeg")
    deep_meta: Any = []
    for _ in range(300):  # results echo meta; orjson writes at most 254 levels
        deep_meta = [deep_meta]
    deep_header = {"v": 1, "source": "deep-meta", "seq": 0, "encoding": "jpeg"}
    deep_header["meta"] = {"d": deep_meta}
    return [
        ("jpeg-without-eoi", frame("jpeg-without-eoi", jpeg[:-2], "jpeg"), "decode_failed"),
        ("jpeg-1000-bytes", frame("jpeg-1000-bytes", jpeg[:1000], "jpeg"), "decode_failed"),
        ("empty", frame("empty", b"", "jpeg"), "decode_failed"),
        ("random", frame("random", np.random.default_rng(0).bytes(100), "jpeg"), "decode_failed"),
        ("rgba-white", frame("rgba-white", png(transparent), "png"), None),
        ("palette-trns", frame("palette-trns", palette_png(640, 480), "png"), None),
        ("gray16-png", frame("gray16-png", png(deep), "png"), None),
        ("gray16-raw", raw("gray16-raw", deep, "gray"), None),
        ("gray-2d", raw("gray-2d", gray, "gray"), None),
        ("gray-hw1", raw("gray-hw1", gray[:, :, None], "gray"), None),
        ("gray-jpeg", frame("gray-jpeg", cv2.imencode(".jpg", gray)[1].tobytes(), "jpeg"), None),
        ("png-30000", frame("png-30000", bytes(huge_png), "png"), "too_large"),
        (
            "raw-100000",
            raw("raw-100000", gray[:2, :2], "bgr", lie_shape(100000, 100000, 3)),
            "too_large",
        ),
        ("one-part", [header], "bad_header"),
        ("deep-meta", [json.dumps(deep_header).encode(), jpeg], "bad_header"),
        ("three-part", [*frame("three-part", jpeg, "jpeg"), b"extra"], "bad_header"),
        ("", [b"{not json", jpeg], "bad_header"),
        ("raw-mismatch", raw("raw-mismatch", gray, "bgr", lie_shape(480, 640, 3)), "decode_failed"),
    ]


def test_hostile_inputs_fail_alone(start_daemon: Any, connect: Any, astronaut: np.ndarray) -> None:
    daemon = start_daemon(ingress_extra=f"max_message_bytes = {256 * MiB}")
    client: Client = connect(daemon)
    image = cv2.resize(astronaut, (640, 480))
    good = cv2.imencode(".jpg", image)[1].tobytes()
    cases = hostile_cases(image)
    for seq, (_, parts, _) in enumerate(cases):
        client.send_parts(parts)
        client.send_parts(encode_frame("good", seq, good, encoding="jpeg"))
    results = client.collect(2 * len(cases), timeout_s=60)
    by_source: dict[str, list[dict[str, Any]]] = {}
    for result in results:
        by_source.setdefault(result["source"], []).append(result)
    goods = by_source.pop("good")
    assert [r["seq"] for r in goods] == list(range(len(cases)))
    assert all(r["error"] is None and len(r["detections"]) == 1 for r in goods)
    for source, _, reason in cases:
        (result,) = by_source.pop(source)
        assert (result["error"] or {}).get("reason") == reason, (source, result)
    assert not by_source
    _check_accepted(_by_case(results), goods[0])
    _check_big_raw_array(daemon, client, good, len(cases))
    assert daemon.stop() == 0
    final = daemon.final_counts()
    assert final["received"] == final["published"] + final["failed"] + final["dropped"]
    assert final["failed_by_reason"] == {"decode_failed": 5, "too_large": 3, "bad_header": 4}


def test_a_refused_seq_does_not_block_its_source(
    start_daemon: Any, connect: Any, astronaut: np.ndarray
) -> None:
    """A ``seq`` of 2**53 (past the largest, 2**53 - 1) fails ``bad_header``; the frames after
    it follow the last valid ``seq`` and are published in order, and no gap is counted."""
    daemon = start_daemon()
    client: Client = connect(daemon)
    jpeg = cv2.imencode(".jpg", cv2.resize(astronaut, (128, 128)))[1].tobytes()
    seqs = [0, 1, 2**53, 2, 3, 4]
    for seq in seqs:
        client.send_parts(encode_frame("cam", seq, jpeg, encoding="jpeg"))
    results = client.collect(len(seqs), timeout_s=30)
    assert [r["seq"] for r in results] == seqs
    reasons = [(r["error"] or {}).get("reason") for r in results]
    assert reasons == [None, None, "bad_header", None, None, None]
    assert daemon.stop() == 0
    final = daemon.final_counts()
    assert (final["seq_gaps"], final["stale_frames"], final["dropped"]) == (0, 0, 0)


def _check_big_raw_array(daemon: Daemon, client: Client, good: bytes, seq: int) -> None:
    """The 8000x8000x3 array (192 MB) fits this daemon's 256 MiB ``max_message_bytes`` and is
    refused by the default pixel limit (40 M) before any decoding: one ``too_large`` result,
    and the daemon's peak memory grows by the message itself and no more."""
    peak_before = peak_rss_bytes(daemon)
    client.send_parts(raw("raw-8000", np.zeros(BIG_SHAPE, np.uint8), "bgr"))
    client.send_parts(encode_frame("good", seq, good, encoding="jpeg"))
    big, after = client.collect(2, timeout_s=30)
    growth = peak_rss_bytes(daemon) - peak_before
    assert growth < np.prod(BIG_SHAPE) + 32 * MiB, growth  # no copy, nothing decoded
    assert (big["source"], big["error"]["reason"]) == ("raw-8000", "too_large")
    assert (after["source"], after["error"], len(after["detections"])) == ("good", None, 1)


def _by_case(results: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {r["source"]: r for r in results if r["source"] != "good"}


def _check_accepted(results: dict[str, dict[str, Any]], good: dict[str, Any]) -> None:
    """What the decoding rules promise for the inputs they accept."""
    for source in ("rgba-white", "palette-trns", "gray16-png", "gray16-raw", "gray-2d"):
        assert (results[source]["width"], results[source]["height"]) == (640, 480), source
    # Transparent white became black: the face above it is found where the opaque one is.
    (face,) = results["rgba-white"]["detections"]
    assert np.allclose(face["box"], good["detections"][0]["box"], atol=4)
    # 12-bit samples in 16 bits are scaled the same way (high byte) on both paths.
    assert results["gray16-png"]["detections"] == results["gray16-raw"]["detections"]
    # Gray images are processed like any other: the face is found in all three.
    assert all(len(results[s]["detections"]) == 1 for s in ("gray-2d", "gray-hw1", "gray-jpeg"))


def test_oversized_message_drops_only_its_sender(
    start_daemon: Any, connect: Any, astronaut: np.ndarray
) -> None:
    """Over ``max_message_bytes`` (64 MiB by default) ZeroMQ drops the sender's connection
    before allocating the message: that sender gets no result, the message is not counted,
    and other streams carry on."""
    daemon = start_daemon()
    client: Client = connect(daemon)
    context: zmq.Context[Any] = zmq.Context()
    big = context.socket(zmq.PUSH)
    monitor = big.get_monitor_socket(zmq.EVENT_DISCONNECTED)
    try:
        big.connect(daemon.ingress)
        peak_before = peak_rss_bytes(daemon)
        big.send_multipart(raw("huge", np.zeros(BIG_SHAPE, np.uint8), "bgr"), copy=False)
        assert monitor.poll(10_000), "the daemon did not drop the oversized sender"
        jpeg = cv2.imencode(".jpg", astronaut)[1].tobytes()
        client.send_parts(encode_frame("other", 0, jpeg, encoding="jpeg"))
        results = client.collect(2, timeout_s=2.0)
        assert peak_rss_bytes(daemon) - peak_before < 64 * MiB
    finally:
        big.disable_monitor()
        monitor.close(linger=0)
        big.close(linger=0)
        context.term()
    assert [(r["source"], r["error"]) for r in results] == [("other", None)]
    assert daemon.stop() == 0
    assert daemon.final_counts()["received"] == client.probes + 1


def _is_eos(parts: list[bytes]) -> bool:
    """The README's rule: a one-part message whose header is a valid end of stream."""
    try:
        return len(parts) == 1 and parse_header(parts[0]).eos
    except FrameError:
        return False


def _json(strategy: st.SearchStrategy[dict[str, Any]]) -> st.SearchStrategy[bytes]:
    return strategy.map(lambda header: json.dumps(header).encode())


# Raw fields are checked when decoding, so they may be wrong in a valid header.
_RAW_FIELDS = {
    "shape": st.sampled_from([[5, 5, 3], [5, 5], [0, 5], [5, 5, 2], "5x5"]),
    "dtype": st.sampled_from(["uint8", "uint16", "float32"]),
    "color": st.sampled_from(["bgr", "rgb", "gray", "cmyk"]),
}
# Headers that are valid, so that frames get to decoding and inference ...
_VALID_HEADERS = _json(
    st.fixed_dictionaries(
        {
            "v": st.just(1),
            "source": st.sampled_from(["a", "b"]),
            "seq": st.integers(0, 6),
            "encoding": st.sampled_from(["jpeg", "png", "raw"]),
        },
        optional={"meta": st.just({"k": 1}), "ts": st.just(1.5), **_RAW_FIELDS},
    )
)
# ... and headers where any field may be wrong or missing.
_ANY_HEADERS = _json(
    st.fixed_dictionaries(
        {},
        optional={
            "v": st.sampled_from([1, 2, "1"]),
            "source": st.sampled_from(["a", "", 7]),
            "seq": st.sampled_from([0, -1, True, 1.5]),
            "encoding": st.sampled_from(["jpeg", "gif"]),
            "eos": st.booleans(),
            "meta": st.sampled_from([{"k": 1}, [1]]),
            "ts": st.sampled_from([1.5, "now"]),
            **_RAW_FIELDS,
        },
    )
)


def _messages(payloads: list[bytes]) -> st.SearchStrategy[list[bytes]]:
    """``[valid header, payload]``, end-of-stream ``[header]``, or any parts at all."""
    part = st.one_of(st.binary(max_size=200), st.sampled_from(payloads))
    framed = st.tuples(_VALID_HEADERS, st.sampled_from(payloads)).map(list)
    eos = _json(
        st.fixed_dictionaries(
            {"v": st.just(1), "source": st.sampled_from(["a", "b"]), "seq": st.integers(0, 6)}
        ).map(lambda header: {**header, "eos": True})
    ).map(lambda header: [header])
    first = st.one_of(_VALID_HEADERS, _ANY_HEADERS, part)
    anything = st.tuples(first, st.lists(part, max_size=3)).map(lambda m: [m[0], *m[1]])
    return st.one_of(framed, framed, eos, anything, anything)


def test_arbitrary_messages_are_all_accounted_for(
    start_daemon: Any, connect: Any, astronaut: np.ndarray
) -> None:
    """200 arbitrary multipart messages: the daemon stays up; every message but a valid
    end-of-stream counts as received and ends published, failed or dropped, and every
    published or failed one (and every end-of-stream) reaches the subscriber."""
    daemon = start_daemon()
    client: Client = connect(daemon)
    small = cv2.resize(astronaut, (64, 64))
    jpeg = cv2.imencode(".jpg", small)[1].tobytes()
    payloads = [jpeg, png(small), small.tobytes()[:75], jpeg[:100], b""]
    sent: list[list[bytes]] = []

    @settings(
        max_examples=200,
        deadline=None,
        database=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )
    @given(message=_messages(payloads))
    def send(message: list[bytes]) -> None:
        client.send_parts(message)
        sent.append(message)

    send()
    results = _until_idle(client)
    assert daemon.process.poll() is None, "the daemon died"
    assert daemon.stop() == 0
    final = daemon.final_counts()
    eos = sum(_is_eos(message) for message in sent)
    assert final["received"] == len(sent) - eos + client.probes
    assert final["received"] == final["published"] + final["failed"] + final["dropped"]
    assert set(final["dropped_by_reason"]) <= {"stale_seq"}  # a seq not after its source's
    frames = [r for r in results if not r.get("eos")]
    assert len(frames) == final["published"] + final["failed"] - client.probes
    assert len(results) - len(frames) == eos


def _until_idle(client: Client, idle_s: float = 1.0, limit_s: float = 30.0) -> list[Any]:
    """Every result that arrives until none has for ``idle_s``."""
    results: list[Any] = []
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        batch = client.collect(1, timeout_s=idle_s)
        if not batch:
            break
        results += batch
    return results


def test_native_library_lines_are_budgeted_log_events(
    start_daemon: Any, connect: Any, astronaut: np.ndarray
) -> None:
    """libpng writes a raw ``libpng error`` line to standard error for each corrupt PNG: in
    the daemon's log those become ``native_output`` events, at most 10 per 10 s, and no raw
    line comes out."""
    daemon = start_daemon()
    client: Client = connect(daemon)
    corrupt = bytearray(png(astronaut))
    corrupt[100:110] = b"x" * 10  # inside IDAT: the deflate stream is broken, the CRC too
    count = 40
    for seq in range(count):
        client.send_parts(encode_frame("corrupt", seq, bytes(corrupt), encoding="png"))
    results = client.collect(count)
    assert [r["error"]["reason"] for r in results] == ["decode_failed"] * count
    assert daemon.stop() == 0
    native = [e for e in daemon.logs if e.get("event") == "native_output"]
    assert 1 <= len(native) <= 10 and all(e["level"] == "warning" for e in native)
    assert native[0]["line"].startswith("libpng error:") and native[0]["suppressed"] == 0
    assert not [e for e in daemon.logs if e.get("event") == "raw"]
    unreported = daemon.final_counts()["suppressed_lines"]["native_output"]
    logged = len(native) + sum(e["suppressed"] for e in native) + unreported
    assert count - 2 <= logged <= count  # a line per frame; the last may still be in the pipe


def test_a_fatal_signal_still_dumps_every_thread_to_standard_error(start_daemon: Any) -> None:
    """With standard error a pipe read by a thread of the daemon, a dying process must not
    leave its faulthandler dump in that pipe: the dump goes to the original standard error."""
    daemon = start_daemon(env={"PYTHONFAULTHANDLER": "1"})
    daemon.process.send_signal(signal.SIGABRT)
    assert daemon.process.wait(30) == -signal.SIGABRT
    daemon.close()
    raw_lines = [e["line"] for e in daemon.logs if e.get("event") == "raw"]
    assert "Fatal Python error: Aborted" in raw_lines, raw_lines[:5]
    assert any(line.startswith("Thread 0x") for line in raw_lines)

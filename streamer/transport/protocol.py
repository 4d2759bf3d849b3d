"""The native wire protocol, version 1 (DESIGN.md §5).

Ingress message, multipart ``[header, payload]`` (a SUB ingress has a topic part first):
``header`` is a JSON object with ``v`` (1), ``source`` (str), ``seq`` (int), ``encoding``
(``jpeg`` | ``png`` | ``raw``) and, for ``raw``, ``shape`` (``[h, w]`` or ``[h, w, c]``),
``dtype`` (``uint8`` | ``uint16``) and ``color`` (``bgr`` | ``rgb`` | ``gray``); optional
``ts`` (Unix s), ``meta`` (object, echoed back) and ``run`` (the producer's run id: ``seq``
counts per run, see :mod:`streamer.scheduling.sources`). End of stream is a header with
``"eos": true`` and no payload.

A message that is not exactly ``[header]`` (end of stream) or ``[header, payload]`` (a frame)
is a failed frame (``bad_header``) named by whatever source and seq its header gives.

A REP or ROUTER ingress replies to every request with :func:`encode_ack`.

Result message, multipart ``[topic = source, json]``; see :func:`encode_result`.

This module is pure: it parses and builds messages, it owns no socket.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import orjson

from streamer.errors import FrameError, Reason
from streamer.frames import EndOfStream, Frame

__all__ = [
    "DROPPED_DETAIL",
    "ENCODINGS",
    "PROTOCOL_VERSION",
    "Header",
    "encode_ack",
    "encode_eos",
    "encode_eos_result",
    "encode_frame",
    "encode_result",
    "is_run",
    "dump_json",
    "load_json",
    "nested_deeper_than",
    "parse_header",
    "read_message",
    "source_of_unparsable",
]

PROTOCOL_VERSION = 1
ENCODINGS = ("jpeg", "png", "raw")
COLORS = ("bgr", "rgb", "gray")
MAX_HEADER_BYTES = 64 * 1024
MAX_SEQ = 2**53 - 1
"""The largest ``seq``: every JSON consumer (JavaScript's doubles included) reads it exactly."""
MAX_META_DEPTH = 32
"""Deepest nesting of objects and arrays in an echoed ``meta`` (``{}`` is 1): results must
stay encodable (orjson refuses more than 254 levels) and cheap to walk for any consumer."""
MAX_RUN_CHARS = 64
"""Longest ``run`` id, in characters."""
RUN_RULE = f"a string of 1 to {MAX_RUN_CHARS} characters"
"""What a ``run`` id must be (:func:`is_run`), for error messages."""
DROPPED_DETAIL = "dropped on arrival; no result follows"
"""The ``detail`` of a reply to a frame dropped at once (:func:`encode_ack`)."""
_MAX_JSON_DEPTH = 1024
"""orjson's nesting limit; its error says ``depth limit exceeded`` (:data:`_TOO_DEEP`)."""
_TOO_DEEP = "depth limit exceeded"


@dataclass(frozen=True, slots=True)
class Header:
    """A validated ingress header.

    Attributes:
        source, seq, encoding, ts, meta, run: as on the wire (``run`` None when absent).
        eos: True for an end-of-stream message.
        fields: the whole JSON object (decoders read ``shape``, ``dtype``, ``color``).
    """

    source: str
    seq: int
    encoding: str
    ts: float | None
    meta: dict[str, Any] | None
    run: str | None
    eos: bool
    fields: dict[str, Any]


def _bad(detail: str) -> FrameError:
    return FrameError(Reason.BAD_HEADER, detail)


def load_json(raw: bytes, what: str) -> Any:
    """Parse strict JSON from a peer (RFC 8259 through orjson: UTF-8 only, no NaN or
    Infinity, no number beyond a double, at most :data:`_MAX_JSON_DEPTH` levels deep; an
    integer beyond 64 bits becomes a float).

    Raises:
        FrameError: ``bad_header`` naming ``what``, for bytes that are not such JSON.
    """
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        if exc.msg == _TOO_DEEP:
            raise _bad(f"{what} is nested deeper than {_MAX_JSON_DEPTH} levels") from None
        raise _bad(f"{what} is not JSON: {exc}") from None


def dump_json(obj: Any) -> bytes:
    """Compact UTF-8 JSON of ``obj`` (orjson; numpy arrays and scalars included).

    Raises:
        TypeError: ``obj`` holds something JSON cannot express.
    """
    return orjson.dumps(obj, option=orjson.OPT_SERIALIZE_NUMPY)


def parse_header(raw: bytes | memoryview) -> Header:
    """Parse and validate the JSON header part of an ingress message.

    Args:
        raw: the header part; its length is checked before it is copied or parsed.

    Raises:
        FrameError: reason ``bad_header`` with a detail naming the field at fault.
    """
    if len(raw) > MAX_HEADER_BYTES:
        raise _bad(f"header is {len(raw)} bytes, more than {MAX_HEADER_BYTES}")
    obj = load_json(bytes(raw), "header")
    if not isinstance(obj, dict):
        raise _bad("header is not a JSON object")
    if type(obj.get("v")) is not int or obj.get("v") != PROTOCOL_VERSION:
        raise _bad(f"unsupported protocol version {obj.get('v')!r}, expected 1")
    source, seq = obj.get("source"), obj.get("seq")
    if not isinstance(source, str) or not source:
        raise _bad("`source` must be a non-empty string")
    if not isinstance(seq, int) or isinstance(seq, bool) or not 0 <= seq <= MAX_SEQ:
        raise _bad(f"`seq` must be an integer in 0..{MAX_SEQ}")
    eos = obj.get("eos", False)
    if not isinstance(eos, bool):
        raise _bad("`eos` must be true or false")
    encoding = obj.get("encoding", "")
    if not eos and encoding not in ENCODINGS:
        raise _bad(f"`encoding` must be one of {list(ENCODINGS)}, got {encoding!r}")
    ts = obj.get("ts")
    if ts is not None and (isinstance(ts, bool) or not isinstance(ts, (int, float))):
        raise _bad("`ts` must be a number (Unix seconds)")
    meta = obj.get("meta")
    if meta is not None and not isinstance(meta, dict):
        raise _bad("`meta` must be a JSON object")
    if meta and nested_deeper_than(meta, MAX_META_DEPTH):
        raise _bad(f"`meta` is nested deeper than {MAX_META_DEPTH} levels")
    run = obj.get("run")
    if run is not None and not is_run(run):
        raise _bad(f"`run` must be {RUN_RULE}")
    stamp = None if ts is None else float(ts)
    return Header(source, seq, encoding, stamp, meta, run, eos, obj)


def is_run(value: Any) -> bool:
    """Whether ``value`` is a valid ``run`` id: :data:`RUN_RULE`."""
    return isinstance(value, str) and 0 < len(value) <= MAX_RUN_CHARS


def nested_deeper_than(value: Any, levels: int) -> bool:
    """Whether the JSON ``value`` nests objects and arrays more than ``levels`` deep (a
    scalar is 0 deep, ``{}`` and ``[1]`` are 1)."""
    stack = [(value, 1)] if isinstance(value, (dict, list)) else []
    while stack:
        item, depth = stack.pop()
        if depth > levels:
            return True
        children = item.values() if isinstance(item, dict) else item
        stack.extend((child, depth + 1) for child in children if isinstance(child, (dict, list)))
    return False


def source_of_unparsable(raw: bytes | memoryview) -> tuple[str, int, str | None]:
    """Best-effort (source, seq, run) of a header that failed validation, for its error
    result: ``""``, -1 and None for what is not known (all three for a header over
    :data:`MAX_HEADER_BYTES`)."""
    if len(raw) > MAX_HEADER_BYTES:
        return "", -1, None
    try:
        obj = load_json(bytes(raw), "header")
    except FrameError:
        return "", -1, None
    if not isinstance(obj, dict):
        return "", -1, None
    source, seq, run = obj.get("source"), obj.get("seq"), obj.get("run")
    return (
        source if isinstance(source, str) else "",
        seq if isinstance(seq, int) and not isinstance(seq, bool) else -1,
        run if is_run(run) else None,
    )


def read_message(
    parts: Sequence[memoryview], received_ns: int, received_at: float
) -> Frame | EndOfStream:
    """Turn one native ingress message into a frame or an end-of-stream marker.

    Args:
        parts: the message parts (a SUB's topic part already removed); the payload is kept
            as a view, not copied.
        received_ns: ``time.monotonic_ns()`` at receipt.
        received_at: wall-clock Unix time (s) at receipt.

    Returns:
        An :class:`EndOfStream` for a valid one-part end-of-stream message; otherwise a
        :class:`Frame`, already failed with ``bad_header`` when its header is invalid or the
        message does not have exactly the parts its header calls for.
    """
    raw = parts[0] if parts else b""
    try:
        header = parse_header(raw)
    except FrameError as error:
        return _failed(error, *source_of_unparsable(raw), received_ns, received_at)
    if len(parts) != (1 if header.eos else 2):
        layout = "end of stream is [header]" if header.eos else "a frame is [header, payload]"
        wrong = _bad(f"{layout}; got {len(parts)} parts")
        return _failed(wrong, header.source, header.seq, header.run, received_ns, received_at)
    if header.eos:
        return EndOfStream(header.source, header.seq, run=header.run)
    return Frame(
        header.source,
        header.seq,
        received_ns,
        received_at,
        ts=header.ts,
        meta=header.meta,
        run=header.run,
        encoding=header.encoding,
        header=header.fields,
        payload=parts[1],
    )


def _failed(
    error: FrameError,
    source: str,
    seq: int,
    run: str | None,
    received_ns: int,
    received_at: float,
) -> Frame:
    frame = Frame(source, seq, received_ns, received_at, run=run)
    frame.fail(error)
    return frame


def encode_ack(item: Frame | EndOfStream, dropped: str | None = None) -> bytes:
    """The reply of a REP or ROUTER ingress to one request, sent once the ingress has checked
    the message (header, image header, size limits) and queued it, before inference.

    JSON: ``{"ok": true, "source", "seq"}`` (with ``"eos": true`` for an end-of-stream
    message); ``{"ok": false, "source", "seq", "reason", "detail"}`` for a frame refused at
    once, ``reason`` being the one its error result carries; or ``{"ok": false, "source",
    "seq", "reason", "detail", "dropped": true}`` for a frame dropped at once (``dropped``:
    ``stale_seq``, ``shutdown``, ``queue_full``), which gets no result. A frame that fails
    later (a corrupt image, inference) was acknowledged ``ok`` and gets its error result on
    the egress.
    """
    body: dict[str, Any] = {"ok": True, "source": item.source, "seq": item.seq}
    if isinstance(item, EndOfStream):
        body["eos"] = True
    elif dropped is not None:
        body.update(ok=False, reason=dropped, detail=DROPPED_DETAIL, dropped=True)
    elif item.error is not None:
        body.update(ok=False, reason=item.error.reason, detail=item.error.detail)
    return dump_json(body)


def encode_frame(
    source: str,
    seq: int,
    payload: bytes | np.ndarray,
    *,
    encoding: str,
    ts: float | None = None,
    meta: dict[str, Any] | None = None,
    color: str = "bgr",
    run: str | None = None,
) -> list[bytes | memoryview]:
    """Build the ``[header, payload]`` parts of one frame message (producers use this).

    Args:
        payload: encoded image bytes (``jpeg``/``png``), or for ``raw`` a uint8 array of
            shape (h, w) or (h, w, c), sent in C order without a copy when contiguous.
        color: channel order of a ``raw`` array.
        run: the producer's run id (1 to :data:`MAX_RUN_CHARS` characters), or None.
    """
    header: dict[str, Any] = {"v": PROTOCOL_VERSION, "source": source, "seq": seq}
    header["encoding"] = encoding
    if ts is not None:
        header["ts"] = ts
    if meta is not None:
        header["meta"] = meta
    if run is not None:
        header["run"] = run
    if isinstance(payload, np.ndarray):
        array = np.ascontiguousarray(payload)
        header.update(shape=list(array.shape), dtype=str(array.dtype), color=color)
        body: bytes | memoryview = array.data.cast("B")
    else:
        body = payload
    return [dump_json(header), body]


def encode_eos(source: str, seq: int, run: str | None = None) -> list[bytes]:
    """Build an end-of-stream message for ``source`` whose last frame was ``seq`` (of the
    producer's ``run``, when it has one)."""
    header: dict[str, Any] = {"v": PROTOCOL_VERSION, "source": source, "seq": seq, "eos": True}
    if run is not None:
        header["run"] = run
    return [dump_json(header)]


def _ms(delta_ns: int) -> float:
    return round(delta_ns / 1e6, 3)


def encode_result(frame: Frame, done_at_ns: int) -> list[bytes]:
    """Build the ``[topic, json]`` result message of a finished or failed frame.

    JSON fields: ``v``, ``source``, ``seq``, ``run`` (null when the header had none), ``ts``,
    ``received_at`` and ``done_at`` (Unix s),
    ``latency_ms`` {``queue``: receive → inference start, ``infer``: the batch's execution,
    ``total``: receive → result}, ``model``, ``width`` and ``height`` of the decoded image
    (pixels), the model's results (e.g. ``detections``), ``meta`` and ``error`` (null or
    ``{reason, detail}``).
    """
    infer_ns = frame.infer_end_ns - frame.infer_start_ns if frame.infer_start_ns else 0
    queue_ns = frame.infer_start_ns - frame.received_at_ns if frame.infer_start_ns else 0
    total_ns = done_at_ns - frame.received_at_ns
    body: dict[str, Any] = {
        "v": PROTOCOL_VERSION,
        "source": frame.source,
        "seq": frame.seq,
        "run": frame.run,
        "ts": frame.ts,
        "received_at": frame.received_at,
        "done_at": frame.received_at + total_ns / 1e9,
        "latency_ms": {"queue": _ms(queue_ns), "infer": _ms(infer_ns), "total": _ms(total_ns)},
        "model": frame.model,
        "width": frame.width,
        "height": frame.height,
        **frame.results,
        "meta": frame.meta,
        "error": None,
    }
    if frame.error is not None:
        body["error"] = {"reason": frame.error.reason, "detail": frame.error.detail}
    return [frame.source.encode(), dump_json(body)]


def encode_eos_result(eos: EndOfStream) -> list[bytes]:
    """Build the ``eos`` result published after the last frame of a source."""
    body = {"v": PROTOCOL_VERSION, "source": eos.source, "seq": eos.seq, "run": eos.run}
    body.update(eos=True, done_at=time.time())
    return [eos.source.encode(), dump_json(body)]

"""imagezmq senders, accepted unchanged on an ingress with ``protocol = "imagezmq"``.

imagezmq (jeffbass/imagezmq 1.2.0, ``imagezmq/imagezmq.py``) sends two-part messages, with
no topic part even on PUB:

- ``send_image(msg, image)``: ``[json {"msg", "dtype", "shape"}, C-order array bytes]``;
- ``send_jpg(msg, jpg_buffer)``: ``[json {"msg"}, JPEG bytes]``.

The two are told apart by the ``dtype`` key, as imagezmq's own receiver does. An array
becomes a ``raw`` frame: ``dtype`` ``uint8`` or ``uint16`` (the decoding rules of
:mod:`streamer.vision.decode`), channels taken as OpenCV's: 2-D or one channel gray, three
BGR, four BGRA. The ``msg`` text (a non-empty string) is the source id, unless the ingress
fixes one with ``source``; the ``msg`` is then echoed in the result's ``meta`` as
``{"msg": ...}``. imagezmq has no sequence numbers, so the ingress numbers each source's
messages from 0 in arrival order (:class:`ImagezmqReader`).

In REQ/REP mode the sender blocks until the hub replies; imagezmq's hub replies ``b"OK"``.
:func:`encode_reply` gives ``b"OK"``, or ``b"ERROR <reason>: <detail>"`` for a frame refused
at once.
"""

from __future__ import annotations

import collections
from collections.abc import Sequence
from typing import Any

from streamer.errors import FrameError, Reason
from streamer.frames import EndOfStream, Frame
from streamer.transport.protocol import (
    DROPPED_DETAIL,
    MAX_HEADER_BYTES,
    MAX_META_DEPTH,
    load_json,
    nested_deeper_than,
)

__all__ = ["MAX_TRACKED_SOURCES", "ImagezmqReader", "encode_reply"]

MAX_TRACKED_SOURCES = 4096
"""Sources whose next seq a reader remembers; the least recently seen one beyond this is
forgotten and restarts at seq 0 (the pipeline then counts a restart). This bounds the
reader's own memory for a sender that varies ``msg``; the pipeline's per-source state is
bounded by ``daemon.max_sources`` and ``daemon.source_idle_s`` (README, "Memory")."""

_COLORS = {1: "gray", 3: "bgr", 4: "bgr"}


class ImagezmqReader:
    """Turns imagezmq messages into frames; one per ingress, used by its thread only.

    Args:
        source: the source id of every frame; None to use each message's ``msg``.
    """

    def __init__(self, source: str | None) -> None:
        self._source = source
        self._next_seq: collections.OrderedDict[str, int] = collections.OrderedDict()

    def read(self, parts: Sequence[memoryview], received_ns: int, received_at: float) -> Frame:
        """Turn one message into a frame (failed with ``bad_header`` when malformed).

        Args:
            parts: the message parts; the payload is kept as a view, not copied.
            received_ns: ``time.monotonic_ns()`` at receipt.
            received_at: wall-clock Unix time (s) at receipt.

        Returns:
            A frame with the next seq of its source; one whose source cannot be told (no
            valid ``msg`` and no fixed ``source``) has source ``""`` and seq -1. With a fixed
            ``source``, a message whose metadata is unusable is a failed frame of that source.
        """
        try:
            fields = _metadata(parts)
            source = self._source_of(fields)
        except FrameError as error:
            return self._unreadable(error, received_ns, received_at)
        frame = Frame(source, self._take_seq(source), received_ns, received_at)
        if self._source is not None:
            frame.meta = {"msg": fields.get("msg")}
        if len(parts) != 2:
            frame.fail(FrameError(Reason.BAD_HEADER, f"imagezmq sends 2 parts, got {len(parts)}"))
            return frame
        frame.encoding = "raw" if "dtype" in fields else "jpeg"
        frame.header = {**fields, "color": _color(fields.get("shape"))}
        frame.payload = parts[1]
        return frame

    def _unreadable(self, error: FrameError, received_ns: int, received_at: float) -> Frame:
        """The failed frame of a message without usable metadata: named by the fixed
        ``source`` and its next seq, or ``""`` and -1 when the source comes from ``msg``."""
        if self._source is None:
            frame = Frame("", -1, received_ns, received_at)
        else:
            frame = Frame(self._source, self._take_seq(self._source), received_ns, received_at)
        frame.fail(error)
        return frame

    def _source_of(self, fields: dict[str, Any]) -> str:
        if self._source is not None:
            return self._source
        msg = fields.get("msg")
        if not isinstance(msg, str) or not msg:
            raise FrameError(Reason.BAD_HEADER, "imagezmq `msg` must be a non-empty string")
        return msg

    def _take_seq(self, source: str) -> int:
        seq = self._next_seq.pop(source, 0)
        self._next_seq[source] = seq + 1
        if len(self._next_seq) > MAX_TRACKED_SOURCES:
            self._next_seq.popitem(last=False)
        return seq


def _metadata(parts: Sequence[memoryview]) -> dict[str, Any]:
    """The first part's JSON object.

    Raises:
        FrameError: ``bad_header`` when missing, too long, not JSON or not an object.
    """
    if not parts or parts[0].nbytes > MAX_HEADER_BYTES:
        raise FrameError(Reason.BAD_HEADER, f"no imagezmq metadata of at most {MAX_HEADER_BYTES} B")
    fields = load_json(bytes(parts[0]), "imagezmq metadata")
    if not isinstance(fields, dict):
        raise FrameError(Reason.BAD_HEADER, "imagezmq metadata is not a JSON object")
    if nested_deeper_than(fields, MAX_META_DEPTH):  # its msg is echoed as meta.msg
        detail = f"imagezmq metadata is nested deeper than {MAX_META_DEPTH} levels"
        raise FrameError(Reason.BAD_HEADER, detail)
    return fields


def _color(shape: object) -> str | None:
    """OpenCV's channel order for an array of ``shape``; None when the shape is invalid (the
    decoder then refuses the shape)."""
    channels = shape[2] if isinstance(shape, list) and len(shape) == 3 else 1
    return _COLORS.get(channels) if type(channels) is int else None


def encode_reply(item: Frame | EndOfStream, dropped: str | None = None) -> bytes:
    """The REP/ROUTER reply to one imagezmq message: ``b"OK"`` as imagezmq's hub sends, or
    ``b"ERROR <reason>: <detail>"`` when the frame was refused or dropped at once (see
    :func:`streamer.transport.protocol.encode_ack` for what "at once" covers)."""
    if dropped is not None:
        return f"ERROR {dropped}: {DROPPED_DETAIL}".encode()
    if isinstance(item, EndOfStream) or item.error is None:
        return b"OK"
    return f"ERROR {item.error.reason}: {item.error.detail}".encode()

"""Subscriber library: results from a daemon's PUB egress, a summary, and annotated video.

Result messages are ``[topic = source, json]`` (DESIGN.md §5, built by
:func:`streamer.transport.protocol.encode_result`); the ``eos`` result of a source follows
its last frame's result. PUB/SUB drops whatever is published before the subscription reaches
the daemon, so start a subscriber, and wait for its connection, before its producers::

    from streamer.clients import Summary, Subscriber
    summary = Summary()
    with Subscriber(sources=["carphone"]) as subscriber:
        subscriber.wait_connected(10.0)
        # ... start the producer here
        for result in subscriber.results(expect_eos=["carphone"]):
            summary.add(result)
    print(summary.as_dict())
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import cv2
import numpy as np
import zmq

from streamer.clients.connection import connect
from streamer.errors import ClientError
from streamer.lifecycle import Closing
from streamer.transport.monitor import stop_monitor, unbounded_monitor
from streamer.transport.security import CurveClient

__all__ = [
    "DEFAULT_SUBSCRIBER_ENDPOINT",
    "Annotator",
    "Subscriber",
    "draw_result",
    "result_line",
]

DEFAULT_SUBSCRIBER_ENDPOINT = "tcp://127.0.0.1:5556"

_GREEN = (0, 255, 0)
_RED = (0, 0, 255)
_FONT = cv2.FONT_HERSHEY_SIMPLEX


class Subscriber(Closing):
    """A SUB socket connected to a daemon's PUB egress that yields result dicts.

    Only results whose topic is exactly one of ``sources`` are returned (ZMQ subscriptions
    match prefixes, so ``cam1`` would also get ``cam10``). Those other sources' messages, and
    messages that are not a ``[topic, JSON object with that source]`` pair, are skipped and
    counted in :attr:`skipped`.

    Not thread-safe: create and use it from one thread (it owns a ZMQ socket).

    Args:
        endpoint: the endpoint the daemon's PUB egress binds, e.g. ``tcp://host:5556``.
        sources: source ids to subscribe to; empty for all.
        rcvhwm: results queued before ZMQ drops new ones.
        context: the ZMQ context; default ``zmq.Context.instance()``.
        curve: the keys of a CURVE client (:meth:`CurveClient.from_files`) for an egress
            that requires CURVE; None for a plain one.

    Raises:
        TypeError: ``sources`` is a single string (it would subscribe to its characters).
        ClientError: the endpoint is invalid.
    """

    def __init__(
        self,
        endpoint: str = DEFAULT_SUBSCRIBER_ENDPOINT,
        *,
        sources: Iterable[str] = (),
        rcvhwm: int = 10_000,
        context: zmq.Context[Any] | None = None,
        curve: CurveClient | None = None,
    ) -> None:
        if isinstance(sources, (str, bytes)):
            raise TypeError(f"sources must be a collection of source ids, got {sources!r}")
        self.endpoint = endpoint
        self.sources = frozenset(sources)
        self.skipped = 0
        self._connected = False
        self._socket = (context or zmq.Context.instance()).socket(zmq.SUB)
        self._socket.setsockopt(zmq.LINGER, 0)
        self._socket.setsockopt(zmq.RCVHWM, rcvhwm)
        for topic in sorted(self.sources) or [""]:
            self._socket.setsockopt(zmq.SUBSCRIBE, topic.encode())
        self._handshakes: zmq.Socket[Any] | None = unbounded_monitor(
            self._socket, zmq.EVENT_HANDSHAKE_SUCCEEDED
        )
        try:
            connect(self._socket, endpoint, curve)
        except ClientError:
            self.close()
            raise

    def wait_connected(self, timeout_s: float | None = None) -> bool:
        """Wait until the connection to the daemon is made (its handshake succeeded).

        The subscriptions leave right after, ahead of anything else on the connection, so
        the results of frames a producer sends from then on are delivered (a frame takes
        milliseconds through the daemon; the subscriptions microseconds on a local network).

        Args:
            timeout_s: longest wait (s); None: no limit.

        Returns:
            Whether it is connected; True at once when it already was.
        """
        if self._connected:
            return True
        assert self._handshakes is not None
        wait_ms = None if timeout_s is None else math.ceil(timeout_s * 1000)
        self._connected = bool(self._handshakes.poll(wait_ms))
        if self._connected:
            self._stop_watching_handshakes()  # the rest would only pile up, one a reconnection
        return self._connected

    def receive(self, timeout_s: float | None = None) -> dict[str, Any] | None:
        """The next result, or None when none arrives within ``timeout_s`` (None: no limit)."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while True:
            wait_ms = None if deadline is None else _remaining_ms(deadline)
            if not self._socket.poll(wait_ms):
                return None
            result = self._parse(self._socket.recv_multipart())
            if result is not None:
                return result
            self.skipped += 1

    def results(
        self,
        *,
        expect_eos: Iterable[str] = (),
        count: int | None = None,
        idle_timeout_s: float | None = 10.0,
    ) -> Iterator[dict[str, Any]]:
        """Yield results, ``eos`` results included, until a stop condition.

        Args:
            expect_eos: stop once an ``eos`` result has arrived for each of these sources;
                empty: ``eos`` results do not stop the iteration.
            count: stop after this many results (``eos`` results not counted); None: no
                limit.
            idle_timeout_s: stop after this long with nothing received (s); None: no limit.
        """
        pending = set(expect_eos)
        stop_on_eos = bool(pending)
        received = 0
        while count is None or received < count:
            result = self.receive(idle_timeout_s)
            if result is None:
                return
            yield result
            if result.get("eos") is True:
                pending.discard(result["source"])
                if stop_on_eos and not pending:
                    return
            else:
                received += 1

    def close(self) -> None:
        """Close the socket; idempotent."""
        self._stop_watching_handshakes()
        self._socket.close()

    def _stop_watching_handshakes(self) -> None:
        """Stop the monitor of handshakes and close its socket; idempotent."""
        stop_monitor(self._socket, self._handshakes)
        self._handshakes = None

    def _parse(self, parts: list[bytes]) -> dict[str, Any] | None:
        if len(parts) != 2:
            return None
        topic = parts[0].decode(errors="replace")
        if self.sources and topic not in self.sources:
            return None
        try:
            result = json.loads(parts[1])
        except ValueError:
            return None
        if not isinstance(result, dict) or result.get("source") != topic:
            return None
        return result


def _remaining_ms(deadline: float) -> int:
    return max(0, math.ceil((deadline - time.monotonic()) * 1000))


_ENVELOPE = frozenset(
    {
        "v",
        "source",
        "seq",
        "run",
        "ts",
        "received_at",
        "done_at",
        "latency_ms",
        "model",
        "width",
        "height",
        "meta",
        "error",
        "eos",
    }
)
"""Result keys every model's results have; the others are the model's own."""


def result_line(result: dict[str, Any]) -> str:
    """One compact line: source, seq, the outcome and total latency (ms).

    The outcome is the error reason, the faces detected, or for another model's results
    (a classifier's ``face``) their keys and values. E.g. ``carphone seq=12 faces=1
    latency=8.3ms``, ``lfw seq=3 face={'score': 0.99, 'is_face': True} latency=2.1ms``,
    ``carphone seq=13 error=decode_failed latency=0.4ms`` or ``carphone seq=119 eos``.
    """
    head = f"{result.get('source')} seq={result.get('seq')}"
    if result.get("eos") is True:
        return f"{head} eos"
    error = result.get("error")
    if error:
        outcome = f"error={error.get('reason')}"
    elif "detections" in result or not (others := set(result) - _ENVELOPE):
        outcome = f"faces={len(result.get('detections') or [])}"
    else:
        outcome = " ".join(f"{key}={result[key]}" for key in sorted(others))
    latency = (result.get("latency_ms") or {}).get("total")
    return f"{head} {outcome} latency={latency}ms"


def draw_result(image: np.ndarray, result: dict[str, Any]) -> None:
    """Draw a result onto its frame, in place.

    Each detection's ``box`` ``[x, y, w, h]`` (pixels of the decoded image) becomes a green
    rectangle labelled with its ``score``, and each of its ``keypoints`` ``[x, y]`` (pixels)
    a red dot; an error result writes its reason in the top-left corner.

    Args:
        image: the frame the result is for, BGR uint8 of shape (height, width, 3).
        result: a result dict.
    """
    thickness = max(1, image.shape[0] // 360)
    if result.get("error"):
        reason = str(result["error"].get("reason", "error"))
        cv2.putText(image, reason, (4, 16), _FONT, 0.5, _RED, thickness)
        return
    for detection in result.get("detections") or []:
        _draw_detection(image, detection, thickness)


def _draw_detection(image: np.ndarray, detection: dict[str, Any], thickness: int) -> None:
    x, y, w, h = (round(v) for v in detection["box"])
    cv2.rectangle(image, (x, y), (x + w, y + h), _GREEN, thickness)
    label = f"{detection.get('score', 0.0):.2f}"
    cv2.putText(image, label, (x, max(y - 4, 12)), _FONT, 0.4 * thickness, _GREEN, thickness)
    for px, py in detection.get("keypoints") or []:
        cv2.circle(image, (round(px), round(py)), thickness + 1, _RED, -1)


class Annotator(Closing):
    """Draws results onto the video a producer sent and writes an annotated copy.

    Frame *i* of ``video`` is the frame sent with seq *i* (one pass from the start, as
    ``produce(video)`` sends it). Results may arrive in any order: each is buffered until
    every earlier frame is written. Not thread-safe.

    Args:
        video: the video file the producer read.
        out: the annotated video to write (mp4v fourcc, the input's fps and size).
        source: the source whose results to draw; default the video's file stem (the
            producer's default source id).

    Raises:
        ClientError: ``video`` cannot be read or ``out`` cannot be written.
    """

    def __init__(self, video: str | Path, out: str | Path, *, source: str | None = None) -> None:
        self.source = source or Path(video).stem
        self.frames_written = 0
        self._pending: dict[int, dict[str, Any]] = {}
        self._capture = cv2.VideoCapture(str(video))
        if not self._capture.isOpened():
            raise ClientError(f"cannot open video {video}")
        self._writer = _open_writer(self._capture, Path(out))

    def add(self, result: dict[str, Any]) -> None:
        """Take one result; results of other sources, ``eos`` and repeated seqs are ignored."""
        seq = result.get("seq")
        if result.get("source") != self.source or result.get("eos") is True:
            return
        if isinstance(seq, int) and seq >= self.frames_written:
            self._pending[seq] = result
        while self.frames_written in self._pending:
            if not self._write_next(self._pending.pop(self.frames_written)):
                return

    def close(self) -> int:
        """Write the frames up to the highest seq with a result, then close both files.

        Frames whose result never came are written without annotation. Idempotent.

        Returns:
            The number of frames written.
        """
        last = max(self._pending, default=-1)
        while self.frames_written <= last:
            if not self._write_next(self._pending.pop(self.frames_written, None)):
                break
        self._pending.clear()
        self._writer.release()
        self._capture.release()
        return self.frames_written

    def _write_next(self, result: dict[str, Any] | None) -> bool:
        ok, frame = self._capture.read()
        if not ok:
            return False
        if result is not None:
            draw_result(frame, result)
        self._writer.write(frame)
        self.frames_written += 1
        return True


def _open_writer(capture: cv2.VideoCapture, out: Path) -> cv2.VideoWriter:
    fps = capture.get(cv2.CAP_PROP_FPS) or 25.0
    size = (int(capture.get(cv2.CAP_PROP_FRAME_WIDTH)), int(capture.get(cv2.CAP_PROP_FRAME_HEIGHT)))
    writer = cv2.VideoWriter(str(out), cv2.VideoWriter.fourcc(*"mp4v"), fps, size)
    if not writer.isOpened():
        capture.release()
        raise ClientError(f"cannot write video {out}")
    return writer

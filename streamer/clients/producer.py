"""Producer library: frames from a video, an image folder, an image or a camera → ZMQ PUSH.

Every frame is one native-protocol message (DESIGN.md §5, built by
:func:`streamer.transport.protocol.encode_frame`) with ``seq`` counting from 0 in a ``run`` of
the producer's own, and an end-of-stream message follows the last frame::

    from streamer.clients import produce
    stats = produce("carphone.mp4", "tcp://127.0.0.1:5555", fps=30)

Closing waits, at most ``close_timeout_s``, for every queued message to leave
(:class:`~streamer.clients.outbox.Outbox`), then terminates the producer's own ZMQ context,
so no libzmq thread reads a frame's buffer once :meth:`Producer.close` returned.
"""

from __future__ import annotations

import itertools
import math
import os
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import Any

import cv2
import numpy as np
import zmq
from zmq.utils.monitor import recv_monitor_message

from streamer.clients.connection import connect
from streamer.clients.frame_limits import DEFAULT_FRAME_LIMITS, FrameLimits
from streamer.clients.media import MediaInput, open_input
from streamer.clients.outbox import Outbox
from streamer.clients.pacer import Pacer
from streamer.errors import ClientError, FrameError, SendTimeoutError
from streamer.lifecycle import Closing
from streamer.transport.monitor import stop_monitor, unbounded_monitor
from streamer.transport.protocol import (
    ENCODINGS,
    RUN_RULE,
    encode_eos,
    encode_frame,
    is_run,
    parse_header,
)
from streamer.transport.security import CurveClient

__all__ = [
    "DEFAULT_CLOSE_TIMEOUT_S",
    "DEFAULT_PRODUCER_ENDPOINT",
    "ClientError",
    "Producer",
    "ProducerStats",
    "SendTimeoutError",
    "produce",
]

DEFAULT_PRODUCER_ENDPOINT = "tcp://127.0.0.1:5555"
DEFAULT_CLOSE_TIMEOUT_S = 10.0
"""Longest wait at close for the queued frames and the end-of-stream to leave (s)."""


@dataclass(frozen=True)
class ProducerStats:
    """What a producer sent.

    Attributes:
        frames: frame messages sent (end-of-stream not counted).
        bytes_sent: bytes of every message handed to ZMQ, headers included.
        seconds: from the first send to the end of the last one, end-of-stream included (s).
        frames_span_s: from the start of the first frame's send to the start of the last
            one's (s): ``frames - 1`` frame intervals.
    """

    frames: int
    bytes_sent: int
    seconds: float
    frames_span_s: float = 0.0

    @property
    def fps(self) -> float:
        """The average frame rate: frame intervals per second between the first and the
        last frame's send, ``(frames - 1) / frames_span_s``; 0.0 before two frames."""
        return (self.frames - 1) / self.frames_span_s if self.frames_span_s > 0 else 0.0


class Producer(Closing):
    """Sends the frames of one source on a PUSH socket connected to a daemon's ingress.

    The socket sets ``IMMEDIATE`` (frames queue only on a completed connection), ``SNDHWM``
    and ``SNDTIMEO``, so a send that no daemon takes fails after ``send_timeout_s`` instead
    of hanging, saying whether a daemon is connected (:class:`SendTimeoutError`).
    :meth:`close` waits at most ``close_timeout_s`` for the queued messages to leave and
    reports how many it gave up on (:attr:`undelivered`).

    Not thread-safe: create and use it from one thread (it owns a ZMQ socket).

    Args:
        endpoint: a ZMQ endpoint the daemon's PULL ingress binds, e.g. ``tcp://host:5555``.
        source: the ``source`` id in every header.
        encoding: ``jpeg``, ``png`` or ``raw`` (the BGR array, sent without a copy).
        quality: JPEG quality, 0-100.
        send_timeout_s: longest wait for the daemon to take one message (s).
        close_timeout_s: longest wait at :meth:`close` for queued messages to leave (s).
        sndhwm: messages queued before a send blocks.
        run: the ``run`` id in every header (1 to 64 characters): the daemon checks ``seq``
            per run, so the frames a crashed producer left queued are not taken as stale
            among those of the producer that replaced it; default: a new random id
            (:attr:`run`).
        context: the ZMQ context; default: one of the producer's own, terminated by
            :meth:`close`. A caller's context stays open: terminate it before the
            interpreter exits (libzmq's threads may still be sending a closed socket's
            last bytes until then).
        curve: the keys of a CURVE client (:meth:`CurveClient.from_files`) for an ingress
            that requires CURVE; None for a plain one.
        limits: the daemon ingress's size limits, a frame over them is refused before it
            is sent; default: the daemon's defaults, for an ingress that does not raise
            them (:data:`~streamer.clients.frame_limits.DEFAULT_FRAME_LIMITS`).

    ``with Producer(...) as producer:`` closes it on the way out, or aborts it
    (:meth:`abort`) when a KeyboardInterrupt is on its way out.

    Raises:
        ValueError: an unknown encoding, a quality outside 0-100, a send or close timeout
            not finite and > 0, ``sndhwm`` < 1, or a ``source`` or ``run`` the daemon would
            refuse (the message is the daemon's); before any socket is made.
        ClientError: the endpoint is invalid.
    """

    def __init__(
        self,
        endpoint: str = DEFAULT_PRODUCER_ENDPOINT,
        *,
        source: str,
        encoding: str = "jpeg",
        quality: int = 90,
        send_timeout_s: float = 5.0,
        close_timeout_s: float = DEFAULT_CLOSE_TIMEOUT_S,
        sndhwm: int = 32,
        run: str | None = None,
        context: zmq.Context[Any] | None = None,
        curve: CurveClient | None = None,
        limits: FrameLimits = DEFAULT_FRAME_LIMITS,
    ) -> None:
        if encoding not in ENCODINGS:
            raise ValueError(f"encoding must be one of {list(ENCODINGS)}, got {encoding!r}")
        if not 0 <= quality <= 100:
            raise ValueError(f"quality must be in 0-100, got {quality}")
        if not all(math.isfinite(t) and t > 0 for t in (send_timeout_s, close_timeout_s)):
            raise ValueError(
                f"send_timeout_s and close_timeout_s must be finite and > 0, got "
                f"{send_timeout_s}, {close_timeout_s}"
            )
        if sndhwm < 1:
            raise ValueError(f"sndhwm must be >= 1, got {sndhwm}")
        if run is not None and not is_run(run):
            raise ValueError(f"run must be {RUN_RULE}, got {run!r}")
        self.endpoint, self.source, self.encoding = endpoint, source, encoding
        self.run = uuid.uuid4().hex if run is None else run
        try:
            parse_header(encode_eos(source, 0, self.run)[0])
        except (FrameError, TypeError) as exc:
            raise ValueError(f"source {source!r:.80}: {_why(exc)}") from None
        self.send_timeout_s, self.close_timeout_s = send_timeout_s, close_timeout_s
        self._quality, self._limits = quality, limits
        self._seq = self._bytes = 0
        self._first_ns = self._last_ns = 0
        self._first_frame_ns = self._last_frame_ns = 0
        self._outbox = Outbox()
        self._closed, self._undelivered = False, 0
        self._own_context = context is None
        self._context: zmq.Context[Any] = zmq.Context() if context is None else context
        try:
            self._socket, handshakes = _push_socket(self._context, endpoint, sndhwm, curve)
        except ClientError:
            self._end_context()
            raise
        self._handshakes: zmq.Socket[Any] | None = handshakes
        self._refused_for_good: str | None = None  # a handshake failure libzmq won't retry
        self._socket.setsockopt(zmq.SNDTIMEO, _slice_ms(send_timeout_s))

    @property
    def stats(self) -> ProducerStats:
        """Frames, bytes and seconds sent so far."""
        seconds = (self._last_ns - self._first_ns) / 1e9
        span_s = (self._last_frame_ns - self._first_frame_ns) / 1e9
        return ProducerStats(self._seq, self._bytes, seconds, span_s)

    @property
    def undelivered(self) -> int:
        """Messages (frames or end-of-stream) :meth:`close` gave up on; 0 before it ran."""
        return self._undelivered

    def send(
        self, image: np.ndarray, *, ts: float | None = None, meta: dict[str, Any] | None = None
    ) -> int:
        """Encode ``image`` and send it as the next frame of the source.

        Args:
            image: BGR uint8 of shape (height, width, 3); with ``raw`` encoding a
                C-contiguous array is sent without a copy, so do not modify it until
                :meth:`close` returned.
            ts: capture time (Unix s); default now.
            meta: a JSON object the daemon echoes back in the result.

        Returns:
            The message size in bytes, header included.

        Raises:
            SendTimeoutError: no daemon took the message within ``send_timeout_s``.
            ClientError: the image is empty or cannot be encoded, the frame is one the daemon
                would refuse (a ``ts`` that is no number, a ``meta`` that is no JSON object,
                a ``raw`` array of a dtype or shape it does not take, an image or message
                over ``limits``; the message is the daemon's), or the producer is closed.
                Nothing is sent then.
        """
        self._check_open()
        payload = _encode(image, self.encoding, self._quality)
        stamp = time.time() if ts is None else ts
        parts = self._frame_parts(payload, stamp, meta)
        started_ns = time.monotonic_ns()
        self._send(parts)
        self._first_frame_ns = self._first_frame_ns or started_ns
        self._last_frame_ns = started_ns
        size = sum(len(part) for part in parts)
        self._seq += 1
        self._bytes += size
        return size

    def _frame_parts(
        self, payload: bytes | np.ndarray, ts: float, meta: dict[str, Any] | None
    ) -> list[bytes | memoryview]:
        """The parts of the next frame, checked by the daemon's own rules: its header
        (:func:`~streamer.transport.protocol.parse_header`), then its size and a ``raw``
        array's fields (:meth:`FrameLimits.check`).

        Raises:
            ClientError: the daemon would refuse the frame.
        """
        try:
            parts = encode_frame(
                self.source,
                self._seq,
                payload,
                encoding=self.encoding,
                ts=ts,
                meta=meta,
                run=self.run,
            )
            header = parse_header(parts[0])
            self._limits.check(self.encoding, parts, header.fields)
        except (FrameError, TypeError) as exc:
            raise ClientError(f"the daemon would refuse frame {self._seq}: {_why(exc)}") from None
        return parts

    def send_eos(self, *, wait: bool = True) -> bool:
        """Send end-of-stream after the last frame sent (seq 0 when none was).

        Args:
            wait: wait up to ``send_timeout_s`` for the daemon to take it; False: only if it
                takes it at once (after an interrupt, which should not wait).

        Returns:
            Whether it was sent (always True when ``wait``).

        Raises:
            SendTimeoutError: ``wait``, and no daemon took it within ``send_timeout_s``.
            ClientError: the producer is closed.
        """
        self._check_open()
        parts = encode_eos(self.source, max(self._seq - 1, 0), self.run)
        if wait:
            self._send(parts)
            return True
        try:
            self._outbox.send(self._socket, parts, zmq.NOBLOCK)
        except zmq.Again:
            return False
        return True

    def close(self) -> int:
        """Wait at most ``close_timeout_s`` for every queued message to leave, then close the
        socket (and terminate the producer's own context); idempotent.

        The socket closes with the time left as its ``LINGER``, so the last bytes still get
        written out; when the wait ran out, it closes with no ``LINGER`` and the messages
        left are discarded and counted. An own context's termination that lasts until the
        deadline means the last bytes did not leave either: one more message is counted.

        Returns:
            :attr:`undelivered`: the messages given up on (0 when every one left).
        """
        if self._closed:
            return self._undelivered
        self._closed = True
        deadline_s = time.monotonic() + self.close_timeout_s
        self._undelivered = len(self._outbox)  # if the wait is interrupted (Ctrl-C)
        try:
            self._undelivered = self._outbox.wait(deadline_s)
        finally:
            left_s = 0.0 if self._undelivered else deadline_s - time.monotonic()
            self._stop_watching_handshakes()
            self._socket.close(linger=max(0, math.ceil(left_s * 1000)))
            self._end_context()
        if not self._undelivered and self._own_context and time.monotonic() >= deadline_s:
            self._undelivered = 1
        return self._undelivered

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if isinstance(exc, KeyboardInterrupt):
            self.abort()
        else:
            self.close()

    def abort(self) -> int:
        """Close at once, discarding the queued messages (after an interrupt); idempotent.

        Returns:
            :attr:`undelivered`, as for :meth:`close`.
        """
        self.close_timeout_s = 0.0
        return self.close()

    def _end_context(self) -> None:
        """Terminate the producer's own context: returns once libzmq's threads have ended."""
        if self._own_context:
            self._context.term()

    def _check_open(self) -> None:
        if self._closed:
            raise ClientError(f"the producer of {self.source!r} is closed")

    def _send(self, parts: Sequence[bytes | memoryview]) -> None:
        """Send, waiting up to ``send_timeout_s`` in slices of ``SNDTIMEO``: libzmq resumes
        a blocked send after a signal, so a Ctrl-C is seen between two slices only.

        Raises:
            SendTimeoutError: no daemon took the message within ``send_timeout_s``.
        """
        if not self._first_ns:
            self._first_ns = time.monotonic_ns()
        deadline = time.monotonic() + self.send_timeout_s
        while True:
            try:
                self._outbox.send(self._socket, parts)
                break
            except zmq.Again:
                if time.monotonic() >= deadline:
                    raise self._send_timeout() from None
        self._last_ns = time.monotonic_ns()
        self._stop_watching_handshakes()  # one was completed: only a first one's failure is told

    def _send_timeout(self) -> SendTimeoutError:
        """Why a send found no room for ``send_timeout_s``. With ``IMMEDIATE`` there is room
        on a completed connection whose queue is not full, so either none is complete, and
        libzmq holds none of the messages sent (a lost connection drops its queue), or the
        daemon does not read, and the connection's queue holds ``SNDHWM`` of them."""
        waited = f"no message was taken for {self.send_timeout_s} s"
        if len(self._outbox):
            return SendTimeoutError(
                f"the daemon at {self.endpoint} is connected but {waited}: it is pushing back "
                "(it processes frames slower than they are sent, or has stalled)",
                connected=True,
            )
        if self._last_ns:
            return SendTimeoutError(
                f"the connection to the daemon at {self.endpoint} was lost, with the frames "
                f"queued for it (is `streamer run` still running there?), and {waited}",
                connected=False,
            )
        if refused := self._handshake_failure():
            final = (
                "; such a refusal is not retried: start a new producer once its CURVE "
                "settings match the daemon's"
                if refused in _FINAL_HANDSHAKE_FAILURES
                else ""
            )
            return SendTimeoutError(
                f"the daemon at {self.endpoint} refused the connection's security handshake "
                f"({refused}: CURVE on one side only, a server key that is not the daemon's, "
                f"or a client key not among its allowed clients): {waited}{final}",
                connected=False,
            )
        return SendTimeoutError(
            f"no daemon is connected at {self.endpoint} (is `streamer run` listening there?): "
            f"{waited}",
            connected=False,
        )

    def _handshake_failure(self) -> str | None:
        """How the last failed handshake with the daemon failed, as libzmq names the event
        (``HANDSHAKE_FAILED_PROTOCOL``, ...), since the last send timeout, or None when
        none has. A refusal that ends the connection for good
        (:data:`_FINAL_HANDSHAKE_FAILURES`) comes once and is kept: every later send times
        out for it."""
        failure = None
        while self._handshakes is not None and self._handshakes.poll(0):
            failure = zmq.Event(recv_monitor_message(self._handshakes)["event"]).name
            if failure in _FINAL_HANDSHAKE_FAILURES:
                self._refused_for_good = failure
        return failure or self._refused_for_good

    def _stop_watching_handshakes(self) -> None:
        """Stop the monitor of failed handshakes and close its socket; idempotent."""
        stop_monitor(self._socket, self._handshakes)
        self._handshakes = None


_SEND_SLICE_S = 0.1


def _why(exc: FrameError | TypeError) -> str:
    """What the daemon says of a refused header (``bad_header: …``), or why it could not
    be written as JSON."""
    return str(exc) if isinstance(exc, FrameError) else f"not JSON: {exc}"


def _slice_ms(send_timeout_s: float) -> int:
    """The ``SNDTIMEO`` of one send attempt (ms): a slice of the send timeout."""
    return max(1, round(min(send_timeout_s, _SEND_SLICE_S) * 1000))


_HANDSHAKE_FAILURES = (
    zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL
    | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL
    | zmq.EVENT_HANDSHAKE_FAILED_AUTH
)


_FINAL_HANDSHAKE_FAILURES = frozenset(
    {zmq.Event.HANDSHAKE_FAILED_PROTOCOL.name, zmq.Event.HANDSHAKE_FAILED_AUTH.name}
)
"""Failed handshakes after which libzmq (4.3) ends the connection for good instead of
reconnecting: a mechanism mismatch (CURVE on one side only) and a client key the daemon's
ZAP handler refused. A server key that is not the daemon's fails with no detail, and is
retried every ``RECONNECT_IVL``."""


def _push_socket(
    context: zmq.Context[Any], endpoint: str, sndhwm: int, curve: CurveClient | None
) -> tuple[zmq.Socket[Any], zmq.Socket[Any]]:
    """The connected PUSH socket, and the monitor of its failed handshakes (started before
    the connection, so that none is missed; :func:`unbounded_monitor`). The producer reads
    it at a send timeout and stops it at its first send."""
    socket = context.socket(zmq.PUSH)
    socket.setsockopt(zmq.IMMEDIATE, 1)
    socket.setsockopt(zmq.SNDHWM, sndhwm)
    handshakes = unbounded_monitor(socket, _HANDSHAKE_FAILURES)
    try:
        connect(socket, endpoint, curve)
    except ClientError:
        stop_monitor(socket, handshakes)
        socket.close(linger=0)
        raise
    return socket, handshakes


def _encode(image: np.ndarray, encoding: str, quality: int) -> bytes | np.ndarray:
    if image.size == 0:
        raise ClientError(f"an empty image, shape {image.shape}")
    if encoding == "raw":
        return image
    if encoding == "jpeg":
        ok, buffer = cv2.imencode(".jpg", image, [cv2.IMWRITE_JPEG_QUALITY, quality])
    else:
        ok, buffer = cv2.imencode(".png", image)
    if not ok:
        raise ClientError(f"cannot encode a {image.shape} {image.dtype} image as {encoding}")
    return buffer.tobytes()


def produce(
    media: MediaInput | str | int | os.PathLike[str],
    endpoint: str = DEFAULT_PRODUCER_ENDPOINT,
    *,
    source: str | None = None,
    fps: float | None = None,
    limit: int | None = None,
    loop: int = 1,
    encoding: str = "jpeg",
    quality: int = 90,
    meta: dict[str, Any] | None = None,
    send_timeout_s: float = 5.0,
    close_timeout_s: float = DEFAULT_CLOSE_TIMEOUT_S,
    on_sent: Callable[[int], None] | None = None,
    context: zmq.Context[Any] | None = None,
    curve: CurveClient | None = None,
    limits: FrameLimits = DEFAULT_FRAME_LIMITS,
) -> ProducerStats:
    """Send every frame of ``media`` to a daemon, then end-of-stream.

    When a send times out, or a frame cannot be read, encoded or sent as it is (the daemon
    would refuse it), the frames after it are not sent; the end of stream still is, waiting
    up to ``send_timeout_s`` for room, unless no daemon is connected (then only if it can be
    queued at once). Either way :meth:`Producer.close` then waits up to
    ``close_timeout_s`` for what is queued to leave. When a KeyboardInterrupt stops the
    frames (it is re-raised), nothing waits: end-of-stream is sent only if the daemon takes
    it at once, and frames still queued are discarded.

    Args:
        media: a :class:`MediaInput`, or anything :func:`open_input` resolves.
        endpoint: the daemon's PULL ingress.
        source: the source id; default ``media.name`` (the file stem).
        fps: frames per second (paced by :class:`Pacer`); None or 0 sends as fast as possible.
        limit: stop after this many frames; None for no limit.
        loop: passes over the input, 0 for endless (a single image is sent ``loop`` times).
        encoding, quality, send_timeout_s, close_timeout_s, context, curve, limits: as for
            :class:`Producer`.
        meta: a JSON object sent with every frame and echoed back in its result; frames
            read from image files also carry ``"file"``, the file's name.
        on_sent: called after each frame with its message size (bytes), e.g. to move a
            progress bar.

    Returns:
        The frames, bytes and seconds sent.

    Raises:
        AssetError: ``media`` is a media name not fetched yet.
        ClientError: ``media`` names no existing path and no media, or its first frame
            cannot be read (a camera or video OpenCV cannot open, an unreadable first
            image), before anything connects; or the run ended short: a frame could not
            be read (the message names the file, or the video; a video is also short when
            its frames end before the count its container announces, see
            :meth:`MediaInput.frames`) or sent as it is (the daemon would refuse it), a
            send timed out (whether a daemon is connected, see
            :class:`SendTimeoutError`), or frames or the end-of-stream were
            still queued ``close_timeout_s`` after the last send and were discarded. The
            message then counts the frames sent, says from which ``seq`` on none were,
            names the frames discarded (their count and ``seq`` range) and whether the end
            of stream was sent.
        ValueError: a bad source, encoding, quality, fps, limit, loop or timeout; before
            anything connects.
    """
    if loop < 0 or (limit is not None and limit < 0):
        raise ValueError(f"loop and limit must be >= 0, got loop={loop}, limit={limit}")
    pacer = Pacer(fps)
    media = media if isinstance(media, MediaInput) else open_input(media)
    frames = _first_read(itertools.islice(_passes(media, loop), limit))
    with Producer(
        endpoint,
        source=media.name if source is None else source,
        encoding=encoding,
        quality=quality,
        send_timeout_s=send_timeout_s,
        close_timeout_s=close_timeout_s,
        context=context,
        curve=curve,
        limits=limits,
    ) as producer:
        stopped = _send_frames(producer, frames, pacer, meta, on_sent)
        eos_failure = _end_stream(producer, stopped)
    if stopped is None and eos_failure is None and not producer.undelivered:
        return producer.stats
    raise ClientError(_shortfall(producer, stopped, eos_failure))


def _send_frames(
    producer: Producer,
    frames: Iterator[tuple[np.ndarray, str | None]],
    pacer: Pacer,
    meta: dict[str, Any] | None,
    on_sent: Callable[[int], None] | None,
) -> ClientError | None:
    """Send the named ``frames`` (:func:`produce`'s loop); what stopped them (a send
    timeout, a frame that could not be read or sent), None when every one was sent. A
    KeyboardInterrupt aborts the producer, after an end of stream only if it is taken at
    once, and is re-raised."""
    try:
        for image, name in frames:
            pacer.wait()
            size = _send_named(producer, image, meta, name)
            if on_sent is not None:
                on_sent(size)
    except ClientError as exc:
        return exc
    except KeyboardInterrupt:
        producer.send_eos(wait=False)
        producer.abort()
        raise
    return None


def _send_named(
    producer: Producer, image: np.ndarray, meta: dict[str, Any] | None, name: str | None
) -> int:
    """Send one frame read from the file ``name`` (None: from a video or camera); a frame
    the daemon would refuse names its file.

    Raises:
        SendTimeoutError, ClientError: as :meth:`Producer.send`.
    """
    try:
        return producer.send(image, ts=time.time(), meta=_with_file(meta, name))
    except SendTimeoutError:
        raise
    except ClientError as exc:
        if name is None:
            raise
        raise ClientError(f"{name}: {exc}") from None


def _with_file(meta: dict[str, Any] | None, name: str | None) -> dict[str, Any] | None:
    """``meta`` with ``"file": name`` for a frame read from a file; unchanged for another
    frame, or when it is no JSON object (for :meth:`Producer.send` to refuse)."""
    if name is None or not isinstance(meta, (dict, type(None))):
        return meta
    return {**(meta or {}), "file": name}


def _end_stream(producer: Producer, stopped: ClientError | None) -> SendTimeoutError | None:
    """Queue the end of stream after the frames sent: waiting for room, unless ``stopped``
    found no daemon connected; None once queued, otherwise why it was not."""
    if isinstance(stopped, SendTimeoutError) and not stopped.connected:
        return None if producer.send_eos(wait=False) else stopped
    try:
        producer.send_eos()
    except SendTimeoutError as exc:
        return exc
    return None


def _shortfall(
    producer: Producer, stopped: ClientError | None, eos_failure: SendTimeoutError | None
) -> str:
    """What a run that ended short tells its operator: why, the frames sent and not sent,
    those given up on still queued, and whether the end of stream was sent. A connection
    lost drops what it had queued unseen, so nothing is said of those frames then."""
    failure, sent = stopped or eos_failure, producer.stats.frames
    told = f"sent {sent} frame(s)"
    if stopped is not None:
        told += f", none from seq {sent} on"
    if producer.undelivered:
        told += f"; {_discarded(producer, eos_queued=eos_failure is None)}"
    elif sent and _connected(failure):
        told += "; all of them left" + (
            " and so did the end of stream" if eos_failure is None else ""
        )
    elif _connected(failure) and eos_failure is None:
        told += "; the end of stream was sent"
    if eos_failure is not None:
        told += "; the end of stream was not sent"
    if failure is None:
        return (
            f"{told}: the daemon at {producer.endpoint} takes frames slower than they were "
            "sent; allow a longer close timeout or send at a lower fps"
        )
    pushed_back = isinstance(failure, SendTimeoutError) and failure.connected
    hint = "; allow a longer send timeout or send at a lower fps" if pushed_back else ""
    return f"{failure}; {told}{hint}"


def _connected(failure: ClientError | None) -> bool:
    """Whether a daemon was connected when ``failure`` stopped the run (a frame that could
    not be read or sent says nothing of the daemon: assumed so)."""
    return not isinstance(failure, SendTimeoutError) or failure.connected


def _discarded(producer: Producer, *, eos_queued: bool) -> str:
    """The messages :meth:`Producer.close` gave up on: the last ones sent, the end of
    stream last when it was queued."""
    sent, lost = producer.stats.frames, producer.undelivered
    frames = lost - eos_queued
    what = "the end of stream"
    if frames:
        first = sent - frames
        seqs = f"seq {first}" if frames == 1 else f"seq {first}-{sent - 1}"
        what = f"the last {frames} frame(s) ({seqs})" + (" and " + what if eos_queued else "")
    return f"{what}, still queued {producer.close_timeout_s} s after the last send, discarded"


def _first_read(
    frames: Iterator[tuple[np.ndarray, str | None]],
) -> Iterator[tuple[np.ndarray, str | None]]:
    """``frames`` with the first one read now, so that an input that cannot be opened fails
    before anything connects (and no end of stream announces a stream that never began).

    Raises:
        ClientError: as :meth:`MediaInput.named_frames`.
    """
    first = next(frames, None)
    return frames if first is None else itertools.chain([first], frames)


def _passes(media: MediaInput, loop: int) -> Iterator[tuple[np.ndarray, str | None]]:
    """The named frames of ``loop`` passes over ``media`` (endless for 0; stops on an empty
    pass)."""
    for _ in itertools.count() if loop == 0 else range(loop):
        empty = True
        for named in media.named_frames():
            empty = False
            yield named
        if empty:
            return

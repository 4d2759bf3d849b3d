"""An ingress: the thread that owns one receiving socket (DESIGN.md §2, §5).

Socket types (``uri`` is ``<type>+<bind|connect>:<tcp|ipc>://…``, or a list of such URIs of
one type, all on the one socket):

- ``pull``: producers PUSH.
- ``sub``: the first part is a topic. With ``topics``, the socket subscribes to each and a
  message is taken only when its topic equals one of them (ZeroMQ matches prefixes, so
  ``cam1`` would also let ``cam10`` in); the others are ignored, not counted. imagezmq PUB
  senders send no topic part, so a ``sub`` with ``protocol = "imagezmq"`` takes everything.
- ``rep`` and ``router``: exactly one reply per request, always, errors included, sent by
  this thread once the message is checked and queued, or dropped at once (before
  inference): the native protocol's JSON ack
  (:func:`~streamer.transport.protocol.encode_ack`) or imagezmq's ``OK`` / ``ERROR …``
  (:func:`~streamer.transport.imagezmq.encode_reply`). A ``router``
  replies through the request's envelope: the peer identity, and when the request has an
  empty delimiter part (REQ peers send it), every part up to it: the identities a
  ROUTER/DEALER broker (``zmq.proxy``) between them adds, as a REP socket does.

For every message, in order: the protocol turns it into a :class:`~streamer.frames.Frame` or
an :class:`~streamer.frames.EndOfStream` marker; a frame whose header is valid is checked
without decoding (:func:`~streamer.vision.decode.check_payload`: raw fields and payload size,
or the image header, against the ingress's size limits) and fails at once if refused; every
message except an end-of-stream marker is counted as received; the item is handed on
(:meth:`Ingress._put`), then the reply goes out. Messages ZeroMQ refuses before delivering
them (over ``max_message_bytes``: the sender's connection is dropped and it gets no result)
are never counted. Under ``on_full = "block"`` a full queue stops the ingress from reading,
so the socket's receive high-water mark pushes back on the producers.
"""

from __future__ import annotations

import functools
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any, Protocol

import structlog
import zmq

from streamer.config import FullPolicy, IngressConfig
from streamer.errors import FrameError
from streamer.frames import EndOfStream, Frame, OutcomeCounts
from streamer.lifecycle import Worker
from streamer.transport.endpoints import INGRESS_TYPES, Endpoint, IpcFile, parse_endpoints
from streamer.transport.imagezmq import ImagezmqReader, encode_reply
from streamer.transport.protocol import encode_ack, read_message
from streamer.transport.security import CurveServer, HandshakeMonitor
from streamer.vision.decode import DecodeLimits, check_payload

__all__ = ["Ingress", "widest_limits"]

_POLL_MS = 100
_BURST = 64  # messages taken per poll at most
_STOP_INTAKE = 2  # at a stop, queued messages taken at most, in units of hwm
_REPLY_LINGER_MS = 500  # at close, replies still queued get this long to leave
_log = structlog.get_logger(__name__)

Reader = Callable[[Sequence[memoryview], int, float], "Frame | EndOfStream"]
Replier = Callable[["Frame | EndOfStream", "str | None"], bytes]


class Admission(Protocol):
    """Where an ingress hands what it receives (the pipeline's admission queue)."""

    def offer(self, item: Frame | EndOfStream, policy: FullPolicy) -> str | None:
        """Admit ``item`` under the ``on_full`` policy; may block under ``block``. Returns
        the reason ``item`` was dropped at once (no result follows), or None."""


def decode_limits(config: IngressConfig) -> DecodeLimits:
    """The size limits of one ingress (``max_width_px``, ``max_height_px``, ``max_pixels``)."""
    return DecodeLimits(config.max_width_px, config.max_height_px, config.max_pixels)


@functools.cache
def widest_limits(configs: tuple[IngressConfig, ...]) -> DecodeLimits:
    """The loosest limits of all ingresses: the decode stage's backstop, since each ingress
    already refused what exceeds its own limits (configs are hashable; computed once)."""
    limits = [decode_limits(c) for c in configs]
    return DecodeLimits(
        max(x.max_width for x in limits),
        max(x.max_height for x in limits),
        max(x.max_pixels for x in limits),
    )


def _protocol(config: IngressConfig) -> tuple[Reader, Replier]:
    if config.protocol == "imagezmq":
        return ImagezmqReader(config.source).read, encode_reply
    return read_message, encode_ack


class Ingress(Worker):
    """Receive thread of one ``[[ingress]]``.

    Args:
        config: the ingress settings; ``config.uri`` is parsed and the CURVE key pair loaded
            here.
        context: the daemon's ZeroMQ context; the socket is created in this thread.
        admission: takes every received item, in order.
        counts: outcome counters (``received`` is counted here).
        abort: set when the pipeline gives up; a blocked put then gives up too.

    Raises:
        ConfigError: a bad URI or an unreadable CURVE key file (``topics`` on a socket that
            is not ``sub`` is refused by the config already).
    """

    def __init__(
        self,
        config: IngressConfig,
        context: zmq.Context[Any],
        admission: Admission,
        counts: OutcomeCounts,
        abort: threading.Event,
    ) -> None:
        super().__init__(name=f"ingress-{config.name}")
        self._where = f"ingress {config.name}"
        self.endpoints: tuple[Endpoint, ...] = parse_endpoints(
            config.uri, INGRESS_TYPES, self._where
        )
        self.kind = self.endpoints[0].kind
        self.limits = decode_limits(config)
        self._read, self._reply = _protocol(config)
        self._curve = CurveServer.from_config(config, self._where)
        self._topics = frozenset(t.encode() for t in config.topics)
        self._longest_topic = max(map(len, self._topics), default=0)
        self._replies = self.kind in ("rep", "router")
        self._config = config
        self._context = context
        self._admission = admission
        self._counts = counts
        self._abort = abort
        self._stopping = threading.Event()
        self._socket: zmq.Socket[bytes] | None = None
        self._monitor: HandshakeMonitor | None = None
        self._ipc_files: list[IpcFile] = []

    def request_stop(self) -> None:
        """Stop receiving: the thread takes the messages already queued on its socket (up to
        twice ``hwm``), closes it and ends. Any thread may call this."""
        self._stopping.set()

    def setup(self) -> None:
        socket = self._context.socket(self.endpoints[0].socket_type)
        self._socket = socket
        socket.setsockopt(zmq.LINGER, _REPLY_LINGER_MS if self._replies else 0)
        socket.setsockopt(zmq.RCVHWM, self._config.hwm)
        socket.setsockopt(zmq.MAXMSGSIZE, self._config.max_message_bytes)
        if self.kind == "sub":
            for topic in sorted(self._topics) or [b""]:
                socket.setsockopt(zmq.SUBSCRIBE, topic)
        if self._curve is not None:
            self._curve.apply(socket)
            self._monitor = HandshakeMonitor(socket, self._where)
        attached = []
        for endpoint in self.endpoints:
            attached.append(endpoint.attach(socket))
            if (file := IpcFile.of(endpoint)) is not None:
                self._ipc_files.append(file)
        _log.info(
            "ingress_ready",
            ingress=self._config.name,
            endpoint=", ".join(attached),
            protocol=self._config.protocol,
            curve=self._curve is not None,
        )

    def teardown(self) -> None:
        if self._monitor is not None:
            self._monitor.close()
        if self._socket is not None:
            self._socket.close()
        for file in self._ipc_files:
            file.remove()

    def loop(self) -> None:
        assert self._socket is not None
        poller = zmq.Poller()
        poller.register(self._socket, zmq.POLLIN)
        if self._monitor is not None:
            poller.register(self._monitor.socket, zmq.POLLIN)
        while not self._stopping.is_set() and not self._abort.is_set():
            ready = dict(poller.poll(_POLL_MS))
            if self._monitor is not None and self._monitor.socket in ready:
                self._monitor.drain()
            if self._socket in ready:
                self._receive_burst(self._socket)
        self._take_queued(self._socket)

    def _take_queued(self, socket: zmq.Socket[bytes]) -> None:
        """At a stop, take the messages already queued on the socket, at most
        ``_STOP_INTAKE`` x ``hwm``: ZeroMQ has delivered them (a producer counts them sent),
        so they are processed like the others instead of vanishing with the socket. Messages
        arriving beyond that bound, or after an abort, are not read."""
        for _ in range(_STOP_INTAKE * self._config.hwm):
            if self._abort.is_set():
                return
            try:
                message = socket.recv_multipart(zmq.NOBLOCK, copy=False)
            except zmq.Again:
                return
            self._receive(socket, message)

    def _receive_burst(self, socket: zmq.Socket[bytes]) -> None:
        """Take the messages already queued on the socket, up to a burst, without polling
        between them (one poll per message costs as much as the message under load)."""
        for _ in range(_BURST):
            try:
                message = socket.recv_multipart(zmq.NOBLOCK, copy=False)
            except zmq.Again:
                return
            self._receive(socket, message)
            if self._stopping.is_set() or self._abort.is_set():
                return

    def _receive(self, socket: zmq.Socket[bytes], message: list[zmq.Frame]) -> None:
        parts = [part.buffer for part in message]
        envelope, body = self._split(parts)
        if body is None:
            return
        item = self._read(body, time.monotonic_ns(), time.time())
        if isinstance(item, Frame):
            self._check(item)
            self._counts.received()
        dropped = self._put(item)
        if self._replies:  # REP and ROUTER never block on send: they drop for a gone peer
            socket.send_multipart([*envelope, self._reply(item, dropped)])

    def _split(self, parts: list[memoryview]) -> tuple[list[bytes], list[memoryview] | None]:
        """(the envelope a reply goes back through, the message proper); the message is None
        for a SUB message whose topic is not one of ``topics``."""
        if self.kind == "router":
            cut = _envelope_end(parts)
            return [bytes(p) for p in parts[:cut]], parts[cut:]
        if self.kind == "sub" and self._config.protocol == "native":
            return [], parts[1:] if self._wanted(parts[0]) else None
        return [], parts

    def _wanted(self, topic: memoryview) -> bool:
        if not self._topics:
            return True
        return topic.nbytes <= self._longest_topic and bytes(topic) in self._topics

    def _check(self, frame: Frame) -> None:
        """Fail at once a frame that :func:`check_payload` refuses (no pixel is decoded), or
        give it its size."""
        if frame.error is not None or frame.payload is None:
            return
        try:
            frame.width, frame.height = check_payload(
                frame.encoding, frame.payload, frame.header, self.limits
            )
        except FrameError as error:
            frame.fail(error)

    def _put(self, item: Frame | EndOfStream) -> str | None:
        return self._admission.offer(item, self._config.on_full)


def _envelope_end(parts: list[memoryview]) -> int:
    """Where a ROUTER message's envelope ends: after its first empty part that has parts
    after it (the delimiter of a REQ peer, or of one behind brokers, whose identities come
    before it), else after the peer's identity (a DEALER peer sends no delimiter; a
    message's own last part, e.g. an end of stream's payload, may be empty).

    Source: the ZeroMQ guide, chapter 3, "The Extended Reply Envelope".
    """
    for index in range(1, len(parts) - 1):
        if not parts[index].nbytes:
            return index + 1
    return 1

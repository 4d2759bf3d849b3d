"""An ingress: the thread that owns one receiving socket (DESIGN.md §2, §5).

For every message it creates a :class:`~streamer.frames.Frame`, counts it as received, and
hands it on in arrival order: a frame with a valid header goes to ``prepare`` (which starts
decoding it on the worker pool and returns a future), a frame with a bad header goes on as
already failed, an end-of-stream header as an :class:`~streamer.frames.EndOfStream` marker.
With ``on_full = "block"`` a full downstream queue stops the ingress from reading, so the
socket's receive high-water mark pushes back on the producers.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

import structlog
import zmq

from streamer.config import IngressConfig
from streamer.errors import FrameError
from streamer.frames import EndOfStream, Frame, OutcomeCounts
from streamer.lifecycle import Worker
from streamer.transport.endpoints import INGRESS_TYPES, Endpoint, parse_endpoint
from streamer.transport.protocol import parse_header, source_of_unparsable

__all__ = ["Ingress"]

_POLL_MS = 100
_log = structlog.get_logger(__name__)

Prepare = Callable[[Frame], "Future[Frame]"]


class Ingress(Worker):
    """Receive thread of one ``[[ingress]]``.

    Args:
        config: the ingress settings; ``config.uri`` is parsed here (ConfigError if bad).
        context: the daemon's ZeroMQ context; the socket is created in this thread.
        prepare: starts decoding and preprocessing a frame, returns its future.
        outbox: the bounded queue to the batcher.
        counts: outcome counters (``received`` is counted here).
        abort: set when the pipeline gives up; a blocked put then gives up too.
    """

    def __init__(
        self,
        config: IngressConfig,
        context: zmq.Context[Any],
        prepare: Prepare,
        outbox: queue.Queue[Any],
        counts: OutcomeCounts,
        abort: threading.Event,
    ) -> None:
        super().__init__(name=f"ingress-{config.name}")
        where = f"ingress {config.name}"
        self.endpoint: Endpoint = parse_endpoint(config.uri, INGRESS_TYPES, where)
        self._config = config
        self._context = context
        self._prepare = prepare
        self._outbox = outbox
        self._counts = counts
        self._abort = abort
        self._stopping = threading.Event()
        self._socket: zmq.Socket[bytes] | None = None

    def request_stop(self) -> None:
        """Stop receiving; the thread closes its socket and ends. Any thread may call this."""
        self._stopping.set()

    def setup(self) -> None:
        socket = self._context.socket(self.endpoint.socket_type)
        self._socket = socket
        socket.setsockopt(zmq.LINGER, 0)
        socket.setsockopt(zmq.RCVHWM, self._config.hwm)
        socket.setsockopt(zmq.MAXMSGSIZE, self._config.max_message_bytes)
        if self.endpoint.kind == "sub":
            socket.setsockopt(zmq.SUBSCRIBE, b"")
        self.endpoint.attach(socket)
        _log.info("ingress_ready", ingress=self._config.name, endpoint=str(self.endpoint))

    def teardown(self) -> None:
        if self._socket is not None:
            self._socket.close(linger=0)

    def loop(self) -> None:
        assert self._socket is not None
        poller = zmq.Poller()
        poller.register(self._socket, zmq.POLLIN)
        while not self._stopping.is_set() and not self._abort.is_set():
            if poller.poll(_POLL_MS):
                parts = self._socket.recv_multipart(copy=False)
                self._handle([p.buffer for p in parts])

    def _handle(self, parts: list[memoryview]) -> None:
        if self.endpoint.kind == "sub":
            parts = parts[1:]
        received_ns, received_at = time.monotonic_ns(), time.time()
        raw_header = bytes(parts[0]) if parts else b""
        try:
            header = parse_header(raw_header)
        except FrameError as error:
            source, seq = source_of_unparsable(raw_header)
            frame = Frame(source, seq, received_ns, received_at)
            frame.fail(error)
            self._counts.received()
            self._put(frame)
            return
        if header.eos:
            self._put(EndOfStream(header.source, header.seq))
            return
        frame = Frame(
            header.source,
            header.seq,
            received_ns,
            received_at,
            ts=header.ts,
            meta=header.meta,
            encoding=header.encoding,
            header=header.fields,
            payload=parts[1] if len(parts) > 1 else b"",
        )
        self._counts.received()
        self._put(self._prepare(frame))

    def _put(self, item: Any) -> None:
        while not self._abort.is_set():
            try:
                self._outbox.put(item, timeout=_POLL_MS / 1000)
                return
            except queue.Full:
                continue

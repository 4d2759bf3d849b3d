"""Egress: the thread that owns the result sockets and publishes every outcome.

Each finished frame is encoded once (:func:`~streamer.transport.protocol.encode_result`)
and sent on every ``[[egress]]`` socket; it is then counted as published, or as failed by
its error's reason. PUB sockets drop for slow subscribers at their high-water mark (ZeroMQ's
rule); a PUSH socket with no reader is given ``SNDTIMEO`` and a frame that could be sent
nowhere is counted as dropped (``egress_blocked``) instead of hanging the daemon.
"""

from __future__ import annotations

import queue
import threading
import time
from typing import Any

import structlog
import zmq

from streamer.config import EgressConfig
from streamer.errors import Reason
from streamer.frames import STOP, Batch, EndOfStream, Frame, OutcomeCounts
from streamer.lifecycle import Worker
from streamer.transport.endpoints import EGRESS_TYPES, Endpoint, parse_endpoint
from streamer.transport.protocol import encode_eos_result, encode_result

__all__ = ["Egress"]

_POLL_S = 0.1
_PUSH_SEND_TIMEOUT_MS = 1000
_LINGER_MS = 1000
_log = structlog.get_logger(__name__)


class Egress(Worker):
    """Publish thread for all ``[[egress]]`` sockets.

    Args:
        configs: the egress settings; their URIs are parsed here (ConfigError if bad).
        context: the daemon's ZeroMQ context; sockets are created in this thread.
        inbox: batches and end-of-stream markers in order, then :data:`STOP`.
        counts: outcome counters (published / failed / dropped are counted here).
        abort: set when the pipeline gives up draining.
    """

    def __init__(
        self,
        configs: tuple[EgressConfig, ...],
        context: zmq.Context[Any],
        inbox: queue.SimpleQueue[Any],
        counts: OutcomeCounts,
        abort: threading.Event,
    ) -> None:
        super().__init__(name="egress")
        self.endpoints: list[Endpoint] = [
            parse_endpoint(c.uri, EGRESS_TYPES, f"egress {c.name}") for c in configs
        ]
        self._configs = configs
        self._context = context
        self._inbox = inbox
        self._counts = counts
        self._abort = abort
        self._sockets: list[zmq.Socket[bytes]] = []

    def setup(self) -> None:
        for config, endpoint in zip(self._configs, self.endpoints, strict=True):
            socket = self._context.socket(endpoint.socket_type)
            self._sockets.append(socket)
            socket.setsockopt(zmq.LINGER, _LINGER_MS)
            socket.setsockopt(zmq.SNDHWM, config.hwm)
            if endpoint.kind == "push":
                socket.setsockopt(zmq.SNDTIMEO, _PUSH_SEND_TIMEOUT_MS)
            endpoint.attach(socket)
            _log.info("egress_ready", egress=config.name, endpoint=str(endpoint))

    def teardown(self) -> None:
        for socket in self._sockets:
            socket.close()

    def loop(self) -> None:
        while not self._abort.is_set():
            try:
                item = self._inbox.get(timeout=_POLL_S)
            except queue.Empty:
                continue
            if item is STOP:
                return
            if isinstance(item, EndOfStream):
                self._send(encode_eos_result(item))
            elif isinstance(item, Batch):
                for frame in item.frames:
                    self._publish(frame)

    def _publish(self, frame: Frame) -> None:
        sent = self._send(encode_result(frame, time.monotonic_ns()))
        if not sent:
            self._counts.dropped(Reason.EGRESS_BLOCKED)
        elif frame.error is not None:
            self._counts.failed(frame.error.reason)
        else:
            self._counts.published()

    def _send(self, parts: list[bytes]) -> bool:
        sent = False
        for socket in self._sockets:
            try:
                socket.send_multipart(parts)
                sent = True
            except zmq.Again:
                continue
        return sent

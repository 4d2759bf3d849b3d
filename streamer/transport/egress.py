"""Egress: the thread that owns the result sockets and publishes every outcome.

Each finished frame is encoded once (:func:`~streamer.transport.protocol.encode_result`)
and sent on every ``[[egress]]`` socket; it is then counted as published, or as failed by
its error's reason. PUB sockets drop for slow subscribers at their high-water mark (ZeroMQ's
rule). A PUSH socket that is the only egress socket waits at most ``SNDTIMEO`` (1 s) for a
reader to take a result (back-pressure rather than loss); when that runs out it is
*stalled*: it is then sent to without waiting, results it has no room for dropped on it,
until it takes one again. Beside other sockets a PUSH socket is never waited for (a slow
reader would hold every socket up): what it has no room for is dropped on it. Stalls and
resumptions are logged, at most 2 lines per 10 s per socket, with the results dropped on it
so far. A frame that could be sent nowhere is counted as dropped (``egress_blocked``). Once
the pipeline gives up draining, nothing more is sent or counted (the frames left are the
pipeline's ``shutdown`` drops). A socket with CURVE settings is a CURVE server
(:mod:`streamer.transport.security`); its failed handshakes are read from its monitor on the
periodic tick and logged once per kind.
"""

from __future__ import annotations

import queue
import threading
import time
from typing import Any, Protocol

import structlog
import zmq

from streamer.config import EgressConfig
from streamer.errors import FrameError, Reason
from streamer.frames import STOP, Batch, EndOfStream, Frame, OutcomeCounts
from streamer.lifecycle import Worker
from streamer.log_budget import LogBudget, logged
from streamer.transport.endpoints import EGRESS_TYPES, Endpoint, IpcFile, parse_endpoint
from streamer.transport.protocol import encode_eos_result, encode_result
from streamer.transport.security import CurveServer, HandshakeMonitor

__all__ = ["Egress", "EgressMetrics", "Sequencer"]

_POLL_S = 0.1
_PUSH_SEND_TIMEOUT_MS = 1000
_LINGER_MS = 1000
_log = structlog.get_logger(__name__)


class Sequencer(Protocol):
    """Restores each source's order (the pipeline's reorder buffer); egress thread only."""

    def push(self, item: Frame | EndOfStream) -> list[Frame | EndOfStream]:
        """Add a finished item; return what may be sent now, in order."""

    def expire(self) -> list[Frame | EndOfStream]:
        """Return what waited too long for a missing earlier item."""

    def flush(self) -> list[Frame | EndOfStream]:
        """Return everything still held (at shutdown), in order per source."""


class EgressMetrics(Protocol):
    """End-to-end latency and egress drops (the daemon's metrics); egress thread only."""

    def observe_sent(self, frame: Frame, done_ns: int) -> None:
        """``frame``'s result was sent; ``done_ns`` is its ``done_at`` (monotonic, ns)."""

    def observe_dropped(self, egress: str, results: int = 1) -> None:
        """``results`` the socket of ``[[egress]]`` ``egress`` had no room for (0: the
        socket is there, its series starts at 0)."""


class Egress(Worker):
    """Publish thread for all ``[[egress]]`` sockets.

    Args:
        configs: the egress settings; their URIs are parsed and CURVE key pairs loaded here
            (ConfigError if bad).
        context: the daemon's ZeroMQ context; sockets are created in this thread.
        inbox: batches and end-of-stream markers in order, then :data:`STOP`.
        sequencer: puts each source's results back in arrival order before they are sent.
        counts: outcome counters (published / failed / dropped are counted here).
        abort: set when the pipeline gives up draining.
        metrics: observes each batch and each sent result, if given.
    """

    def __init__(
        self,
        configs: tuple[EgressConfig, ...],
        context: zmq.Context[Any],
        inbox: queue.SimpleQueue[Any],
        sequencer: Sequencer,
        counts: OutcomeCounts,
        abort: threading.Event,
        *,
        metrics: EgressMetrics | None = None,
    ) -> None:
        super().__init__(name="egress")
        self.endpoints: list[Endpoint] = [
            parse_endpoint(c.uri, EGRESS_TYPES, f"egress {c.name}") for c in configs
        ]
        self._curves = [CurveServer.from_config(c, f"egress {c.name}") for c in configs]
        self._monitors: list[HandshakeMonitor] = []
        self._ipc_files: list[IpcFile] = []
        self._configs = configs
        self._context = context
        self._inbox = inbox
        self._sequencer = sequencer
        self._counts = counts
        self._abort = abort
        self._metrics = metrics
        if metrics is not None:
            for config in configs:  # an alert on the series needs it from 0
                metrics.observe_dropped(config.name, 0)
        self._sockets: list[zmq.Socket[bytes]] = []
        self._waits = [e.kind == "push" and len(configs) == 1 for e in self.endpoints]
        self._stalled = [False] * len(configs)
        self._dropped = [0] * len(configs)
        self._state_lines = [LogBudget("egress_stalled|egress_resumed", lines=2) for _ in configs]

    def setup(self) -> None:
        for config, endpoint, curve in zip(
            self._configs, self.endpoints, self._curves, strict=True
        ):
            socket = self._context.socket(endpoint.socket_type)
            self._sockets.append(socket)
            socket.setsockopt(zmq.LINGER, _LINGER_MS)
            socket.setsockopt(zmq.SNDHWM, config.hwm)
            if endpoint.kind == "push":  # a send that may wait, waits this long at most
                socket.setsockopt(zmq.SNDTIMEO, _PUSH_SEND_TIMEOUT_MS)
            if curve is not None:
                curve.apply(socket)
                self._monitors.append(HandshakeMonitor(socket, f"egress {config.name}"))
            attached = endpoint.attach(socket)
            if (file := IpcFile.of(endpoint)) is not None:
                self._ipc_files.append(file)
            _log.info(
                "egress_ready", egress=config.name, endpoint=attached, curve=curve is not None
            )

    def teardown(self) -> None:
        for monitor in self._monitors:
            monitor.close()
        for socket in self._sockets:
            socket.close()
        for file in self._ipc_files:
            file.remove()

    def loop(self) -> None:
        next_expiry = time.monotonic() + _POLL_S
        while not self._abort.is_set():
            try:
                item = self._inbox.get(timeout=_POLL_S)
            except queue.Empty:
                item = None
            if item is STOP:
                self._emit(self._sequencer.flush())
                return
            if isinstance(item, EndOfStream):
                self._emit(self._sequencer.push(item))
            elif isinstance(item, Batch):
                for frame in item.frames:
                    self._emit(self._sequencer.push(frame))
            if time.monotonic() >= next_expiry:
                self._emit(self._sequencer.expire())
                for monitor in self._monitors:
                    monitor.drain()
                next_expiry = time.monotonic() + _POLL_S

    def _emit(self, items: list[Frame | EndOfStream]) -> None:
        for item in items:
            if self._abort.is_set():
                return
            if isinstance(item, EndOfStream):
                self._send(encode_eos_result(item))
            else:
                self._publish(item)

    def _publish(self, frame: Frame) -> None:
        done_ns = time.monotonic_ns()
        sent = self._send(_encoded(frame, done_ns))
        if not sent:
            self._counts.dropped(Reason.EGRESS_BLOCKED)
        elif frame.error is not None:
            self._counts.failed(frame.error.reason)
        else:
            self._counts.published()
        if sent and self._metrics is not None:
            self._metrics.observe_sent(frame, done_ns)

    def _send(self, parts: list[bytes]) -> bool:
        """Send a ``[topic, json]`` result on every socket, waiting only on a lone PUSH
        socket that is not stalled; whether any took it.

        Two ``send`` calls instead of ``send_multipart``, which checks each part's type
        first and costs twice as much per result."""
        topic, body = parts
        sent = False
        for index, socket in enumerate(self._sockets):
            flags = 0 if self._waits[index] and not self._stalled[index] else zmq.NOBLOCK
            try:
                socket.send(topic, zmq.SNDMORE | flags)
                socket.send(body, flags)
            except zmq.Again:
                self._stall(index)
                continue
            if self._stalled[index]:
                self._stalled[index] = False
                self._log_state(index, _log.info, "egress_resumed")
            sent = True
        return sent

    def _stall(self, index: int) -> None:
        self._dropped[index] += 1
        if self._metrics is not None:
            self._metrics.observe_dropped(self._configs[index].name)
        if not self._stalled[index]:
            self._stalled[index] = True
            detail = "no reader took a result; results it has no room for are dropped"
            self._log_state(index, _log.warning, "egress_stalled", detail=detail)

    def _log_state(self, index: int, log: Any, event: str, **fields: Any) -> None:
        suppressed = self._state_lines[index].take()
        if suppressed is not None:
            name = self._configs[index].name
            log(event, egress=name, dropped=self._dropped[index], suppressed=suppressed, **fields)


def _encoded(frame: Frame, done_ns: int) -> list[bytes]:
    """The frame's result message; an error result (``postprocess_failed``, without its
    results and meta) when those cannot be encoded as JSON, so one bad result never stops
    egress."""
    try:
        return encode_result(frame, done_ns)
    except TypeError as exc:  # orjson.JSONEncodeError is a TypeError
        _log.error("result_unencodable", source=logged(frame.source), seq=frame.seq, error=str(exc))
        frame.results, frame.meta = {}, None
        frame.fail(FrameError(Reason.POSTPROCESS_FAILED, f"result is not JSON: {exc}"))
        return encode_result(frame, done_ns)

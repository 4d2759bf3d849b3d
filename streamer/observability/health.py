"""Health and metrics over HTTP: ``/healthz``, ``/readyz`` and ``/metrics`` on a local address.

- ``/healthz``: 200 while the process is alive and its control loop runs (or has not begun:
  loading, draining); 503 when the control loop has not run for ``LOOP_STALE_S`` seconds.
- ``/readyz``: 200 only when the models are loaded, the sockets bound, the status is
  ``running`` (so not draining), nothing failed and the pipeline is not stalled; otherwise
  503. Both answer a JSON object: ``{"ready"|"alive": bool, "status": "...", "reasons": []}``,
  the reasons saying why not.
- ``/metrics``: the Prometheus text format (or OpenMetrics, gzip, ``name[]`` filters, as the
  client library's own handler negotiates them) of :class:`~streamer.observability.metrics.
  PipelineMetrics`.

``HEAD`` answers each path as ``GET`` does, without the body: a load balancer's health check
may use it (HAProxy's ``http-check send meth HEAD``), and a 501 there would read as down.

The server is the standard library's threading HTTP server on its own thread; each request
runs on a short-lived thread with a socket timeout, so a slow client cannot block a probe,
and those threads are not waited for at stop, so a client that trickles its request (each
line within the timeout) cannot hold the daemon's exit either. A client that hangs up or
stalls past the timeout (a scrape that timed out) costs its request and nothing else; any
other failure of a request is an ``http_request_failed`` warning, at most 10 lines per 10 s,
never the standard library's traceback on standard error (a client resetting its connections
would otherwise put 25 raw lines there per request, past the log's budgets).
"""

from __future__ import annotations

import json
import socket
import sys
import threading
import time
from http.server import ThreadingHTTPServer
from typing import Any
from urllib.parse import urlsplit

import structlog
from prometheus_client import CollectorRegistry
from prometheus_client.exposition import MetricsHandler

from streamer.errors import StreamerError
from streamer.lifecycle import Status, Worker
from streamer.log_budget import LogBudget

__all__ = ["LOOP_STALE_S", "HealthServer", "HealthState"]

LOOP_STALE_S = 10.0
"""``/healthz`` fails when the running control loop has not ticked for this long (s)."""
_REQUEST_TIMEOUT_S = 5.0
_POLL_S = 0.2
_log = structlog.get_logger(__name__)
_FAILURE_LINES = LogBudget("http_request_failed")

_NOT_READY = {
    Status.INITIALIZING: "initializing: loading models",
    Status.STARTING: "starting: binding sockets",
    Status.STOPPING: "stopping: draining frames in flight",
    Status.STOPPED: "stopped",
}
Answer = tuple[int, dict[str, Any]]
"""An HTTP status code and its JSON body."""


class HealthState:
    """What the probes answer; the control thread writes it, HTTP threads read it.

    Every method takes ``now_s``, the current ``time.monotonic()`` in seconds, where it needs
    the time.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._status = Status.INITIALIZING
        self._failure: str | None = None
        self._stalled_for_s = 0.0
        self._tick_at_s: float | None = None

    def set_status(self, status: Status) -> None:
        """Record the lifecycle state (``running`` is the only ready one)."""
        with self._lock:
            self._status = status

    def set_failure(self, failure: str) -> None:
        """Record the error that ends the daemon; ``/readyz`` fails from now on."""
        with self._lock:
            self._failure = failure

    def tick(self, now_s: float, stalled_for_s: float) -> None:
        """One turn of the control loop.

        Args:
            now_s: ``time.monotonic()`` (s).
            stalled_for_s: how long the pipeline has been stalled (s), 0 when it is not.
        """
        with self._lock:
            self._tick_at_s = now_s
            self._stalled_for_s = stalled_for_s

    def liveness(self, now_s: float) -> Answer:
        """The ``/healthz`` answer."""
        with self._lock:
            reasons = []
            ticks_expected = self._status is Status.RUNNING
            if ticks_expected and self._tick_at_s is not None:
                idle_s = now_s - self._tick_at_s
                if idle_s > LOOP_STALE_S:
                    reasons.append(f"control loop has not run for {idle_s:.1f} s")
            return _answer("alive", self._status, reasons)

    def readiness(self, now_s: float) -> Answer:
        """The ``/readyz`` answer."""
        code, body = self.liveness(now_s)
        with self._lock:
            reasons = list(body["reasons"])
            if self._status in _NOT_READY:
                reasons.append(_NOT_READY[self._status])
            if self._failure is not None:
                reasons.append(f"failed: {self._failure}")
            if self._stalled_for_s > 0:
                reasons.append(f"stalled: no frame completed for {self._stalled_for_s:.1f} s")
            return _answer("ready", self._status, reasons)


def _answer(key: str, status: Status, reasons: list[str]) -> Answer:
    return (503 if reasons else 200), {key: not reasons, "status": status.value, "reasons": reasons}


class _Handler(MetricsHandler):
    """``/metrics`` by the client library's handler, the probes from a :class:`HealthState`.

    :class:`HealthServer` makes a subclass with ``registry`` and ``health`` set.
    """

    health: HealthState
    timeout = _REQUEST_TIMEOUT_S

    def do_GET(self) -> None:
        path = urlsplit(self.path).path
        if path == "/metrics":
            super().do_GET()
        elif path == "/healthz":
            self._reply(*self.health.liveness(time.monotonic()))
        elif path == "/readyz":
            self._reply(*self.health.readiness(time.monotonic()))
        else:
            self._reply(404, {"error": f"no {path}", "paths": ["/healthz", "/readyz", "/metrics"]})

    def do_HEAD(self) -> None:
        """The ``GET`` answer's status and headers, without its body (RFC 9110, 9.3.2)."""
        stream = self.wfile
        self.wfile = _HeadersOnly(stream)  # type: ignore[assignment]
        try:
            self.do_GET()
        finally:
            self.wfile = stream

    def _reply(self, code: int, body: dict[str, Any]) -> None:
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


class _HeadersOnly:
    """A response stream that passes the status line and headers (written at once by
    ``end_headers``) and discards what follows: a ``HEAD`` answer's body."""

    def __init__(self, stream: Any) -> None:
        self._stream = stream
        self._headers_sent = False

    def write(self, data: bytes) -> int:
        if self._headers_sent:
            return len(data)
        self._headers_sent = True
        return int(self._stream.write(data))

    def flush(self) -> None:
        self._stream.flush()


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A request failed (on its own thread): nothing to say for a client that hung up
        or stalled, a budgeted warning for anything else (module docstring)."""
        error = sys.exc_info()[1]
        if isinstance(error, (ConnectionError, TimeoutError)):
            return
        if (suppressed := _FAILURE_LINES.take()) is not None:
            failure = f"{type(error).__name__}: {error}"
            _log.warning("http_request_failed", error=failure, suppressed=suppressed)


class _Server6(_Server):
    address_family = socket.AF_INET6


class HealthServer(Worker):
    """The HTTP thread serving ``/healthz``, ``/readyz`` and ``/metrics``.

    Start it with :meth:`~streamer.lifecycle.Worker.launch`, which binds the address (a
    ``StreamerError`` naming ``host:port`` when it is in use), and end it with :meth:`stop`.

    Args:
        host: address to bind, e.g. ``127.0.0.1`` or ``::1``.
        port: TCP port; 0 takes a free one (see :attr:`port`).
        health: what the probes answer.
        registry: what ``/metrics`` exposes.

    Attributes:
        port: the bound port, once launched.
    """

    def __init__(
        self, host: str, port: int, health: HealthState, registry: CollectorRegistry
    ) -> None:
        super().__init__(name="http")
        self.port = port
        self._host = host
        self._handler = type("Handler", (_Handler,), {"registry": registry, "health": health})
        self._server: _Server | None = None

    def setup(self) -> None:
        server_class = _Server6 if ":" in self._host else _Server
        try:
            self._server = server_class((self._host, self.port), self._handler)
        except OSError as exc:
            address = f"[{self._host}]" if ":" in self._host else self._host
            raise StreamerError(
                f"cannot serve HTTP on {address}:{self.port} (daemon.http_address): {exc}"
            ) from exc
        self.port = self._server.server_address[1]
        _log.info("http_ready", host=self._host, port=self.port)

    def loop(self) -> None:
        assert self._server is not None
        self._server.serve_forever(poll_interval=_POLL_S)

    def teardown(self) -> None:
        if self._server is not None:
            self._server.server_close()

    def stop(self) -> None:
        """Stop serving and close the listening socket (requests in progress are not waited
        for); idempotent."""
        if self._server is not None and self.is_alive():
            self._server.shutdown()
        if self.ident is not None:
            self.join()

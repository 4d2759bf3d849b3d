"""How a client's socket connects to a daemon: IPv6 hosts, CURVE, and the error it raises."""

from __future__ import annotations

from typing import Any

import zmq

from streamer.errors import ClientError
from streamer.transport.endpoints import ipv6_host
from streamer.transport.security import CurveClient

__all__ = ["connect"]


def connect(socket: zmq.Socket[Any], endpoint: str, curve: CurveClient | None) -> None:
    """Connect ``socket`` to a daemon's ``endpoint``: with ZeroMQ's ``IPV6`` option for a
    bracketed IPv6 host (``tcp://[::1]:5555``), and as a CURVE client when ``curve`` is
    given (README "Security (CURVE)").

    Raises:
        ClientError: the endpoint is invalid; the caller closes the socket.
    """
    if ipv6_host(endpoint):
        socket.setsockopt(zmq.IPV6, 1)
    if curve is not None:
        curve.apply(socket)
    try:
        socket.connect(endpoint)
    except zmq.ZMQError as exc:
        raise ClientError(f"cannot connect to {endpoint!r}: {exc}") from exc

"""How a client's socket connects to a daemon: IPv6 hosts, CURVE, and the error it raises."""

from __future__ import annotations

import uuid
from typing import Any

import zmq

from streamer.errors import ClientError
from streamer.transport.endpoints import ipv6_host
from streamer.transport.security import CurveClient

__all__ = ["connect", "stop_monitor", "unbounded_monitor"]


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


def unbounded_monitor(socket: zmq.Socket[Any], events: int) -> zmq.Socket[Any]:
    """A monitor of ``socket``'s ``events`` whose queue has no limit (a PAIR socket in
    ``socket``'s context); start it before connecting so that no event is missed, and stop
    it with ``socket.disable_monitor()`` before closing it.

    ``Socket.get_monitor_socket`` keeps ZeroMQ's default limit of 1000 messages: libzmq sends
    each event from the context's I/O thread and waits while the queue is full, so a client
    that reads its monitor only now and then (a refused reconnection every 100 ms fills it
    in about 5 minutes) would stop every socket of the context, and a ``disable_monitor``
    would then wait for that thread forever, holding the GIL.
    """
    address = f"inproc://monitor-{uuid.uuid4().hex}"
    socket.monitor(address, events)
    monitor = socket.context.socket(zmq.PAIR)
    monitor.setsockopt(zmq.RCVHWM, 0)  # before connecting: the pipe's limit is set then
    monitor.connect(address)
    return monitor


def stop_monitor(socket: zmq.Socket[Any], monitor: zmq.Socket[Any] | None) -> None:
    """Stop ``socket``'s monitor and close its socket ``monitor`` (from
    :func:`unbounded_monitor`); nothing when ``monitor`` is None (already stopped)."""
    if monitor is not None:
        socket.disable_monitor()
        monitor.close(linger=0)

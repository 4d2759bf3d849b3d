"""Socket monitors whose event queue has no limit, for clients and the daemon alike."""

from __future__ import annotations

import uuid
from typing import Any

import zmq

__all__ = ["stop_monitor", "unbounded_monitor"]


def unbounded_monitor(socket: zmq.Socket[Any], events: int) -> zmq.Socket[Any]:
    """A monitor of ``socket``'s ``events`` whose queue has no limit (a PAIR socket in
    ``socket``'s context); start it before binding or connecting so that no event is
    missed, and stop it with :func:`stop_monitor` before closing ``socket``.

    ``Socket.get_monitor_socket`` keeps ZeroMQ's default limit of 1000 messages: libzmq sends
    each event from the context's I/O thread and waits while the queue is full, so a client
    that reads its monitor only now and then (a refused reconnection every 100 ms fills it
    in about 5 minutes), or a daemon that reads it every 100 ms under a flood of failed
    handshakes, would stop every socket of the context, and a ``disable_monitor`` would
    then wait for that thread forever, holding the GIL.
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

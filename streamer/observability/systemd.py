"""systemd integration: service notifications (sd_notify(3)) through the ``sdnotify`` library.

Under ``Type=notify`` systemd passes ``NOTIFY_SOCKET``, a unix datagram socket (a path, or a
name in the abstract namespace written with a leading ``@``), and with ``WatchdogSec=`` also
``WATCHDOG_USEC`` (the timeout, µs) and ``WATCHDOG_PID``. The daemon sends::

    READY=1                      models loaded and sockets bound (and again after a reload)
    STATUS=<one line>            throughput and counts, shown by `systemctl status`
    WATCHDOG=1                   from the control loop, only while the pipeline makes progress
    RELOADING=1 MONOTONIC_USEC=  a SIGHUP reload begins (READY=1 ends it)
    STOPPING=1                   shutdown begins (the drain follows)

Outside systemd (no ``NOTIFY_SOCKET``) every call is a no-op. A send that fails (the service
manager went away) is logged once and never raised: notifications must not stop the daemon.
Nor may a service manager that stops reading: once the socket's queue is full
(``net.unix.max_dgram_qlen`` datagrams) a send waits at most :data:`SEND_TIMEOUT_S`, then that
message is given up as a failed send, so the control loop goes on answering signals.
(When ``NOTIFY_SOCKET`` names no socket, ``sdnotify`` leaves its own socket for the garbage
collector to close, with a ``ResourceWarning``; that is the library's, and only on a
misconfigured host.)
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping

import sdnotify  # type: ignore[import-untyped]  # no type hints shipped
import structlog

__all__ = ["SEND_TIMEOUT_S", "Notifier", "watchdog_interval_s"]

_log = structlog.get_logger(__name__)

SEND_TIMEOUT_S = 1.0
"""The longest one notification waits for room on the socket (s)."""


def watchdog_interval_s(environ: Mapping[str, str], pid: int) -> float | None:
    """The watchdog ping interval: half of ``WATCHDOG_USEC``, in seconds.

    The rule of sd_watchdog_enabled(3): the watchdog is on when ``WATCHDOG_USEC`` is a positive
    integer and ``WATCHDOG_PID`` is unset or equals this process's id; systemd's docs advise
    pinging at half the timeout.

    Args:
        environ: the process environment.
        pid: this process's id.

    Returns:
        Seconds between two ``WATCHDOG=1`` pings, or None when no watchdog is expected.
    """
    usec = environ.get("WATCHDOG_USEC", "")
    owner = environ.get("WATCHDOG_PID", "")
    if not usec.isdigit() or int(usec) == 0:
        return None
    if owner and owner != str(pid):
        return None
    return int(usec) / 2 / 1e6


class Notifier:
    """Sends sd_notify messages to the service manager; control thread only.

    Reads ``NOTIFY_SOCKET``, ``WATCHDOG_USEC`` and ``WATCHDOG_PID`` from ``os.environ``.

    Attributes:
        enabled: True when ``NOTIFY_SOCKET`` was set and its socket could be opened.
        watchdog_interval_s: seconds between pings, or None when systemd expects none.
    """

    def __init__(self) -> None:
        self.watchdog_interval_s = watchdog_interval_s(os.environ, os.getpid())
        self._sender: sdnotify.SystemdNotifier | None = None
        self._failing = False
        if os.environ.get("NOTIFY_SOCKET"):
            self._sender = self._connect()
        self.enabled = self._sender is not None

    @staticmethod
    def _connect() -> sdnotify.SystemdNotifier | None:
        try:
            sender = sdnotify.SystemdNotifier(debug=True)
        except OSError as exc:
            _log.warning("systemd_notify_unavailable", error=str(exc))
            return None
        sender.socket.settimeout(SEND_TIMEOUT_S)
        return sender

    def ready(self) -> None:
        """``READY=1``: start-up (or a reload) is complete."""
        self._send("READY=1")

    def status(self, text: str) -> None:
        """``STATUS=text``: one line of free-form status (ASCII)."""
        self._send(f"STATUS={text}")

    def watchdog(self) -> None:
        """``WATCHDOG=1``: the daemon is healthy; call every :attr:`watchdog_interval_s`."""
        self._send("WATCHDOG=1")

    def reloading(self) -> None:
        """``RELOADING=1`` with ``MONOTONIC_USEC`` (CLOCK_MONOTONIC, µs), as sd_notify(3) asks."""
        self._send(f"RELOADING=1\nMONOTONIC_USEC={time.monotonic_ns() // 1000}")

    def stopping(self) -> None:
        """``STOPPING=1``: shutdown has begun."""
        self._send("STOPPING=1")

    def close(self) -> None:
        """Close the socket; later calls send nothing. Idempotent."""
        if self._sender is not None:
            self._sender.socket.close()
            self._sender = None

    def _send(self, message: str) -> None:
        if self._sender is None:
            return
        try:
            self._sender.notify(message)
        except OSError as exc:
            if not self._failing:
                _log.warning("systemd_notify_failed", error=str(exc))
            self._failing = True
            return
        if self._failing:
            _log.info("systemd_notify_restored")
        self._failing = False

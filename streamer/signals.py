"""The daemon's signals, held while ``streamer run`` starts.

``streamer run`` holds (blocks) :data:`DAEMON_SIGNALS` before anything else is imported
(:mod:`streamer.entry`), and the daemon lets them through once its handlers are in place
(:func:`streamer.daemon.run_daemon`): a SIGTERM or Ctrl-C in the first half second, while the
libraries load, is then a normal stop (drain, ``stopped``, exit 0) instead of a traceback, an
exit by the signal, or a library that fails to initialise half-way (an interrupted
onnxruntime import reads ``ImportError: initialization failed``). A held signal stays
pending; threads started meanwhile inherit the mask, so it reaches the main thread, the one
where Python runs handlers.
"""

from __future__ import annotations

import signal
import time

__all__ = [
    "DAEMON_SIGNALS",
    "POLL_S",
    "SignalFlag",
    "hold_daemon_signals",
    "release_daemon_signals",
]

DAEMON_SIGNALS = frozenset({signal.SIGINT, signal.SIGTERM, signal.SIGHUP})
"""Stop (SIGINT, SIGTERM) and reload (SIGHUP)."""
POLL_S = 0.02
"""How often :meth:`SignalFlag.wait` looks at its flag (s): the longest a stop waits to be
seen."""


def hold_daemon_signals() -> None:
    """Keep :data:`DAEMON_SIGNALS` pending until :func:`release_daemon_signals`."""
    signal.pthread_sigmask(signal.SIG_BLOCK, DAEMON_SIGNALS)


def release_daemon_signals() -> None:
    """Deliver the held signals, to the handlers installed by now."""
    signal.pthread_sigmask(signal.SIG_UNBLOCK, DAEMON_SIGNALS)


class SignalFlag:
    """A flag that a signal handler may set, and one thread (the control loop) waits on.

    A handler runs in the main thread between two bytecodes, possibly while that thread
    holds a lock. ``threading.Event.set`` takes the event's lock, so a handler that interrupts
    the main thread inside it, or inside another handler's ``set``, never gets it: a burst of
    SIGHUPs ended the daemon in ``RecursionError``. Here the flag is a plain attribute, and
    :meth:`wait` polls it every :data:`POLL_S` in ``time.sleep``, which a signal interrupts to
    run its handler. (A ``SimpleQueue.get(timeout)`` woken by ``set`` is no substitute: on
    CPython up to 3.12, a signal landing as its timeout runs out can leave it waiting forever,
    and the control loop with it.)
    """

    def __init__(self) -> None:
        self._set = False

    def set(self) -> None:
        """Set the flag; safe in a signal handler."""
        self._set = True

    def clear(self) -> None:
        """Clear the flag (the thread that acted on it)."""
        self._set = False

    def is_set(self) -> bool:
        """Whether the flag is set; any thread."""
        return self._set

    def wait(self, timeout_s: float) -> bool:
        """Wait until the flag is set, at most ``timeout_s`` (and at most :data:`POLL_S`
        after it is set); whether it is."""
        deadline = time.monotonic() + timeout_s
        while not self._set and (left := deadline - time.monotonic()) > 0:
            time.sleep(min(left, POLL_S))
        return self._set

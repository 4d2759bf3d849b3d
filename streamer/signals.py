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

import contextlib
import queue
import signal

__all__ = ["DAEMON_SIGNALS", "SignalFlag", "hold_daemon_signals", "release_daemon_signals"]

DAEMON_SIGNALS = frozenset({signal.SIGINT, signal.SIGTERM, signal.SIGHUP})
"""Stop (SIGINT, SIGTERM) and reload (SIGHUP)."""


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
    SIGHUPs ended the daemon in ``RecursionError``. Here nothing takes a lock: the flag is a
    plain attribute, and the wake-up a ``SimpleQueue.put``, which is reentrant (Python docs,
    ``queue.SimpleQueue.put``).
    """

    def __init__(self) -> None:
        self._set = False
        self._wake: queue.SimpleQueue[None] = queue.SimpleQueue()

    def set(self) -> None:
        """Set the flag and wake the waiter; safe in a signal handler."""
        self._set = True
        self._wake.put(None)

    def clear(self) -> None:
        """Clear the flag and forget the wake-ups queued so far (the waiting thread, once it
        acted on it)."""
        self._set = False
        with contextlib.suppress(queue.Empty):
            while True:
                self._wake.get_nowait()

    def is_set(self) -> bool:
        """Whether the flag is set; any thread."""
        return self._set

    def wait(self, timeout_s: float) -> bool:
        """Wait until the flag is set, at most ``timeout_s``; whether it is. One waiter."""
        if not self._set:
            with contextlib.suppress(queue.Empty):
                self._wake.get(timeout=timeout_s)
        return self._set

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

__all__ = ["DAEMON_SIGNALS", "hold_daemon_signals", "release_daemon_signals"]

DAEMON_SIGNALS = frozenset({signal.SIGINT, signal.SIGTERM, signal.SIGHUP})
"""Stop (SIGINT, SIGTERM) and reload (SIGHUP)."""


def hold_daemon_signals() -> None:
    """Keep :data:`DAEMON_SIGNALS` pending until :func:`release_daemon_signals`."""
    signal.pthread_sigmask(signal.SIG_BLOCK, DAEMON_SIGNALS)


def release_daemon_signals() -> None:
    """Deliver the held signals, to the handlers installed by now."""
    signal.pthread_sigmask(signal.SIG_UNBLOCK, DAEMON_SIGNALS)

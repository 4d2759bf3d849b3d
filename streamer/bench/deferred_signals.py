"""Cleanup that Ctrl-C or SIGTERM cannot cut short.

The benchmark's cleanup stops processes one after the other, each stop waiting for its
process to exit. A signal whose handler raises (SIGINT's KeyboardInterrupt, the CLI's
SIGTERM handler's SystemExit) in the middle of one stop would skip every stop after it and
leave those processes running, orphaned. Within :func:`signals_deferred` such a signal is
only noted; it takes effect once the cleanup is done.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator

__all__ = ["signals_deferred"]

_DEFERRED = (signal.SIGINT, signal.SIGTERM)


@contextlib.contextmanager
def signals_deferred() -> Iterator[None]:
    """Run the body with SIGINT and SIGTERM held back.

    Each one that arrives is noted instead of handled. On the way out the previous handlers
    are set again and the first signal noted is raised again
    (:func:`signal.raise_signal`), so its handler runs once the body is done: a
    KeyboardInterrupt or SystemExit then propagates from here, an ignored signal stays
    ignored and a default SIGTERM ends the process. Off the main thread, where Python cannot
    set handlers, the body runs as it is.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    noted: list[int] = []
    previous = {
        signum: signal.signal(signum, lambda received, _frame: noted.append(received))
        for signum in _DEFERRED
    }
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, signal.SIG_DFL if handler is None else handler)
        if noted:
            signal.raise_signal(noted[0])

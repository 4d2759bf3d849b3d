"""Cleanup that Ctrl-C or SIGTERM cannot cut short, and that a second one hurries.

The benchmark's cleanup stops processes one after the other, each stop waiting for its
process to exit. A signal whose handler raises (SIGINT's KeyboardInterrupt, the CLI's
SIGTERM handler's SystemExit) in the middle of one stop would skip every stop after it and
leave those processes running, orphaned. Within :func:`signals_deferred` such a signal is
only noted; it takes effect once the cleanup is done. A second one (Ctrl-C pressed again)
asks the stops to kill at once instead of waiting (:func:`hurry_requested`).
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator

__all__ = ["hurry_requested", "signals_deferred"]

_DEFERRED = (signal.SIGINT, signal.SIGTERM)


class _Deferrals:
    """The signals noted and not yet handed on, over nested :func:`signals_deferred`."""

    depth = 0
    pending = 0
    hurry = threading.Event()


def hurry_requested() -> bool:
    """Whether two or more signals came during the cleanup: a stop should kill what it
    stops at once rather than wait for it to exit."""
    return _Deferrals.hurry.is_set()


@contextlib.contextmanager
def signals_deferred() -> Iterator[None]:
    """Run the body with SIGINT and SIGTERM held back.

    Each one that arrives is noted instead of handled; from the second one on (counted over
    nested deferrals) :func:`hurry_requested` is true until the outermost one ends. On the
    way out the previous handlers are set again and the first signal noted is raised again
    (:func:`signal.raise_signal`), so its handler runs once the body is done: a
    KeyboardInterrupt or SystemExit then propagates from here, an ignored signal stays
    ignored and a default SIGTERM ends the process. Off the main thread, where Python cannot
    set handlers, the body runs as it is.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    noted: list[int] = []

    def note(received: int, _frame: object) -> None:
        noted.append(received)
        _Deferrals.pending += 1
        if _Deferrals.pending > 1:
            _Deferrals.hurry.set()

    previous = {signum: signal.signal(signum, note) for signum in _DEFERRED}
    _Deferrals.depth += 1
    try:
        yield
    finally:
        _Deferrals.depth -= 1
        _Deferrals.pending -= len(noted)  # the one raised again is noted by an outer deferral
        if not _Deferrals.depth:
            _Deferrals.hurry.clear()
        for signum, handler in previous.items():
            signal.signal(signum, signal.SIG_DFL if handler is None else handler)
        if noted:
            signal.raise_signal(noted[0])

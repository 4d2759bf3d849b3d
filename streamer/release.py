"""Releasing several resources on every exit path.

A release that fails (an ACL ``acl.mdl.unload`` returning an error, say) must neither leak
what is released after it nor hide why the daemon was stopping: :func:`close_all` calls
every close and raises the first failure at the end, and :func:`close_logged` turns a
failure into an ``error`` log line where an exception is already propagating or the
daemon must go on serving.

What cannot be released at all, work left running in native code (a model execution on a
hung device, a ``session.run`` that does not return), is recorded with :func:`abandon`: the
process must then end without finalising the interpreter (:func:`abandoned`), because a
thread that comes back from C++ code into a finalising interpreter is ended by a forced
unwind, which C++ catch-all handlers turn into ``std::terminate`` (SIGABRT, exit 134).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable
from typing import Any

import structlog

__all__ = ["abandon", "abandoned", "close_all", "close_logged"]

_log = structlog.get_logger(__name__)
_abandoned: list[tuple[str, Callable[[], bool]]] = []
_abandoned_lock = threading.Lock()


def close_all(closes: Iterable[Callable[[], Any]]) -> None:
    """Call every close in order, also after one raised.

    Raises:
        Exception: the first close's failure, once every close has returned.
    """
    failure: Exception | None = None
    for close in closes:
        try:
            close()
        except Exception as exc:  # the rest are still released; the first error is raised
            failure = failure or exc
    if failure is not None:
        raise failure


def close_logged(close: Callable[[], Any], what: str) -> bool:
    """Call ``close``; a failure is logged as ``release_failed`` (``what`` names the
    resource) instead of raised.

    Returns:
        True when it returned, False when it raised.
    """
    try:
        close()
    except Exception as exc:  # noqa: BLE001 - logged; the caller's own path goes on
        _log.error("release_failed", resource=what, error=f"{type(exc).__name__}: {exc}")
        return False
    return True


def abandon(what: str, running: Callable[[], bool] = lambda: True) -> None:
    """Record work left running in native code, described by ``what`` (e.g. the model and
    its thread): the process ends at once when the daemon exits (module docstring) if
    ``running()`` still says it runs then (by default, always: work on a hung device)."""
    with _abandoned_lock:
        _abandoned.append((what, running))


def abandoned() -> list[str]:
    """What :func:`abandon` recorded that still runs, in order: a run that came back since
    (a slow one, given up on at a reload's close) no longer keeps the exit from finalising."""
    with _abandoned_lock:
        return [what for what, running in _abandoned if running()]

"""``acl.util.start_thread`` / ``stop_thread``: raw pthreads (RT ``python/pyACL/util/thread.cpp``).

S22: ``start_thread(func, args)`` returns ``(pthread_t, errno)`` and runs ``func(args)`` on a
new thread that has no ACL context (S10); ``stop_thread`` is ``pthread_join``: it blocks until
``func`` returns and raises ``RuntimeError`` if ``func`` raised. An unknown id gives ``ESRCH``.
The threads are daemonic, like raw pthreads, which Python does not join at exit.
"""

from __future__ import annotations

import errno
import threading
from collections.abc import Callable
from typing import Any

__all__ = ["SimThreads"]


class _Started:
    def __init__(self, func: Callable[[Any], Any], args: Any, number: int) -> None:
        self.error: BaseException | None = None
        self._func = func
        self._args = args
        self.thread = threading.Thread(target=self._run, name=f"acl-thread-{number}", daemon=True)

    def _run(self) -> None:
        try:
            self._func(self._args)
        except BaseException as exc:  # noqa: BLE001 - reported by stop_thread, as pyACL does
            self.error = exc


class SimThreads:
    """Threads started by ``acl.util.start_thread`` and not joined yet; thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._threads: dict[int, _Started] = {}
        self._count = 0

    def start(self, func: Callable[[Any], Any], args: Any) -> tuple[int, int]:
        """Start ``func(args)``; returns ``(thread_id, 0)``.

        Raises:
            TypeError: ``func`` is not callable (pyACL: "parameter must be callable").
        """
        if not callable(func):
            raise TypeError("parameter must be callable")
        with self._lock:
            self._count += 1
            started = _Started(func, args, self._count)
        started.thread.start()
        assert started.thread.ident is not None
        with self._lock:
            self._threads[started.thread.ident] = started
        return started.thread.ident, 0

    def stop(self, thread_id: int) -> int:
        """Join the thread; returns 0, or ``ESRCH`` for an unknown id.

        Raises:
            RuntimeError: the thread's function raised.
        """
        with self._lock:
            started = self._threads.pop(thread_id, None)
        if started is None:
            return errno.ESRCH
        started.thread.join()
        if started.error is not None:
            kind = type(started.error).__name__
            raise RuntimeError(f"exception={kind},msg=thread call failed;") from started.error
        return 0

    def live(self) -> list[int]:
        """Ids of threads started and not stopped."""
        with self._lock:
            return list(self._threads)

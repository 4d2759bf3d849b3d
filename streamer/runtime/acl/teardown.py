"""Release ACL resources in reverse order of acquisition, on every exit path.

Each acquisition pushes its release right after it succeeds; :meth:`Teardown.close` (normal
path) or :meth:`Teardown.abort` (an exception is propagating, e.g. a start-up failure half way)
runs them newest first. A release that fails is logged and the others still run, so one stuck
resource never leaks the rest; ``close`` raises the first failure at the end, ``abort`` leaves
the original exception in charge.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator
from typing import Any

import structlog

from streamer.runtime.acl.errors import AclError, check_ret

__all__ = ["Teardown"]

_log = structlog.get_logger(__name__)


class Teardown:
    """A LIFO of releases; thread-safe, idempotent."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._releases: list[Callable[[], None]] = []
        self._failures: list[AclError] = []

    def push(self, api: str, fn: Callable[..., int], *args: Any) -> None:
        """Defer ``fn(*args)``, a call that returns an aclError code, e.g.
        ``push("acl.rt.free", acl.rt.free, ptr)``."""
        self.push_call(lambda: check_ret(fn(*args), api))

    def push_call(self, fn: Callable[[], None]) -> None:
        """Defer a Python callable that may raise :class:`AclError`."""
        with self._lock:
            self._releases.append(fn)

    def release(self, api: str, fn: Callable[..., int], *args: Any) -> None:
        """Call a release now, recording (not raising) its failure; for use inside a callable
        given to :meth:`push_call` that releases several things."""
        self._run(lambda: check_ret(fn(*args), api))

    @contextlib.contextmanager
    def on_error(self) -> Iterator[None]:
        """Run the body; if it raises, :meth:`abort` and re-raise."""
        try:
            yield
        except BaseException:
            self.abort()
            raise

    def close(self) -> None:
        """Run every release, newest first.

        Raises:
            AclError: the first release that failed (after all of them ran).
        """
        failures = self._unwind()
        if failures:
            raise failures[0]

    def abort(self) -> None:
        """Run every release, newest first, only logging failures."""
        self._unwind()

    def discard(self) -> int:
        """Drop every release without running it (what they release is still in use by the
        device, and the device reset at process exit reclaims it); how many were dropped."""
        with self._lock:
            dropped, self._releases = len(self._releases), []
        return dropped

    def _unwind(self) -> list[AclError]:
        while True:
            with self._lock:
                if not self._releases:
                    failures, self._failures = self._failures, []
                    return failures
                release = self._releases.pop()
            self._run(release)

    def _run(self, release: Callable[[], None]) -> None:
        try:
            release()
        except AclError as err:
            _log.error("acl_release_failed", api=err.api, code=err.code, name=err.name)
            with self._lock:
                self._failures.append(err)

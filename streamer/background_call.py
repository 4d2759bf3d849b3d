"""One call on a daemon thread of its own, which the caller waits for in slices.

A call that blocks in native code (a config file or a model on a hung network mount, a FIFO
that nobody writes) cannot be cancelled, and while the main thread is inside it Python runs
no signal handler: a SIGTERM or a Ctrl-C would wait for it without end. Run on a thread, it
blocks only that thread; the main thread waits in slices, acts on a stop meanwhile, and may
give the call up. The thread is a daemon thread, so one given up on never holds up the exit.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Generic, TypeVar

__all__ = ["BackgroundCall"]

T = TypeVar("T")


class BackgroundCall(Generic[T]):
    """``call()`` on a daemon thread named ``name``, started at once.

    Args:
        call: what to run; its return value or exception is kept for :meth:`result`.
        name: the thread's name (logs, py-spy, ``exit_forced``).

    Attributes:
        started_s: when the call started, s (monotonic clock).
    """

    def __init__(self, call: Callable[[], T], name: str) -> None:
        self.started_s = time.monotonic()
        self._call = call
        self._done = threading.Event()
        self._value: T | None = None
        self._error: BaseException | None = None
        threading.Thread(target=self._run, name=name, daemon=True).start()

    def wait(self, timeout_s: float) -> bool:
        """Wait at most ``timeout_s`` for the call to end; whether it has."""
        return self._done.wait(timeout_s)

    def result(self) -> T:
        """What the call returned; only once it ended.

        Raises:
            BaseException: what the call raised.
            RuntimeError: the call has not ended.
        """
        if not self._done.is_set():
            raise RuntimeError("the call is still running")
        if self._error is not None:
            raise self._error
        return self._value  # type: ignore[return-value]

    def _run(self) -> None:
        try:
            self._value = self._call()
        except BaseException as exc:  # noqa: BLE001 - handed to the waiting thread
            self._error = exc
        finally:
            self._done.set()

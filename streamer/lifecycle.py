"""One lifecycle shape for every pipeline thread.

A :class:`Worker` is a named, non-daemon thread that sets itself up (binds its sockets,
attaches its ACL context) *inside* the thread, then reports ready. :meth:`Worker.launch`
returns once the thread is ready and raises the thread's own set-up error otherwise, so a
port already in use fails the start of the daemon with a clear message instead of a hang.
"""

from __future__ import annotations

import abc
import threading
from enum import Enum
from types import TracebackType
from typing import Any, TypeVar

from streamer.errors import StreamerError

__all__ = ["Closing", "Status", "Worker"]


_C = TypeVar("_C", bound="Closing")


class Closing(abc.ABC):
    """Base: ``with obj:`` calls ``obj.close()`` on the way out, on every exit path."""

    @abc.abstractmethod
    def close(self) -> Any:
        """Release what the object holds; idempotent."""

    def __enter__(self: _C) -> _C:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


class Status(str, Enum):
    """Lifecycle states, reported by health checks and logs."""

    INITIALIZING = "initializing"
    STARTING = "starting"
    RUNNING = "running"
    STOPPING = "stopping"
    STOPPED = "stopped"


class Worker(threading.Thread, metaclass=abc.ABCMeta):
    """Base class: subclasses implement :meth:`setup`, :meth:`loop` and :meth:`teardown`.

    ``teardown`` runs on every exit path, after ``setup`` started (also when ``setup`` or
    ``loop`` raised). An exception escaping ``loop`` is kept in :attr:`failure` for the owner
    (the pipeline), never lost.
    """

    def __init__(self, name: str) -> None:
        super().__init__(name=name, daemon=False)
        self._ready = threading.Event()
        self.failure: BaseException | None = None

    def setup(self) -> None:
        """Create what this thread owns (sockets, context binding)."""

    @abc.abstractmethod
    def loop(self) -> None:
        """The thread's work; returns when the thread should end."""

    def teardown(self) -> None:
        """Release what :meth:`setup` created; must not raise."""

    def run(self) -> None:
        try:
            self.setup()
            self._ready.set()
            self.loop()
        except BaseException as exc:  # kept for the owner, re-raised in launch()/join_checked()
            self.failure = exc
        finally:
            self._ready.set()
            self.teardown()

    def launch(self, timeout_s: float) -> None:
        """Start the thread and wait until it is ready.

        Raises:
            StreamerError: the thread failed its set-up (the cause is chained) or was not
                ready within ``timeout_s`` seconds.
        """
        self.start()
        if not self._ready.wait(timeout_s):
            raise StreamerError(f"thread {self.name} not ready after {timeout_s} s")
        if self.failure is not None:
            raise StreamerError(f"thread {self.name} failed to start: {self.failure}") from (
                self.failure
            )

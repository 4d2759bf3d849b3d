"""CPU and wall time of a piece of work, per frame.

CPU time is the calling thread's (``time.thread_time_ns``) for work done on that thread, or
the process's (``time.process_time_ns``: every thread) for work a library hands to threads
of its own (onnxruntime's intra-op pool, the ACL simulator's device); wall time is
``time.monotonic_ns``.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

__all__ = ["Cost", "Stopwatch"]


@dataclass(frozen=True)
class Cost:
    """Time spent on some frames.

    Attributes:
        cpu_ms: process CPU time per frame, ms.
        wall_ms: wall time per frame, ms.
        frames: how many frames the averages are over.
    """

    cpu_ms: float
    wall_ms: float
    frames: int


class Stopwatch:
    """Adds up the CPU and wall time of the ``with`` blocks it times, and the frames in them.

    Use it from one thread::

        watch = Stopwatch(time.thread_time_ns)
        with watch.timing(frames=16):
            work()
        watch.cost().cpu_ms

    Args:
        cpu_clock: ``time.thread_time_ns`` for work on the calling thread, or
            ``time.process_time_ns`` (the default) for work that other threads do too; with
            the latter nothing else may be busy in the process.
    """

    def __init__(self, cpu_clock: Callable[[], int] = time.process_time_ns) -> None:
        self.cpu_clock = cpu_clock
        self._cpu_ns = 0
        self._wall_ns = 0
        self._frames = 0

    def timing(self, frames: int) -> _Lap:
        """A context manager that times its block as ``frames`` frames of work."""
        return _Lap(self, frames)

    def add(self, cpu_ns: int, wall_ns: int, frames: int) -> None:
        """Count ``frames`` frames that took ``cpu_ns`` and ``wall_ns`` nanoseconds."""
        self._cpu_ns += cpu_ns
        self._wall_ns += wall_ns
        self._frames += frames

    def cost(self) -> Cost:
        """The per-frame averages so far (zeros before the first frame)."""
        frames = max(self._frames, 1)
        return Cost(self._cpu_ns / frames / 1e6, self._wall_ns / frames / 1e6, self._frames)


class _Lap:
    """One timed block of a :class:`Stopwatch`."""

    def __init__(self, watch: Stopwatch, frames: int) -> None:
        self._watch = watch
        self._frames = frames
        self._cpu_ns = self._wall_ns = 0

    def __enter__(self) -> None:
        self._cpu_ns = self._watch.cpu_clock()
        self._wall_ns = time.monotonic_ns()

    def __exit__(self, *exc_info: object) -> None:
        cpu_ns = self._watch.cpu_clock() - self._cpu_ns
        self._watch.add(cpu_ns, time.monotonic_ns() - self._wall_ns, self._frames)

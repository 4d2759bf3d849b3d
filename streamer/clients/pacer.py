"""A fixed-rate schedule for senders: ``--fps`` of the producer and the benchmark's feeds."""

from __future__ import annotations

import math
import time

__all__ = ["MIN_FPS", "Pacer"]

MIN_FPS = 0.001
"""The slowest pace (frames per second): a frame every 1000 s. A slower one is refused: its
period overflows ``time.sleep`` (near 1e-10 fps) or even a float (1e-300)."""


class Pacer:
    """Spaces :meth:`wait` returns ``1 / fps`` s apart on a fixed monotonic schedule.

    Slot *i* is ``first call + i / fps``, so sleep overshoot does not accumulate (no drift);
    a caller that falls behind gets its late slots at once until it is back on schedule.

    Args:
        fps: frames per second, at least :data:`MIN_FPS`; None or 0 means no pacing.

    Raises:
        ValueError: ``fps`` is negative, below :data:`MIN_FPS` but not 0, infinite or NaN.
    """

    def __init__(self, fps: float | None) -> None:
        if fps is not None and not (math.isfinite(fps) and (fps == 0 or fps >= MIN_FPS)):
            raise ValueError(f"fps must be finite and 0 or >= {MIN_FPS}, got {fps}")
        self._period_ns = round(1e9 / fps) if fps else 0
        self._next_ns = 0

    def wait(self) -> None:
        """Sleep until the next slot (returns at once on the first call)."""
        if not self._period_ns:
            return
        now = time.monotonic_ns()
        if not self._next_ns:
            self._next_ns = now
        elif self._next_ns > now:
            time.sleep((self._next_ns - now) / 1e9)
        self._next_ns += self._period_ns

"""A fixed-rate schedule for senders: ``--fps`` of the producer and the benchmark's feeds."""

from __future__ import annotations

import math
import time

__all__ = ["Pacer"]


class Pacer:
    """Spaces :meth:`wait` returns ``1 / fps`` s apart on a fixed monotonic schedule.

    Slot *i* is ``first call + i / fps``, so sleep overshoot does not accumulate (no drift);
    a caller that falls behind gets its late slots at once until it is back on schedule.

    Args:
        fps: frames per second; None or 0 means no pacing.

    Raises:
        ValueError: ``fps`` is negative, infinite or NaN.
    """

    def __init__(self, fps: float | None) -> None:
        if fps is not None and not (math.isfinite(fps) and fps >= 0):
            raise ValueError(f"fps must be finite and >= 0, got {fps}")
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

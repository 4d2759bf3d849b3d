"""The inbox of a stage's batcher: a FIFO whose one consumer wakes when it has a batch's worth.

A batcher that woke for every frame would cost a thread switch and a GIL hand-off per frame
(tens of microseconds of CPU each on a loaded 2-core machine, measured by ``streamer bench``
as the "batching" stage). Instead it says how many frames it still needs to fill a batch, and
:meth:`Mailbox.take` returns once that many are queued, a marker is, or its deadline passed:
about one wake per batch. A take ends at the first marker, so a consumer that returns at
STOP leaves what came after it queued.
"""

from __future__ import annotations

import collections
import threading
import time
from typing import Any

from streamer.frames import Frame

__all__ = ["Mailbox"]


class Mailbox:
    """Items of one stage in arrival order: :meth:`put` from any thread, :meth:`take` from
    its one consumer (the batcher). A *marker* is any item that is not a :class:`Frame` (end
    of stream, stop, a batch for a ``tensor`` stage): it wakes the consumer at once."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._ready = threading.Condition(self._lock)
        self._items: collections.deque[Any] = collections.deque()
        self._markers = 0
        self._wanted = 1

    def put(self, item: Any) -> None:
        """Queue ``item`` behind everything queued."""
        with self._ready:
            self._push(item)

    def take(self, wanted: int, timeout: float, limit: int | None = None) -> list[Any]:
        """What is queued, in order, up to and including the first marker and at most
        ``limit`` items (None: no limit), once ``wanted`` items (at least 1) or a marker are
        queued or ``timeout`` seconds passed; possibly nothing.

        What is behind a marker stays for the next take: behind a reload's STOP wait the
        frames prepared for the new chain, whose batcher takes them once the old one has
        returned at STOP. What is beyond ``limit`` stays too: the batcher takes a batch's
        worth, so frames it could not dispatch yet stay where admission's full policies can
        still drop them.
        """
        deadline = time.monotonic() + timeout
        with self._ready:
            self._wanted = max(1, wanted)
            while not self._markers and len(self._items) < self._wanted:
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                self._ready.wait(left)
            self._wanted = 1
            items = self._pop(limit)
            self._taken(items)
        return items

    def _pop(self, limit: int | None) -> list[Any]:
        """Under the lock: remove and return the queued items up to and including the first
        marker, at most ``limit`` of them."""
        if not self._markers and (limit is None or len(self._items) <= limit):
            items = list(self._items)
            self._items.clear()
            return items
        items = []
        while self._items and (limit is None or len(items) < limit):
            item = self._items.popleft()
            items.append(item)
            if not isinstance(item, Frame):
                self._markers -= 1
                break
        return items

    def qsize(self) -> int:
        """Items queued now (a gauge)."""
        return len(self._items)

    def _push(self, item: Any) -> None:
        """Append under the lock; wake the consumer if it now has what it waits for."""
        self._items.append(item)
        if not isinstance(item, Frame):
            self._markers += 1
        if self._markers or len(self._items) >= self._wanted:
            self._ready.notify()

    def _taken(self, items: list[Any]) -> None:
        """Under the lock, after ``items`` left the queue (bookkeeping of subclasses)."""

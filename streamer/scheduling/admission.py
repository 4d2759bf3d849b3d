"""Admission: the bounded queue between the ingresses and the batcher, and its full policies.

Every item an ingress receives is offered here. A frame that names its source is first
checked against the source's stream and given its place in it
(:class:`~streamer.scheduling.sources.SourceTracker`), failed frames included, so that egress
publishes their error results in order too; then the decode and preprocessing of a good
frame start on the worker pool, and the frame is queued in arrival order. What happens when
the queue is full is the ingress's ``on_full`` policy:

- ``block``: the ingress waits, stops reading its socket, and ZeroMQ's high-water marks push
  back on the producers; nothing is dropped.
- ``drop_oldest``: the oldest queued frame is dropped (``queue_full``).
- ``latest``: a queued frame of the same source is replaced by the new one (``superseded``),
  so each source holds at most one frame: live cameras get their freshest picture; beyond
  that the oldest frame is dropped (``queue_full``).

Dropped frames have their pending preprocessing cancelled, are counted with their reason and
are reported to ``on_drop`` (egress's reorder buffer, so the source's stream does not wait for
them). Markers (end-of-stream, stop, model swap) are never dropped nor held back by capacity.
"""

from __future__ import annotations

import collections
import queue
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

from streamer.config import FullPolicy
from streamer.errors import Reason
from streamer.frames import EndOfStream, Frame, OutcomeCounts
from streamer.scheduling.sources import SourceTracker

__all__ = ["AdmissionQueue"]
_POLL_S = 0.1


class AdmissionQueue:
    """Ingress → batcher queue. ``offer`` from any ingress thread, ``get`` from the batcher.

    Args:
        capacity: frames queued at most (markers do not count).
        tracker: per-source seq checks and arrival order.
        prepare: starts decode+preprocessing of a frame on the worker pool; called under
            the queue's lock, so it must not block.
        counts: outcome counters (drops are counted here).
        on_drop: told about every frame dropped here.
        abort: set when the pipeline gives up; a blocked ``offer`` then returns.
    """

    def __init__(
        self,
        capacity: int,
        tracker: SourceTracker,
        prepare: Callable[[Frame], Future[Frame]],
        counts: OutcomeCounts,
        on_drop: Callable[[Frame], None],
        abort: threading.Event,
    ) -> None:
        self._capacity = capacity
        self._tracker = tracker
        self._prepare = prepare
        self._counts = counts
        self._on_drop = on_drop
        self._abort = abort
        self._items: collections.deque[Any] = collections.deque()
        self._frames = 0
        self._newest: dict[str, Frame] = {}
        # Two conditions on one lock, so a pop wakes only a blocked ingress and an append only
        # the batcher; a blocked ingress resumes once a quarter of the queue is free, not at
        # every pop, so a full queue does not cost two thread switches per frame.
        lock = threading.Lock()
        self._not_empty = threading.Condition(lock)
        self._not_full = threading.Condition(lock)
        self._resume_at = capacity - max(1, capacity // 4)
        self._blocked = 0

    def offer(self, item: Frame | EndOfStream, policy: FullPolicy) -> None:
        """Admit one received item under ``policy`` (see the module docstring)."""
        if isinstance(item, EndOfStream):
            self._tracker.end(item)
            self.put_marker(item)
            return
        if item.source and item.seq >= 0 and not self._tracker.admit(item):
            self._counts.dropped(Reason.STALE_SEQ)
            return
        with self._not_full:
            if policy == "block" and not self._wait_for_room():
                self._drop(item, Reason.SHUTDOWN)
                return
            if policy == "latest":
                self._supersede(item)
            while self._frames >= self._capacity:
                self._drop_oldest()
            # Started under the lock, right before the frame takes its place: a marker queued
            # with a switch (a reload) cannot come between the two.
            if item.error is None:
                item.pending = self._prepare(item)
            self._append(item)

    def put_marker(self, item: Any, switch: Callable[[], None] | None = None) -> None:
        """Queue a marker (end-of-stream, stop) behind everything already queued.

        Args:
            item: the marker.
            switch: called under the queue's lock right before the marker is queued, so that
                every frame queued before the marker was prepared before ``switch`` ran and
                every frame after it after (a reload switches the chain frames are prepared
                for).
        """
        with self._not_empty:
            if switch is not None:
                switch()
            self._items.append(item)
            self._not_empty.notify()

    def get(self, timeout: float | None = None) -> Any:
        """The oldest item, waiting up to ``timeout`` s.

        Raises:
            queue.Empty: nothing arrived in time.
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._not_empty:
            while not self._items:
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    raise queue.Empty
                self._not_empty.wait(left)
            return self._pop()

    def get_nowait(self) -> Any:
        """The oldest item if one is queued.

        Raises:
            queue.Empty: nothing is queued.
        """
        with self._not_empty:
            if not self._items:
                raise queue.Empty
            return self._pop()

    def qsize(self) -> int:
        """Frames queued now (a gauge)."""
        return self._frames

    def _wait_for_room(self) -> bool:
        if self._frames < self._capacity:
            return True
        self._blocked += 1
        try:
            while self._frames > self._resume_at:
                if self._abort.is_set():
                    return False
                self._not_full.wait(_POLL_S)
        finally:
            self._blocked -= 1
        return True

    def _append(self, frame: Frame) -> None:
        self._items.append(frame)
        self._frames += 1
        self._newest[frame.source] = frame
        self._not_empty.notify()

    def _pop(self) -> Any:
        item = self._items.popleft()
        if isinstance(item, Frame):
            self._frames -= 1
            if self._newest.get(item.source) is item:
                del self._newest[item.source]
            if self._blocked and self._frames <= self._resume_at:
                self._not_full.notify_all()
        return item

    def _supersede(self, frame: Frame) -> None:
        older = self._newest.get(frame.source)
        if older is not None:
            self._items.remove(older)
            self._frames -= 1
            self._drop(older, Reason.SUPERSEDED)

    def _drop_oldest(self) -> None:
        for index, item in enumerate(self._items):
            if isinstance(item, Frame):
                del self._items[index]
                self._frames -= 1
                if self._newest.get(item.source) is item:
                    del self._newest[item.source]
                self._drop(item, Reason.QUEUE_FULL)
                return

    def _drop(self, frame: Frame, reason: str) -> None:
        if frame.pending is not None:
            frame.pending.cancel()
        frame.release()
        self._counts.dropped(reason)
        self._on_drop(frame)

"""Admission: the bounded queue between the ingresses and the batcher, and its full policies.

Every item an ingress receives is offered here. A frame that names its source is first
checked against the source's stream and given its place in it
(:class:`~streamer.scheduling.sources.SourceTracker`), failed frames included, so that egress
publishes their error results in order too (a frame of a new source beyond
``daemon.max_sources`` fails there, ``too_many_sources``, with no place: it is queued as any
failed frame, and a ``rep`` or ``router`` ingress's reply says so); then a good frame is
prepared for the chain's first stage (small raw frames at once, the rest on the worker pool:
the pipeline decides), and it is queued in arrival order. The batcher takes what is queued
in bulk (:class:`~streamer.scheduling.mailbox.Mailbox`). What happens when the queue is full
is the ingress's ``on_full`` policy:

- ``block``: the ingress waits, stops reading its socket, and ZeroMQ's high-water marks push
  back on the producers; nothing is dropped.
- ``drop_oldest``: the oldest queued frame not yet being prepared is dropped
  (``queue_full``); the oldest of all when every one is.
- ``latest``: a queued frame of the same source not yet being prepared is replaced by the
  new one (``superseded``), so each source holds at most one frame being prepared and one
  waiting, its newest: live cameras get their freshest picture but one; beyond that frames
  are dropped as under ``drop_oldest`` (``queue_full``).

Preparing a frame (decoding a JPEG) costs more than receiving it, and a frame dropped after
its preparation began has cost it in vain: under sustained overload that cut what the two
policies published by up to 45 % against ``block``. So their frames are prepared lazily:
at most ``prepare_ahead`` of them (two batches and two per decode worker, at most half the
queue) are prepared ahead of the batcher, a ``latest`` source's one at a time; the others
wait in the queue as received, where dropping them costs nothing, and start as the batcher
takes frames (a frame the batcher takes unprepared starts then, on the worker pool). At a
reload's switch the waiting frames are prepared for the old chain and leave the window: they
are the first dropped while it drains. ``block`` frames, which are never dropped, are
prepared as they are admitted.

The policies share one queue, and each applies to its own ingress's frames: a frame that came
in under ``block`` is never dropped to make room for another ingress's; when only such frames
are queued, a ``drop_oldest`` or ``latest`` frame is dropped itself (``queue_full``). A frame
that failed on arrival (``bad_header``, ``too_large``, ``too_many_sources``, ...) is kept the
same way under every policy, neither dropped to make room nor superseded: it costs no
preparation, and its error result is published (a ``rep`` or ``router`` reply has already
told its sender it was refused, not dropped); it is dropped only at once, when the queue is
full of kept frames.

Dropped frames have their pending preprocessing cancelled, are counted with their reason and
are reported to ``on_drop`` (egress's reorder buffer, so the source's stream does not wait for
them). Markers (end-of-stream, stop, model swap) are never dropped nor held back by capacity.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any, Protocol

from streamer.config import FullPolicy
from streamer.errors import FrameError, Reason
from streamer.frames import EndOfStream, Frame, OutcomeCounts
from streamer.scheduling.mailbox import Mailbox
from streamer.scheduling.sources import SourceTracker

__all__ = ["AdmissionQueue", "Prepare"]
_POLL_S = 0.1


class Prepare(Protocol):
    """Prepares a frame for the chain's first stage, at once on the calling thread (None) or
    on the worker pool (its future); ``inline=False`` asks for the pool."""

    def __call__(self, frame: Frame, *, inline: bool = True) -> Future[Frame] | None: ...


class AdmissionQueue(Mailbox):
    """Ingress → batcher queue: ``offer`` from any ingress thread, :meth:`Mailbox.take` from
    the batcher.

    Args:
        capacity: frames queued at most (markers do not count).
        tracker: per-source seq checks and arrival order.
        prepare: prepares a frame for the chain's first stage, or starts that on the worker
            pool and returns its future; called on the offering thread outside the queue's
            lock, never while a reload switches the chain; for a frame prepared lazily,
            with ``inline=False`` under the lock, for the chain the frame is queued for.
        counts: outcome counters (drops are counted here).
        on_drop: told about every frame dropped here.
        abort: set when the pipeline gives up; a blocked ``offer`` then returns.
        prepare_ahead: ``drop_oldest`` and ``latest`` frames prepared (or being prepared)
            ahead of the batcher at most; the rest wait unprepared (module docstring).
    """

    def __init__(
        self,
        capacity: int,
        tracker: SourceTracker,
        prepare: Prepare,
        counts: OutcomeCounts,
        on_drop: Callable[[Frame], None],
        abort: threading.Event,
        prepare_ahead: int = 16,
    ) -> None:
        super().__init__()
        self._capacity = capacity
        self._tracker = tracker
        self._prepare = prepare
        self._counts = counts
        self._on_drop = on_drop
        self._abort = abort
        self._frames = 0
        self._newest: dict[str, Frame] = {}
        # A second condition on the mailbox's lock, so a take wakes only a blocked ingress; a
        # blocked ingress resumes once a quarter of the queue is free, not at every take, so
        # a full queue does not cost two thread switches per frame.
        self._not_full = threading.Condition(self._lock)
        self._resume_at = capacity - max(1, capacity // 4)
        self._blocked = 0
        # Preparations under way outside the lock, and whether a reload's switch waits for
        # them (new ones wait for the switch meanwhile).
        self._prepared = threading.Condition(self._lock)
        self._preparing = 0
        self._switching = False
        self._reserved = 0  # places of block frames being prepared
        self._kept: set[Frame] = set()  # queued frames never dropped: block ones, failed ones
        self._prepare_ahead = 1
        self.prepare_ahead = prepare_ahead
        self._started: dict[Frame, FullPolicy] = {}  # drop_oldest / latest, preparation began
        self._started_of: Counter[str] = Counter()  # those of each latest source
        self._waiting: dict[Frame, FullPolicy] = {}  # queued unprepared, in no set above

    def offer(self, item: Frame | EndOfStream, policy: FullPolicy) -> str | None:
        """Admit one received item under ``policy`` (see the module docstring).

        A good frame is prepared outside the queue's lock, so that several ingresses
        prepare at once and the batcher never waits on a letterbox to take its batch. Under
        ``block`` its place is reserved before, once there is room: a reload's switch of
        the chain waits for the preparations under way (:meth:`put_marker`), which thus
        never wait for the chain to take frames.

        Returns:
            The reason ``item`` itself was dropped at once (``stale_seq``, ``shutdown``,
            ``queue_full``: counted, no result follows), for a ``rep`` or ``router``
            ingress's reply; None when it was queued, or is a marker.
        """
        if isinstance(item, EndOfStream):
            self._tracker.end(item)
            self.put_marker(item)
            return None
        if item.source and item.seq >= 0 and not self._tracker.admit(item):
            self._counts.dropped(Reason.STALE_SEQ)
            return Reason.STALE_SEQ
        reserve = policy == "block"
        with self._not_full:
            if not self._ready_to_prepare(reserve):
                self._drop(item, Reason.SHUTDOWN)
                return Reason.SHUTDOWN
            if item.error is not None:
                return self._queue(item, policy)
            if not reserve:
                if not self._may_start(item, policy):
                    return self._queue(item, policy, waiting=True)
                self._mark_started(item, policy)
            self._preparing += 1
            self._reserved += reserve
        try:
            item.pending = self._prepare(item)
        except Exception as exc:  # e.g. the worker pool shut down: this frame fails alone
            item.fail(FrameError(Reason.PREPROCESS_FAILED, f"{type(exc).__name__}: {exc}"))
        finally:
            with self._lock:
                self._end_preparing(reserve)
                dropped = self._queue(item, policy)
        return dropped

    def put(self, item: Any) -> None:
        """Queue a marker; frames come in through :meth:`offer` only.

        Raises:
            TypeError: ``item`` is a frame.
        """
        if isinstance(item, Frame):
            raise TypeError("frames are admitted with offer(), not put()")
        self.put_marker(item)

    def put_marker(self, item: Any, switch: Callable[[], None] | None = None) -> None:
        """Queue a marker (end-of-stream, stop) behind everything already queued.

        Args:
            item: the marker.
            switch: called under the queue's lock right before the marker is queued, once
                the preparations under way are queued (new ones wait for it): every frame
                queued before the marker was prepared before ``switch`` ran and every frame
                after it after (a reload switches the chain frames are prepared for).
        """
        with self._ready:
            if switch is not None:
                self._switching = True
                while self._preparing:
                    self._prepared.wait()
                for frame in list(self._waiting):  # queued for the chain switched away from
                    self._start(frame)
                    self._unmark(frame)  # not in the window: dropped first, as before
                switch()
                self._switching = False
                self._prepared.notify_all()
            self._push(item)

    def discard_through(self, marker: Any, reason: str) -> int:
        """Remove ``marker`` and drop the frames queued before it, counted with ``reason``;
        other markers before it stay, in order. Nothing happens if ``marker`` is not queued.

        For a reload whose old chain was given up before its batcher took its STOP: the
        frames before that STOP were prepared for the old chain and cannot run on the new
        one, and the STOP would stop the new chain's batcher.

        Returns:
            The number of frames dropped.
        """
        with self._ready:
            if not any(item is marker for item in self._items):
                return 0
            kept: list[Any] = []
            dropped = 0
            while (item := self._items.popleft()) is not marker:
                if isinstance(item, Frame):
                    self._forget(item)
                    self._drop(item, reason)
                    dropped += 1
                else:
                    kept.append(item)
            self._markers -= 1
            self._items.extendleft(reversed(kept))
            self._taken([])  # wakes a blocked ingress if there is room now
        return dropped

    def qsize(self) -> int:
        """Frames queued now (a gauge)."""
        return self._frames

    def _queue(self, frame: Frame, policy: FullPolicy, waiting: bool = False) -> str | None:
        """Under the lock: queue ``frame``, making room under ``policy`` (``block`` made it
        before, unless other ingresses' frames took it: one of those is dropped); the reason
        ``frame`` itself was dropped instead, if it was. A ``waiting`` frame is queued
        unprepared, to be started by :meth:`_start_due`."""
        if policy == "latest":
            self._supersede(frame)
        while self._frames >= self._capacity:
            if self._drop_oldest():
                continue
            if policy == "block":
                break  # over capacity by this frame, rather than drop a block frame
            self._drop(frame, Reason.QUEUE_FULL)
            return Reason.QUEUE_FULL
        self._frames += 1
        self._newest[frame.source] = frame
        if policy == "block" or frame.error is not None:
            self._kept.add(frame)
        elif waiting:
            self._waiting[frame] = policy
        self._push(frame)
        self._start_due()
        return None

    def _ready_to_prepare(self, block: bool) -> bool:
        """Under the lock: wait until no switch of the chain is under way and, for
        ``block``, there is room for one more frame; False if the pipeline gave up."""
        while True:
            if block and not self._wait_for_room():
                return False
            if not self._switching:
                return True
            self._prepared.wait(_POLL_S)

    def _end_preparing(self, reserved: bool) -> None:
        """Under the lock: a preparation is over (its frame is queued next)."""
        self._preparing -= 1
        self._reserved -= reserved
        if self._switching and not self._preparing:
            self._prepared.notify_all()

    def _wait_for_room(self) -> bool:
        """Under the lock: room for one more frame, counting reserved places; False if the
        pipeline gave up first."""
        if self._frames + self._reserved < self._capacity:
            return True
        self._blocked += 1
        try:
            while self._frames + self._reserved > self._resume_at:
                if self._abort.is_set():
                    return False
                self._not_full.wait(_POLL_S)
        finally:
            self._blocked -= 1
        return True

    def _taken(self, items: list[Any]) -> None:
        for item in items:
            if isinstance(item, Frame):
                if item in self._waiting:
                    self._start(item)  # the batcher waits for it
                self._forget(item)
        self._start_due()
        if self._blocked and self._frames + self._reserved <= self._resume_at:
            self._not_full.notify_all()

    def _forget(self, frame: Frame) -> None:
        """Under the lock: ``frame`` left the queue."""
        self._frames -= 1
        self._kept.discard(frame)
        self._unmark(frame)
        if self._newest.get(frame.source) is frame:
            del self._newest[frame.source]

    @property
    def prepare_ahead(self) -> int:
        """``drop_oldest`` / ``latest`` frames prepared ahead of the batcher at most: as
        asked, but at most half the queue, so that the other half can wait unprepared."""
        return self._prepare_ahead

    @prepare_ahead.setter
    def prepare_ahead(self, frames: int) -> None:  # under the lock (a reload's switch)
        self._prepare_ahead = max(1, min(frames, self._capacity // 2))

    def _may_start(self, frame: Frame, policy: FullPolicy) -> bool:
        """Under the lock: whether a ``drop_oldest`` / ``latest`` frame may be prepared now
        (room in ``prepare_ahead``; for ``latest``, none of its source's being prepared)."""
        if len(self._started) >= self.prepare_ahead:
            return False
        return policy != "latest" or not self._started_of[frame.source]

    def _mark_started(self, frame: Frame, policy: FullPolicy) -> None:
        self._started[frame] = policy
        if policy == "latest":
            self._started_of[frame.source] += 1

    def _unmark(self, frame: Frame) -> None:
        """Under the lock: ``frame`` is no longer queued, nor about to be."""
        self._waiting.pop(frame, None)
        if self._started.pop(frame, None) == "latest":
            self._started_of[frame.source] -= 1
            if not self._started_of[frame.source]:
                del self._started_of[frame.source]

    def _start_due(self) -> None:
        """Under the lock: prepare the oldest waiting frames that may start now. ``_waiting``
        is in queue order, and all but ``prepare_ahead`` of its frames can start when there is
        room (a ``latest`` source with a frame being prepared has one waiting at most), so this
        reads a few of them, however long the queue."""
        room = self.prepare_ahead - len(self._started)
        due: list[Frame] = []
        latest: set[str] = set()  # latest sources given a frame in this pass
        for frame, policy in self._waiting.items():
            if len(due) >= room:
                break
            if policy == "latest" and (self._started_of[frame.source] or frame.source in latest):
                continue
            due.append(frame)
            if policy == "latest":
                latest.add(frame.source)
        for frame in due:
            self._start(frame)

    def _start(self, frame: Frame) -> None:
        """Under the lock: prepare a waiting frame on the worker pool (for the chain it is
        queued for: no switch happens meanwhile); a preparation that cannot start fails the
        frame alone."""
        self._mark_started(frame, self._waiting.pop(frame))
        try:
            frame.pending = self._prepare(frame, inline=False)
        except Exception as exc:  # e.g. the worker pool shut down
            frame.fail(FrameError(Reason.PREPROCESS_FAILED, f"{type(exc).__name__}: {exc}"))

    def _supersede(self, frame: Frame) -> None:
        """Under the lock: drop the queued frame of ``frame``'s source, unless it is being
        prepared in the window (its work is not thrown away)."""
        older = self._newest.get(frame.source)
        if older is not None and older not in self._kept and older not in self._started:
            self._items.remove(older)
            self._forget(older)
            self._drop(older, Reason.SUPERSEDED)

    def _drop_oldest(self) -> bool:
        """Drop the oldest queued frame that is not kept (came in under ``block``, or failed),
        one outside the window of frames being prepared first; False if there is none."""
        oldest = self._oldest_droppable()
        if oldest is None:
            return False
        self._items.remove(oldest)
        self._forget(oldest)
        self._drop(oldest, Reason.QUEUE_FULL)
        return True

    def _oldest_droppable(self) -> Frame | None:
        """Under the lock, in one pass from the head (it stops at the first frame outside the
        window): the oldest frame not kept outside the window, else the oldest one."""
        first: Frame | None = None
        for item in self._items:
            if isinstance(item, Frame) and item not in self._kept:
                if item not in self._started:
                    return item
                first = first or item
        return first

    def _drop(self, frame: Frame, reason: str) -> None:
        self._unmark(frame)
        if frame.pending is not None:
            frame.pending.cancel()
        frame.release()
        self._counts.dropped(reason)
        self._on_drop(frame)

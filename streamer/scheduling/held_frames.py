"""The frames one chain holds, so that a chain given up on still accounts for every one.

A frame is *held* by a chain from the moment its first batcher takes it from admission until
the chain hands it to egress (its result, or its error result). In between it may be in the
batcher's groups, a replica's submit queue or ledger, a model, a later stage's inbox, or a
thread's hands. When the chain is given up (a reload's old chain that did not drain in time,
or a drain cut short at a stop), :meth:`HeldFrames.give_up` counts every frame it still holds
as dropped, with a reason, and reports each to egress's reorder buffer, so that the later
results of their sources do not wait for them. Anything the chain's threads still hand to
egress after that is discarded: each frame gets exactly one outcome.

Thread-safe: the chain's first batcher calls :meth:`HeldFrames.take`, its batcher and dequeue
threads (through the chain router) :meth:`HeldFrames.put`, and the thread that gives the
chain up :meth:`HeldFrames.give_up`.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from streamer.frames import Batch, Frame, OutcomeCounts
from streamer.scheduling.batcher import Inbox

__all__ = ["HeldFrames"]


class HeldFrames:
    """The frames a chain took from admission and has not handed to egress yet.

    Args:
        intake: the queue the chain's first batcher takes frames from (admission).
        results: egress's queue (``put``).
        counts: outcome counters; a give-up counts the frames held as dropped here.
        on_drop: told about every frame dropped (egress's reorder buffer's ``skip``).
    """

    def __init__(
        self,
        intake: Inbox,
        results: Any,
        counts: OutcomeCounts,
        on_drop: Callable[[Frame], None],
    ) -> None:
        self._intake = intake
        self._results = results
        self._counts = counts
        self._on_drop = on_drop
        self._lock = threading.Lock()
        self._frames: set[Frame] = set()
        self._dropped_as: str | None = None

    def take(self, wanted: int, timeout: float, limit: int | None = None) -> list[Any]:
        """The first batcher's inbox: what the intake's ``take`` returns, its frames now held.

        Frames taken once the chain was given up (a take under way at that moment) are
        dropped at once with the give-up's reason and left out; markers are returned.
        """
        items = self._intake.take(wanted, timeout, limit)
        frames = [item for item in items if isinstance(item, Frame)]
        with self._lock:
            reason = self._dropped_as
            if reason is None:
                self._frames.update(frames)
                return items
        self._drop(frames, reason)
        return [item for item in items if not isinstance(item, Frame)]

    def put(self, item: Any) -> None:
        """Hand ``item`` to egress: a batch's frames are no longer held. Once the chain was
        given up a batch is discarded instead (its frames were counted then); other items
        (end-of-stream markers, which are not frames) still go to egress."""
        if isinstance(item, Batch):
            with self._lock:
                if self._dropped_as is not None:
                    return
                self._frames.difference_update(item.frames)
        self._results.put(item)

    def give_up(self, reason: str) -> int:
        """Count every frame held as dropped with ``reason`` and report it to ``on_drop``;
        from now on the chain holds nothing (see :meth:`take` and :meth:`put`). The frames
        are not released: a thread of the chain may still be using them. Idempotent.

        Returns:
            The number of frames dropped (0 on a second call).
        """
        with self._lock:
            if self._dropped_as is not None:
                return 0
            self._dropped_as = reason
            frames, self._frames = list(self._frames), set()
        self._drop(frames, reason)
        return len(frames)

    def _drop(self, frames: list[Frame], reason: str) -> None:
        if frames:
            self._counts.dropped(reason, len(frames))
        for frame in frames:
            self._on_drop(frame)

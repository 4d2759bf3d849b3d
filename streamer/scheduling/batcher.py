"""The batcher: assembles a stage's batches and dispatches them to its replicas.

It takes prepared frames in arrival order and groups them by input shape (frames of
different resolution gears never share a batch). A group is flushed when it holds
``max_size`` frames, when its oldest frame has waited ``max_delay_ms`` since it was received
(the *deadline*), or when a marker (end of stream, stop) comes. After a deadline it
still takes the frames already waiting (a batch's worth at a time) before it flushes, so
batches grow on their own under load. A flushed group is cut into executions at the model's
gears (:meth:`BatchPolicy.plan`), each stacked into one padded array and handed to the
:class:`~streamer.scheduling.replica.Dispatcher`, whose replicas' enqueue threads feed the
models. Failed frames and end-of-stream markers go straight on towards egress, which puts
every source back in order. A ``tensor`` stage's batcher groups nothing: each upstream batch
it takes is dispatched as it is, to a replica on the device that holds its inputs.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Sequence
from concurrent.futures import Future
from concurrent.futures import wait as wait_for
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

from streamer.errors import BackendError, FrameError, Reason
from streamer.frames import STOP, Batch, Frame
from streamer.lifecycle import Worker
from streamer.runtime.base import Tensor, release_inputs
from streamer.scheduling.chain import stage_error
from streamer.scheduling.policy import BatchPolicy
from streamer.scheduling.replica import Dispatcher

__all__ = ["Batcher", "Inbox"]

_POLL_S = 0.1


class Inbox(Protocol):
    """The batcher's input (:class:`~streamer.scheduling.mailbox.Mailbox`; stage 0's is the
    pipeline's admission queue)."""

    def take(self, wanted: int, timeout: float, limit: int | None = None) -> list[Any]:
        """What is queued up to and including the first marker, at most ``limit`` items,
        once ``wanted`` items or a marker are, or after ``timeout`` s."""


@dataclass(slots=True)
class _Group:
    """Pending frames of one input shape."""

    deadline_ns: int
    frames: list[Frame] = field(default_factory=list)


class Batcher(Worker):
    """Batch assembly of one stage.

    Args:
        name: the stage's name (names the thread, and the errors of the frames it cannot
            dispatch).
        dispatcher: sends each batch to a replica; :data:`STOP` is broadcast to every
            replica.
        policy: batch size, deadline and gears.
        inbox: frames (whose preprocessing may still be ``pending``), or for a ``tensor``
            stage the upstream's batches (their frames' ``handover`` holds the inputs),
            end-of-stream markers and finally :data:`STOP`, in arrival order.
        outbox: towards egress: failed frames (as one-frame batches) and end-of-stream
            markers, which need no model.
        abort: set when the pipeline gives up draining; the thread then returns at once.

    Attributes:
        flushes: batches flushed, by reason: ``full``, ``deadline`` or ``marker``.
    """

    def __init__(
        self,
        name: str,
        dispatcher: Dispatcher,
        policy: BatchPolicy,
        inbox: Inbox,
        outbox: queue.SimpleQueue[Any],
        abort: threading.Event,
    ) -> None:
        super().__init__(name=f"batcher-{name}")
        self._stage = name
        self._dispatcher = dispatcher
        self._policy = policy
        self._inbox = inbox
        self._outbox = outbox
        self._abort = abort
        self._groups: dict[tuple[int, ...], _Group] = {}
        # Fixed keys: the metrics thread may read it while this thread counts.
        self.flushes = dict.fromkeys(("full", "deadline", "marker"), 0)

    def loop(self) -> None:
        while not self._abort.is_set():
            for item in self._take():
                if self._abort.is_set():
                    return
                if isinstance(item, Frame):
                    self._add(item)
                elif isinstance(item, Batch):
                    self._hand_over(item)
                else:
                    self._flush_all()
                    if item is STOP:
                        self._dispatcher.broadcast(STOP)
                        return
                    self._outbox.put(item)
            self._flush_due()

    def _take(self) -> list[Any]:
        """What is queued, a batch's worth at most, once the fullest group can fill, the
        earliest deadline passed (frames already waiting then are taken too, so batches grow
        on their own under load) or a marker came; at most ``_POLL_S`` later. Frames beyond
        a batch's worth stay in the inbox while this thread waits for a replica, where
        admission's full policies can still drop them."""
        timeout, wanted = _POLL_S, 1
        if self._groups:
            due = min(g.deadline_ns for g in self._groups.values())
            timeout = min(max(0.0, (due - time.monotonic_ns()) / 1e9), _POLL_S)
            wanted = self._policy.max_size - max(len(g.frames) for g in self._groups.values())
        return self._inbox.take(wanted, timeout, self._policy.max_size)

    def _add(self, frame: Frame) -> None:
        if frame.pending is not None:
            if not self._prepared(frame.pending):
                return  # aborted: the chain's frames are dropped (``shutdown``)
            frame.pending = None
        if frame.children:
            frame.outstanding = len(frame.children)
            for child in frame.children:
                self._group(child)
        elif frame.error is not None or frame.tensor is None:
            self._outbox.put(Batch([frame]))
        else:
            self._group(frame)

    def _prepared(self, pending: Future[Frame]) -> bool:
        """Wait for a frame's decode+preprocess job; False when the pipeline aborts first
        (a backlog of slow decodes, large PNGs, must not hold this thread past a stop)."""
        while not self._abort.is_set():
            if wait_for([pending], timeout=_POLL_S).done:
                pending.result()
                return True
        return False

    def _group(self, frame: Frame) -> None:
        assert frame.tensor is not None
        key = frame.tensor.shape
        group = self._groups.get(key)
        if group is None:
            deadline = frame.received_at_ns + self._policy.max_delay_ns
            group = self._groups[key] = _Group(deadline)
        group.frames.append(frame)
        if len(group.frames) >= self._policy.max_size:
            self._flush(key, "full")

    def _flush_due(self) -> None:
        now = time.monotonic_ns()
        for key in [k for k, g in self._groups.items() if g.deadline_ns <= now]:
            self._flush(key, "deadline")

    def _flush_all(self) -> None:
        for key in list(self._groups):
            self._flush(key, "marker")

    def _flush(self, key: tuple[int, ...], reason: str) -> None:
        frames = self._groups.pop(key).frames
        self.flushes[reason] += 1
        start = 0
        for execution in self._policy.plan(len(frames)):
            batch = Batch(frames[start : start + execution.frames])
            batch.good, batch.rows = list(batch.frames), execution.rows
            start += execution.frames
            self._enqueue(batch, [self._stack(batch)])

    def _hand_over(self, batch: Batch) -> None:
        """Run an upstream stage's batch as it is (the ``tensor`` adapter), on a replica of
        the device that holds its inputs."""
        handover = batch.good[0].handover
        for frame in batch.good:
            frame.handover = None
        self._enqueue(batch, handover.inputs, handover.device)

    def _enqueue(self, batch: Batch, inputs: Sequence[Tensor], device: int | None = None) -> None:
        """Dispatch; without a replica to run it (none live, or none on the device that holds
        a tensor stage's inputs) the batch fails with an error naming the stage, and the
        thread ends when every replica of the stage has failed."""
        try:
            self._dispatcher.dispatch(batch, inputs, device)
        except BackendError as exc:
            release_inputs(inputs)
            error = stage_error(self._stage, FrameError(Reason.INFERENCE_FAILED, str(exc)))
            for frame in batch.good:
                frame.fail(error)
            batch.good = []
            self._outbox.put(batch)
            if not any(r.failed is None for r in self._dispatcher.replicas):
                raise

    @staticmethod
    def _stack(batch: Batch) -> np.ndarray:
        """The batch's tensors in one C-contiguous array of ``batch.rows`` rows, zero-padded."""
        tensors = [f.tensor for f in batch.good]
        first = tensors[0]
        assert first is not None
        stacked = np.empty((batch.rows, *first.shape), dtype=first.dtype)
        np.stack(tensors, out=stacked[: len(tensors)])  # type: ignore[arg-type]
        stacked[len(tensors) :] = 0
        for frame in batch.good:
            frame.tensor = None
        return stacked

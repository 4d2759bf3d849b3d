"""The batcher: the one thread that enqueues into a model replica (DESIGN.md §2).

It takes prepared frames in arrival order, groups them until ``max_size`` frames are in hand
or the oldest has waited ``max_delay_ms`` since it was received, stacks their tensors into one
padded batch, enqueues it, and records the batch in the *ledger* the dequeue thread reads.
After the deadline it still takes every frame already waiting (up to ``max_size``) before it
flushes, so batches grow on their own under load.
"""

from __future__ import annotations

import queue
import threading
import time
from concurrent.futures import Future
from typing import Any

import numpy as np

from streamer.errors import BackendError, FrameError, Reason
from streamer.frames import STOP, Batch, EndOfStream, Frame
from streamer.lifecycle import Worker
from streamer.runtime.base import QueueModel
from streamer.scheduling.policy import BatchPolicy

__all__ = ["Batcher"]

_POLL_S = 0.1
_EMPTY = object()


class Batcher(Worker):
    """Enqueue thread of one model replica.

    Args:
        model: the replica; only this thread calls its ``enqueue``.
        policy: batch size, deadline and padding.
        inbox: frames (or futures of frames being prepared), :class:`EndOfStream` markers and
            finally :data:`STOP`, in arrival order.
        ledger: receives every :class:`Batch` (also those with no good frame),
            :class:`EndOfStream` marker and finally :data:`STOP`, in order.
        abort: set when the pipeline gives up draining; the thread then returns at once.
    """

    def __init__(
        self,
        model: QueueModel,
        policy: BatchPolicy,
        inbox: queue.Queue[Any],
        ledger: queue.SimpleQueue[Any],
        abort: threading.Event,
    ) -> None:
        super().__init__(name=f"batcher-{model.info.name}")
        self._model = model
        self._policy = policy
        self._inbox = inbox
        self._ledger = ledger
        self._abort = abort
        self._pending: list[Frame] = []
        self._good = 0
        self._deadline_ns = 0

    def setup(self) -> None:
        self._model.attach_thread()

    def loop(self) -> None:
        while not self._abort.is_set():
            item = self._take()
            if item is _EMPTY:
                self._flush()
            elif item is STOP or isinstance(item, EndOfStream):
                self._flush()
                self._ledger.put(item)
                if item is STOP:
                    return
            else:
                self._add(item.result() if isinstance(item, Future) else item)

    def _take(self) -> Any:
        """Next item; ``_EMPTY`` when the pending batch is due and nothing more is waiting."""
        while not self._abort.is_set():
            if not self._pending:
                timeout = _POLL_S
            else:
                timeout = min((self._deadline_ns - time.monotonic_ns()) / 1e9, _POLL_S)
                if timeout <= 0:
                    try:
                        return self._inbox.get_nowait()
                    except queue.Empty:
                        return _EMPTY
            try:
                return self._inbox.get(timeout=timeout)
            except queue.Empty:
                continue
        return STOP

    def _add(self, frame: Frame) -> None:
        if not self._pending:
            self._deadline_ns = frame.received_at_ns + self._policy.max_delay_ns
        self._pending.append(frame)
        if frame.error is None:
            self._good += 1
            if self._good >= self._policy.max_size:
                self._flush()

    def _flush(self) -> None:
        if not self._pending:
            return
        batch = Batch(self._pending, [f for f in self._pending if f.error is None])
        self._pending, self._good = [], 0
        try:
            if batch.good:
                self._enqueue(batch)
        except BackendError as exc:
            error = FrameError(Reason.INFERENCE_FAILED, str(exc))
            for frame in batch.good:
                frame.fail(error)
            batch.good = []
            raise
        finally:
            self._ledger.put(batch)

    def _enqueue(self, batch: Batch) -> None:
        tensors = [f.tensor for f in batch.good]
        first = tensors[0]
        assert first is not None
        batch.rows = self._policy.rows_for(len(tensors))
        stacked = np.empty((batch.rows, *first.shape), dtype=first.dtype)
        np.stack(tensors, out=stacked[: len(tensors)])  # type: ignore[arg-type]
        stacked[len(tensors) :] = 0
        now = time.monotonic_ns()
        for frame in batch.good:
            frame.batched_at_ns = now
            frame.tensor = None
        self._model.enqueue([stacked])

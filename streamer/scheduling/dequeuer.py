"""The dequeue thread: the one thread that dequeues a model replica's outputs (DESIGN.md §2).

It reads the ledger the batcher writes, takes the outputs of each enqueued batch from the
model in the same FIFO order, runs the postprocessor over them and hands the finished batch
to egress. Batches that carry only failed frames, and end-of-stream markers, pass through in
their place, so results leave in arrival order.
"""

from __future__ import annotations

import queue
import threading
from typing import Any

import structlog

from streamer.errors import BackendError, FrameError, Reason
from streamer.frames import STOP, Batch
from streamer.lifecycle import Worker
from streamer.runtime.base import InferenceOutputs, QueueModel
from streamer.scheduling.swap import Postprocess, StageSwap

__all__ = ["Dequeuer", "Postprocess"]

_POLL_MS = 100
_log = structlog.get_logger(__name__)


class Dequeuer(Worker):
    """Dequeue thread of one model replica.

    Args:
        model: the replica; only this thread calls its ``dequeue``.
        ledger: what the batcher enqueued, in order (see :class:`Batcher`).
        outbox: receives each batch and marker, in order, then :data:`STOP`.
        postprocess: turns a batch's outputs into per-frame results; any exception it
            raises fails that batch's frames with reason ``postprocess_failed``.
        abort: set when the pipeline gives up draining.
        max_consecutive_failures: failed executions in a row after which the thread ends
            with a :class:`BackendError` (the daemon then exits non-zero); each failed batch
            gets error results first.
    """

    def __init__(
        self,
        model: QueueModel,
        ledger: queue.SimpleQueue[Any],
        outbox: queue.SimpleQueue[Any],
        postprocess: Postprocess,
        abort: threading.Event,
        max_consecutive_failures: int = 10,
    ) -> None:
        super().__init__(name=f"dequeue-{model.info.name}")
        self._model = model
        self._ledger = ledger
        self._outbox = outbox
        self._postprocess = postprocess
        self._abort = abort
        self._max_failures = max_consecutive_failures
        self._failures = 0

    def setup(self) -> None:
        self._model.attach_thread()

    def loop(self) -> None:
        while not self._abort.is_set():
            try:
                item = self._ledger.get(timeout=_POLL_MS / 1000)
            except queue.Empty:
                continue
            if isinstance(item, StageSwap):
                self._swap(item)
                continue
            if isinstance(item, Batch) and item.good:
                outputs = self._wait_outputs()
                if outputs is None:
                    return
                self._complete(item, outputs)
            self._outbox.put(item)
            if item is STOP:
                return
            self._check_failures()

    def _swap(self, swap: StageSwap) -> None:
        self._model, self._postprocess = swap.model, swap.postprocess
        self._model.attach_thread()
        swap.done.set()

    def _check_failures(self) -> None:
        if self._failures >= self._max_failures:
            raise BackendError(
                f"model {self._model.info.name!r}: {self._failures} executions failed in a row"
            )

    def _wait_outputs(self) -> InferenceOutputs | None:
        while not self._abort.is_set():
            outputs = self._model.dequeue(_POLL_MS)
            if outputs is not None:
                return outputs
        return None

    def _complete(self, batch: Batch, done: InferenceOutputs) -> None:
        for frame in batch.good:
            frame.model = self._model.info.name
            frame.infer_start_ns = done.start_ns
            frame.infer_end_ns = done.end_ns
        if done.error is not None or done.outputs is None:
            error = done.error or FrameError(Reason.INFERENCE_FAILED, "no outputs")
            self._failed_execution(batch, error)
            return
        self._failures = 0
        try:
            self._postprocess(done.outputs, batch.good)
        except Exception as exc:  # a postprocessor bug fails this batch, not the daemon
            self._fail(batch, FrameError(Reason.POSTPROCESS_FAILED, f"{type(exc).__name__}: {exc}"))

    def _failed_execution(self, batch: Batch, error: FrameError) -> None:
        self._failures += 1
        log = _log.warning if self._failures == 1 else _log.debug
        log(
            "execution_failed",
            model=self._model.info.name,
            frames=len(batch.good),
            consecutive=self._failures,
            detail=error.detail,
        )
        self._fail(batch, error)

    @staticmethod
    def _fail(batch: Batch, error: FrameError) -> None:
        for frame in batch.good:
            frame.fail(error)

"""The dequeue thread: the one thread that dequeues a model replica's outputs (DESIGN.md §2).

It reads the ledger its replica's enqueue thread writes, takes the outputs of each enqueued
batch from the model in the same FIFO order, runs the postprocessor over them and hands the
finished batch on towards egress (which restores each source's order). A batch whose
execution failed, or that its replica, out of rotation, can no longer run, is retried on
another replica of the stage when the dispatcher finds one
(:meth:`~streamer.scheduling.replica.Dispatcher.retry`); that replica's threads then finish
it. Every error a frame gets here names the stage (``stage <name>: …``). A batch whose output
was lost (:class:`~streamer.errors.OutputLostError`) is such a failed execution, after which
this thread reloads the model (:mod:`~streamer.scheduling.recovery`).
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

import structlog

from streamer.errors import BackendError, FrameError, OutputLostError, Reason
from streamer.frames import STOP, Batch, Frame
from streamer.lifecycle import Worker
from streamer.log_budget import LogBudget
from streamer.runtime.base import InferenceOutputs, Tensor
from streamer.scheduling.chain import stage_error
from streamer.scheduling.recovery import recover
from streamer.scheduling.replica import Dispatched, Replica

__all__ = ["Dequeuer", "Postprocess"]

Postprocess = Callable[[Sequence[Tensor], list[Frame]], None]
"""Fills ``frame.results`` (or for a stage that feeds a ``tensor`` stage, ``frame.handover``)
of each frame from the batch-first model outputs (rows in frame order; padding rows after
them)."""

_POLL_MS = 100
WARNING_INTERVAL_S = 10.0
"""Least time between two ``execution_failed`` warnings of one replica."""
_POSTPROCESS_LINES = LogBudget("postprocess_failed")
"""Every replica's ``postprocess_failed`` warnings, together."""
_log = structlog.get_logger(__name__)


class Dequeuer(Worker):
    """Dequeue thread of one model replica.

    Args:
        replica: the replica; only this thread calls its model's ``dequeue``.
        outbox: receives each finished batch, in the order of the replica's ledger.
        postprocess: turns a batch's outputs into per-frame results; any exception it
            raises fails that batch's frames with reason ``postprocess_failed``.
        abort: set when the pipeline gives up draining.
        max_consecutive_failures: failed executions in a row (lost outputs included) after
            which the replica is taken out of rotation (each failed batch is retried
            elsewhere or gets error results first).
        observe: told of each batch the model executed, failed executions included, once
            its frames' ``model`` and ``infer_*_ns`` are set (the per-model metrics); those
            of a batch whose output was lost are 0 (when it ran is unknown).
    """

    def __init__(
        self,
        replica: Replica,
        outbox: queue.SimpleQueue[Any],
        postprocess: Postprocess,
        abort: threading.Event,
        max_consecutive_failures: int = 10,
        observe: Callable[[Batch], None] = lambda batch: None,
    ) -> None:
        super().__init__(name=f"dequeue-{replica.name}")
        self._replica = replica
        self._ledger = replica.ledger
        self._outbox = outbox
        self._model = replica.model
        self._postprocess = postprocess
        self._abort = abort
        self._max_failures = max_consecutive_failures
        self._observe = observe
        self._unwarned = 0  # failed executions since the last warning
        self._next_warning_ns = 0

    def setup(self) -> None:
        self._model.attach_thread()

    def loop(self) -> None:
        while not self._abort.is_set():
            try:
                item = self._ledger.get(timeout=_POLL_MS / 1000)
            except queue.Empty:
                continue
            if item is STOP:
                return
            if isinstance(item, Dispatched):
                self._finish(item)

    def _finish(self, dispatched: Dispatched) -> None:
        """Complete one ledger entry: towards egress, unless another replica took it; then,
        if its output was lost, recover the replica."""
        batch, handed_on = dispatched.batch, False
        if batch.good and self._replica.failed is None:
            outputs = self._wait_outputs()
            if outputs is None:
                return
            handed_on = self._complete(dispatched, outputs)
        elif batch.good:
            handed_on = self._replica.refuse(dispatched)
        self._replica.finished()
        if not handed_on:
            self._outbox.put(batch)
        if self._replica.recovering is not None:
            recover(self._replica, self._abort)

    def _wait_outputs(self) -> InferenceOutputs | None:
        while not self._abort.is_set():
            try:
                outputs = self._model.dequeue(_POLL_MS)
            except OutputLostError as exc:
                self._replica.begin_recovery(str(exc))
                return InferenceOutputs(None, FrameError(Reason.INFERENCE_FAILED, str(exc)))
            except BackendError as exc:
                self._replica.fail(str(exc))
                return InferenceOutputs(None, FrameError(Reason.INFERENCE_FAILED, str(exc)))
            if outputs is not None:
                return outputs
        return None

    def _complete(self, dispatched: Dispatched, done: InferenceOutputs) -> bool:
        """Postprocess a batch's outputs, or handle its failed execution; True if another
        replica took the batch."""
        batch = dispatched.batch
        for frame in batch.good:
            frame.model = self._model.info.name
            frame.infer_start_ns = done.start_ns
            frame.infer_end_ns = done.end_ns
        self._observe(batch)
        if done.error is not None or done.outputs is None:
            error = done.error or FrameError(Reason.INFERENCE_FAILED, "no outputs")
            return self._failed_execution(dispatched, error)
        self._replica.execution_succeeded()
        try:
            self._postprocess(done.outputs, batch.good)
        except FrameError as error:  # an operator the postprocessor runs failed
            self._failed_postprocess(batch, error)
        except Exception as exc:  # a postprocessor bug fails this batch, not the daemon
            detail = f"{type(exc).__name__}: {exc}"
            self._failed_postprocess(batch, FrameError(Reason.POSTPROCESS_FAILED, detail))
        return False

    def _failed_postprocess(self, batch: Batch, error: FrameError) -> None:
        """Fail the batch, with a ``postprocess_failed`` warning (budgeted: a postprocess that
        fails every batch, such as an operator the device cannot run, logs 10 lines per 10 s
        over all replicas and counts the rest)."""
        if (suppressed := _POSTPROCESS_LINES.take()) is not None:
            _log.warning(
                "postprocess_failed",
                model=self._model.info.name,
                replica=self._replica.name,
                device=self._replica.device,
                frames=len(batch.good),
                reason=error.reason,
                detail=error.detail,
                suppressed=suppressed,
            )
        self._fail(batch, error)

    def _failed_execution(self, dispatched: Dispatched, error: FrameError) -> bool:
        """Retry the batch on another replica, else fail it; a warning at the first failure
        of a streak, at most one per :data:`WARNING_INTERVAL_S` (``failed_since_warning``
        counts those in between: a model failing every few batches does not flood the
        journal). True if another replica took the batch."""
        batch = dispatched.batch
        failures = self._replica.execution_failed()
        self._unwarned += 1
        now_ns = time.monotonic_ns()
        warn = failures == 1 and now_ns >= self._next_warning_ns
        if warn:
            self._next_warning_ns = now_ns + int(WARNING_INTERVAL_S * 1e9)
        (_log.warning if warn else _log.debug)(
            "execution_failed",
            model=self._model.info.name,
            replica=self._replica.name,
            device=self._replica.device,
            frames=len(batch.good),
            consecutive=failures,
            failed_since_warning=self._unwarned,
            detail=error.detail,
        )
        if warn:
            self._unwarned = 0
        handed_on = self._replica.retry_elsewhere(dispatched, error)
        if not handed_on:
            self._fail(batch, error)
        if failures >= self._max_failures:
            self._replica.fail(f"{failures} executions failed in a row")
        return handed_on

    def _fail(self, batch: Batch, error: FrameError) -> None:
        """Fail the batch's frames, the error naming the stage."""
        named = stage_error(self._model.info.name, error)
        for frame in batch.good:
            frame.fail(named)

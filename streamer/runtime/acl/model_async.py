"""Async mode: ``execute_async`` on the replica's stream, finished by stream callbacks.

(SAM ``…/resnet50_async_imagenet_classification/src/acl_net.py``; seeds, async inference
page.) The enqueue thread submits ``acl.mdl.execute_async`` and, every ``callback_interval``
batches, ``acl.rt.launch_callback(fn, batches, ACL_CALLBACK_BLOCK, stream)``; the callback runs
on the stream's report thread and marks those batches finished for the dequeue thread (it never
raises: an error is recorded and re-raised by ``dequeue``). ``execute_async`` returning is
"submitted" only: outputs are valid after the callback, or after ``synchronize_stream`` (S12).

Batches not covered by a callback yet (the interval is not full) are finished by the dequeue
thread once the oldest has waited ``callback_flush_ms``: it synchronises the stream with a
timeout, which also drains every earlier callback (they block the stream), so order is kept.
The enqueue thread goes on submitting meanwhile; a sync waits for those batches too, and
when it returns a failure's code they fail with the batches it was called for.

A ``callback_interval`` above the model's ``max_in_flight`` would never fill: it is lowered to
``max_in_flight`` (the backend logs ``acl_callback_interval_lowered`` once per model).

A callback carries no status (pyACL ``rt/rt_synchronize.cpp`` calls ``fn(user_data)``), and
one queued behind a task that failed on the device may never run: under
``ACL_STOP_ON_FAILURE`` the stream stops the tasks after a failed one (HA
``CANNCommunityEdition/900/programug/acldevg/runtime_doc_dev_0017.html``). So a covered batch
not finished ``result_timeout_ms`` after its enqueue is settled the same way: the stream is
synchronised; if it is idle, its code says how every batch still in flight ended (0: finished;
another code, e.g. ``ACL_ERROR_RT_AICORE_EXCEPTION``: they fail with ``inference_failed``,
as a failed execution does, and the model goes on); if it is still busy after the dequeue's
timeout, the execution hangs and the model raises :class:`BackendError`, as queue mode does
for an output that never comes. Under the default ``ACL_CONTINUE_ON_FAILURE`` the callback
after a failed task runs, and nothing tells its batches from good ones short of synchronising
the stream after each execution.
Close: ``synchronize_stream`` → ``unsubscribe_report`` → stop and join the callback thread →
release batches and memory → unload; a stream that does not synchronise within
``result_timeout_ms`` (a hung execution) leaves the model abandoned instead
(:meth:`AclModel._abandon`).

One model id runs on one stream only (S13): each async model has its own stream.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence

import structlog

from streamer.errors import BackendError
from streamer.runtime.acl.constants import AclCode, CallbackBlock
from streamer.runtime.acl.errors import AclError, check_ret, code_name
from streamer.runtime.acl.model_base import ModelParts, inference_error
from streamer.runtime.acl.model_dataset import Batch, DatasetModel
from streamer.runtime.acl.report import ReportThread

__all__ = ["AsyncModel", "effective_callback_interval"]

_log = structlog.get_logger(__name__)


class AsyncModel(DatasetModel):
    """Submits with ``execute_async``; a callback thread reports finished batches.

    Args:
        parts, max_in_flight: as :class:`~streamer.runtime.acl.model_dataset.DatasetModel`.

    Raises:
        AclError: the stream or the callback thread could not be set up.
    """

    mode = "async"

    def __init__(self, parts: ModelParts, max_in_flight: int) -> None:
        super().__init__(parts, max_in_flight)
        acl, device, options, teardown = parts.acl, parts.device, parts.options, parts.teardown
        self._stream = device.take_stream(teardown)
        self._report = ReportThread(
            acl,
            f"acl-report-{self.info.name}",
            device.context,
            self._stream,
            options.report_timeout_ms,
            teardown,
        )
        self._submit_lock = threading.Lock()
        self._uncovered: list[Batch] = []
        self._submitted_in_sync: list[Batch] | None = None  # while a flush synchronises
        self._callback_interval = effective_callback_interval(
            options.callback_interval, max_in_flight
        )
        self._callback_error: BaseException | None = None

    def _submit(self, batch: Batch) -> None:
        with self._submit_lock:
            ret = self._acl.mdl.execute_async(
                self._loaded.model_id, batch.input_dataset, batch.output_dataset, self._stream
            )
            if ret:
                error = AclError(ret, code_name(ret), "acl.mdl.execute_async")
                batch.fail(inference_error(str(error)))
                self._push(batch)
                return
            self._push(batch)
            self._uncovered.append(batch)
            if self._submitted_in_sync is not None:
                self._submitted_in_sync.append(batch)
            if len(self._uncovered) >= self._callback_interval:
                self._launch_callback()

    def _launch_callback(self) -> None:
        batches, self._uncovered = self._uncovered, []
        for batch in batches:
            batch.covered = True
        ret = self._acl.rt.launch_callback(
            self._on_callback, batches, CallbackBlock.BLOCK, self._stream
        )
        check_ret(ret, "acl.rt.launch_callback")

    def _on_callback(self, batches: Sequence[Batch]) -> None:
        """Runs on the report thread; never raises."""
        try:
            self._finish(batches)
        except BaseException as exc:  # noqa: BLE001 - an ACL callback must not raise
            self._callback_error = exc

    def _flush_due(self, head: Batch) -> bool:
        if head.done:
            return False
        options = self._options
        limit_ms = options.result_timeout_ms if head.covered else options.callback_flush_ms
        return (time.monotonic_ns() - head.start_ns) / 1e6 >= limit_ms

    def _flush(self, head: Batch, timeout_ms: int) -> None:
        """Synchronise the stream for at most ``timeout_ms`` and settle every batch in flight
        by its code (module docstring).

        Raises:
            BackendError: ``head``'s callback is overdue and the stream is still busy.
        """
        overdue = head.covered
        with self._submit_lock:
            uncovered, self._uncovered = self._uncovered, []
            for batch in uncovered:
                batch.covered = True
            batches = self._unsettled()
            self._submitted_in_sync = []
        try:
            ret = self._acl.rt.synchronize_stream_with_timeout(self._stream, timeout_ms)
        finally:
            with self._submit_lock:
                submitted, self._submitted_in_sync = self._submitted_in_sync or [], None
        if ret == AclCode.ERROR_RT_STREAM_SYNC_TIMEOUT:
            if overdue:
                waited_ms = (time.monotonic_ns() - head.start_ns) / 1e6
                raise BackendError(
                    f"model {self.info.name!r}: no callback for a batch enqueued "
                    f"{waited_ms:.0f} ms ago and its stream is still busy (a hung execution)"
                )
            with self._submit_lock:
                for batch in uncovered:
                    batch.covered = False
                self._uncovered[:0] = uncovered
            return
        if ret:
            error = AclError(ret, code_name(ret), "acl.rt.synchronize_stream_with_timeout")
            # debug: the dequeue thread's budgeted execution_failed warning gives the code
            _log.debug("acl_stream_task_failed", model=self.info.name, code=ret, name=error.name)
            # A batch submitted during the sync ran, or was dropped by the stopped stream, or
            # is the failed task itself: no later sync can tell, so it fails with the others.
            self._fail_all([*batches, *submitted], inference_error(str(error)))
            return
        self._finish(batches)

    def _check_health(self) -> None:
        error = self._callback_error or self._report.error
        if error is not None:
            raise BackendError(f"model {self.info.name!r}: callback thread failed: {error}")

    def _stop(self) -> bool:
        ret = self._acl.rt.synchronize_stream_with_timeout(
            self._stream, self._options.result_timeout_ms
        )
        if ret == AclCode.ERROR_RT_STREAM_SYNC_TIMEOUT:
            _log.error(
                "acl_stream_sync_failed", model=self.info.name, code=ret, name=code_name(ret)
            )
            return False  # the stream's tasks still run on the batches' memory
        if ret:  # the stream is idle; its tasks failed
            _log.error(
                "acl_stream_sync_failed", model=self.info.name, code=ret, name=code_name(ret)
            )
        self._release_in_flight()
        return True


def effective_callback_interval(configured: int, max_in_flight: int) -> int:
    """``callback_interval``, at most ``max_in_flight``: more batches than that are never
    in flight, so a longer interval never fills and every batch would wait
    ``callback_flush_ms`` for a synchronisation."""
    return min(configured, max_in_flight)

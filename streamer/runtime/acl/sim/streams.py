"""Simulated streams (an in-order task queue run by a device-side worker) and the callback
reports that ``launch_callback`` sends to the thread subscribed to a stream.

Rules (reference/pyacl.md §2, §6 and §9; seeds "接口调用流程" of async inference):
    S12: tasks run after the call that submitted them returns; outputs are valid only after
        ``synchronize_stream``. A task that fails (e.g. it reads memory freed in the meantime)
        makes the next synchronisation return its code. A task that raises :class:`TaskFault`
        (the ``task_fail_every_n_executes`` fault) also stops the stream: the tasks after it
        are dropped, so their callbacks never run, as under ``ACL_STOP_ON_FAILURE`` (HA
        ``CANNCommunityEdition/900/programug/acldevg/runtime_doc_dev_0017.html``). There the
        stream takes no task after the failure; the simulator runs tasks again once a
        synchronisation has returned the failure's code, so a model's later batches can be
        tested.
    S19: ``launch_callback`` on a stream no thread is subscribed to returns
        ``ACL_ERROR_RT_STREAM_NO_CB_REG`` (107015).
    S20: a stream has at most one subscribed thread (``ACL_ERROR_REPEAT_SUBSCRIBE``); a thread
        subscribed on one device cannot subscribe on another, and at most 1024 threads
        subscribe (``ACL_ERROR_RT_THREAD_SUBSCRIBE``).
    S21: a callback runs as ``fn(user_data)`` only on the subscribed thread, inside its
        ``process_report``; ``-1`` waits forever, ``> 0`` returns
        ``ACL_ERROR_RT_REPORT_TIMEOUT`` after that many ms. A thread that is not subscribed
        gets ``ACL_ERROR_RT_THREAD_SUBSCRIBE`` (107012: RT ``src/runtime``,
        ``CbSubscribe::GetGroupIdByThreadId`` returns ``RT_ERROR_SUBSCRIBE_THREAD``, which
        ``src/runtime/core/src/common/errcode_manage.cc`` maps to 107012; the ``ProcessReport_01``
        unit test of the runtime expects it); one unsubscribed while it waits gets the timeout
        code. The timeout code is ``ACL_ERROR_RT_REPORT_TIMEOUT`` (507012), or with
        ``report_timeout_code = "wait_callback_timeout"`` the one older CANN releases return,
        ``ACL_ERROR_WAIT_CALLBACK_TIMEOUT`` (100036, deprecated in favour of 507012: RT
        ``docs/api_docs/aclError.md``). With ``ACL_CALLBACK_BLOCK`` the stream waits until
        the callback has returned.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from streamer.runtime.acl.constants import AclCode, CallbackBlock
from streamer.runtime.acl.sim.binding import SimError

__all__ = ["Reports", "SimStream", "TaskFault"]

_MAX_REPORT_THREADS = 1024
_POLL_S = 0.05
_DESTROY_WAIT_S = 5.0


class TaskFault(SimError):
    """A task that failed on the device and stops the tasks queued behind it (S12)."""


@dataclass(eq=False)
class _Task:
    run: Callable[[], None]
    on_drop: Callable[[], None] | None


class SimStream:
    """One stream: tasks run in submission order on a worker thread.

    Args:
        handle: the stream handle.
        device: the device of the context that created it.
        context: that context's handle.
        on_error: called with a task's :class:`SimError` (for the violation list).
    """

    def __init__(
        self, handle: int, device: int, context: int, on_error: Callable[[SimError], None]
    ) -> None:
        self.handle = handle
        self.device = device
        self.context = context
        self._on_error = on_error
        self._cond = threading.Condition()
        self._tasks: deque[_Task] = deque()
        self._pending = 0
        self._error: SimError | None = None
        self._stopped = False  # a TaskFault: tasks are dropped until a sync reads it
        self._closed = False
        self._worker = threading.Thread(
            target=self._run, name=f"acl-sim-stream-{handle:x}", daemon=True
        )
        self._worker.start()

    def submit(self, task: Callable[[], None], on_drop: Callable[[], None] | None = None) -> None:
        """Queue ``task``; it runs after every task submitted before it. ``on_drop`` runs
        instead if the stream is stopped by a failed task (S12)."""
        with self._cond:
            self._tasks.append(_Task(task, on_drop))
            self._pending += 1
            self._cond.notify_all()

    def synchronize(self, timeout_ms: int) -> int:
        """Wait until every submitted task has run; ``-1`` waits forever.

        Returns:
            0, ``ACL_ERROR_RT_STREAM_SYNC_TIMEOUT`` on expiry, or the code of a failed task.
        """
        deadline = None if timeout_ms < 0 else time.monotonic() + timeout_ms / 1000
        with self._cond:
            while self._pending:
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    return int(AclCode.ERROR_RT_STREAM_SYNC_TIMEOUT)
                self._cond.wait(remaining)
            error, self._error = self._error, None
            self._stopped = False
        return 0 if error is None else error.code

    def destroy(self) -> None:
        """Stop the worker; tasks not started are dropped. A task stuck in a blocking
        callback nobody runs is abandoned after 5 s (the worker is a daemon thread)."""
        with self._cond:
            self._closed = True
            self._tasks.clear()
            self._cond.notify_all()
        self._worker.join(_DESTROY_WAIT_S)

    def _run(self) -> None:
        while (task := self._next()) is not None:
            with self._cond:
                stopped = self._stopped
            if stopped:
                if task.on_drop is not None:
                    task.on_drop()
            else:
                self._execute(task)
            with self._cond:
                self._pending -= 1
                self._cond.notify_all()

    def _execute(self, task: _Task) -> None:
        try:
            task.run()
        except SimError as err:
            self._on_error(err)
            with self._cond:
                self._error = self._error or err
                self._stopped = self._stopped or isinstance(err, TaskFault)

    def _next(self) -> _Task | None:
        with self._cond:
            while not self._tasks and not self._closed:
                self._cond.wait()
            if self._closed:
                self._pending = 0
                self._cond.notify_all()
                return None
            return self._tasks.popleft()


@dataclass(eq=False)
class _Report:
    fn: Callable[[Any], Any]
    data: Any
    stream: int
    done: threading.Event = field(default_factory=threading.Event)


class Reports:
    """Stream subscriptions and the reports waiting for ``process_report``; thread-safe.

    Args:
        on_callback_error: called with an exception a callback raised (pyACL logs and
            swallows it: RT ``rt/rt_synchronize.cpp`` ``LaunchCallFunc``).
        timeout_code: what ``process_report`` returns when no callback came in time (S21).
    """

    def __init__(
        self, on_callback_error: Callable[[BaseException], None], timeout_code: int
    ) -> None:
        self._on_callback_error = on_callback_error
        self._timeout_code = timeout_code
        self._cond = threading.Condition()
        self._subscribers: dict[int, int] = {}
        self._thread_device: dict[int, int] = {}
        self._queues: dict[int, deque[_Report]] = {}

    def subscribe(self, thread_id: int, stream: SimStream) -> None:
        """``acl.rt.subscribe_report``: S20.

        Raises:
            SimError: the stream already has a thread, the thread serves another device,
                too many threads, or no such thread.
        """
        if not any(t.ident == thread_id for t in threading.enumerate()):
            raise SimError(AclCode.ERROR_RT_PARAM_INVALID, "S20", f"no thread {thread_id}")
        with self._cond:
            if stream.handle in self._subscribers:
                raise SimError(AclCode.ERROR_REPEAT_SUBSCRIBE, "S20", "stream already subscribed")
            device = self._thread_device.get(thread_id, stream.device)
            if device != stream.device:
                raise SimError(
                    AclCode.ERROR_RT_THREAD_SUBSCRIBE, "S20", f"thread serves device {device}"
                )
            if (
                thread_id not in self._thread_device
                and len(self._thread_device) >= _MAX_REPORT_THREADS
            ):
                raise SimError(AclCode.ERROR_RT_THREAD_SUBSCRIBE, "S20", "1024 threads subscribed")
            self._subscribers[stream.handle] = thread_id
            self._thread_device[thread_id] = stream.device
            self._queues.setdefault(thread_id, deque())

    def unsubscribe(self, thread_id: int, stream: int) -> None:
        """``acl.rt.unsubscribe_report``; reports still waiting for this stream are dropped.

        Raises:
            SimError: the thread is not subscribed to the stream.
        """
        with self._cond:
            if self._subscribers.get(stream) != thread_id:
                raise SimError(AclCode.ERROR_STREAM_NOT_SUBSCRIBE, "S20", "not subscribed")
            del self._subscribers[stream]
            queue = self._queues[thread_id]
            for report in [r for r in queue if r.stream == stream]:
                queue.remove(report)
                report.done.set()
            if thread_id not in self._subscribers.values():
                del self._thread_device[thread_id]
                del self._queues[thread_id]
            self._cond.notify_all()

    def subscribed(self, stream: int) -> bool:
        """Whether a thread serves ``stream`` (S19)."""
        with self._cond:
            return stream in self._subscribers

    def post(self, stream: int, fn: Callable[[Any], Any], data: Any, block: int) -> None:
        """Run on the stream worker: hand the callback to the subscribed thread; with
        ``ACL_CALLBACK_BLOCK`` wait until it has run (or the stream is unsubscribed)."""
        report = _Report(fn, data, stream)
        with self._cond:
            thread_id = self._subscribers.get(stream)
            if thread_id is None:
                return
            self._queues[thread_id].append(report)
            self._cond.notify_all()
        while block == CallbackBlock.BLOCK and not report.done.wait(_POLL_S):
            if not self.subscribed(stream):
                return

    def process(self, timeout_ms: int) -> int:
        """``acl.rt.process_report`` on the calling thread: run one waiting callback.

        Returns:
            0 after a callback ran, the timeout code when none came in time (S21).

        Raises:
            SimError: the calling thread is not subscribed (``ACL_ERROR_RT_THREAD_SUBSCRIBE``,
                S21).
        """
        thread_id = threading.get_ident()
        deadline = None if timeout_ms < 0 else time.monotonic() + timeout_ms / 1000
        with self._cond:
            queue = self._queues.get(thread_id)
            if queue is None:
                raise SimError(AclCode.ERROR_RT_THREAD_SUBSCRIBE, "S21", "not subscribed")
            while not queue:
                remaining = None if deadline is None else deadline - time.monotonic()
                unsubscribed = self._queues.get(thread_id) is not queue
                if unsubscribed or (remaining is not None and remaining <= 0):
                    return self._timeout_code
                self._cond.wait(remaining)
            report = queue.popleft()
        self._run(report)
        return 0

    def live(self) -> list[tuple[int, int]]:
        """``(stream, thread)`` subscriptions not undone yet."""
        with self._cond:
            return list(self._subscribers.items())

    def _run(self, report: _Report) -> None:
        try:
            report.fn(report.data)
        except BaseException as exc:  # noqa: BLE001 - pyACL swallows callback errors too
            self._on_callback_error(exc)
        finally:
            report.done.set()

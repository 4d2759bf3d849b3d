"""The callback thread of one stream (async mode): a ``process_report`` loop.

Lifecycle (SAM ``python/level2_simple_inference/1_classification/
resnet50_async_imagenet_classification/src/acl_net.py``; seeds, async inference page): start
the thread → in the thread ``acl.rt.set_context`` (a new thread has no context) →
``acl.rt.subscribe_report(thread_id, stream)`` → loop ``acl.rt.process_report(timeout_ms)``.
Shutdown: ``synchronize_stream`` (by the owner; no callback is pending after it) → exit flag →
``unsubscribe_report`` → join. The flag is set just before unsubscribing, so the loop starts
no turn after it; a turn already in ``process_report`` (or just past the flag's check) may end
with an error, which is ignored once stopping. Callbacks run on this thread; it never
raises: an error is recorded in :attr:`ReportThread.error` for the thread that owns the work.

The thread is a named ``threading.Thread`` rather than ``acl.util.start_thread``: pyACL's
``start_thread`` resets ``SIGINT`` to its default action (``signal(SIGINT, nullptr)``, RT
``python/pyACL/util/thread.cpp``), which would kill the daemon on Ctrl-C instead of draining
it, and its docs mark it unsupported on Atlas 200I/500 A2 and the Atlas inference series
(reference/pyacl.md §2). On Linux ``threading.get_ident()`` is the ``pthread_t`` that
``subscribe_report`` expects (pyACL parses it as a 64-bit integer).
"""

from __future__ import annotations

import threading
from typing import Any

import structlog

from streamer.errors import BackendError
from streamer.runtime.acl.constants import AclCode
from streamer.runtime.acl.errors import AclError, check_ret, code_name
from streamer.runtime.acl.teardown import Teardown

__all__ = ["ReportThread"]

_log = structlog.get_logger(__name__)
_START_TIMEOUT_S = 10.0
_JOIN_TIMEOUT_S = 10.0
_OK = (AclCode.SUCCESS, AclCode.ERROR_RT_REPORT_TIMEOUT, AclCode.ERROR_WAIT_CALLBACK_TIMEOUT)
"""What ``process_report`` returns when a turn ends normally: a callback ran, or none came in
time. The timeout code is ``ACL_ERROR_RT_REPORT_TIMEOUT`` (507012) in current CANN, and
``ACL_ERROR_WAIT_CALLBACK_TIMEOUT`` (100036) in older releases (deprecated in favour of 507012:
RT ``docs/api_docs/aclError.md``; MindSpore's callback thread accepts both)."""


class ReportThread:
    """Starts, subscribes and (through ``teardown``) stops the callback thread of ``stream``.

    Args:
        acl: the pyACL module.
        name: thread name (``acl-report-<model>``).
        context: the context the thread sets before calling ``process_report``.
        stream: the stream whose callbacks it runs.
        timeout_ms: ``process_report`` timeout of one loop turn (ms).
        teardown: receives the releases (unsubscribe, then stop and join).

    Raises:
        AclError: the thread's ``set_context`` or ``subscribe_report`` failed (the thread is
            stopped by ``teardown``).
        BackendError: the thread did not start within 10 s.
    """

    def __init__(
        self, acl: Any, name: str, context: int, stream: int, timeout_ms: int, teardown: Teardown
    ) -> None:
        self.error: BaseException | None = None
        self._acl = acl
        self._stream = stream
        self._ready = threading.Event()
        self._subscribed = threading.Event()
        self._stop = threading.Event()
        # A daemon thread: one stuck in process_report past the 10 s join (logged as
        # acl_report_thread_stuck) must not keep the process from exiting.
        self._thread = threading.Thread(
            target=self._run, args=(context, timeout_ms), name=name, daemon=True
        )
        self._thread.start()
        teardown.push_call(self._join)
        if not self._ready.wait(_START_TIMEOUT_S):
            raise BackendError(f"the ACL callback thread {name} did not start")
        if isinstance(self.error, AclError):
            raise self.error
        assert self._thread.ident is not None
        self._thread_id = self._thread.ident
        check_ret(acl.rt.subscribe_report(self._thread_id, stream), "acl.rt.subscribe_report")
        teardown.push_call(self._unsubscribe)
        self._subscribed.set()

    def _run(self, context: int, timeout_ms: int) -> None:
        try:
            check_ret(self._acl.rt.set_context(context), "acl.rt.set_context")
        except BaseException as exc:  # noqa: BLE001 - never raise in an ACL thread
            self.error = exc
            return
        finally:
            self._ready.set()
        self._subscribed.wait()
        while not self._stop.is_set():
            try:
                ret = self._acl.rt.process_report(timeout_ms)
            except BaseException as exc:  # noqa: BLE001 - never raise in an ACL thread
                self.error = exc
                return
            if ret in _OK:
                continue
            if not self._stop.is_set():
                self.error = AclError(ret, code_name(ret), "acl.rt.process_report")
                _log.error("acl_report_thread_failed", code=ret, name=code_name(ret))
            return

    def _unsubscribe(self) -> None:
        self._stop.set()
        check_ret(
            self._acl.rt.unsubscribe_report(self._thread_id, self._stream),
            "acl.rt.unsubscribe_report",
        )

    def _join(self) -> None:
        self._stop.set()
        self._subscribed.set()
        self._thread.join(_JOIN_TIMEOUT_S)
        if self._thread.is_alive():
            _log.error("acl_report_thread_stuck", thread=self._thread.name)

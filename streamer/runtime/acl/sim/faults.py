"""Failures injected on request (``[runtime.options.sim]``): failed or slow executions, a full
tdt queue, or any API returning a chosen code."""

from __future__ import annotations

import threading
import time

from streamer.runtime.acl.options import SimOptions

__all__ = ["Faults"]


class Faults:
    """Counters and switches of the injected failures; thread-safe.

    Args:
        options: ``fail_every_n_executes``, ``execute_delay_ms``,
            ``queue_full_every_n_enqueues`` and ``fail_calls``.
    """

    def __init__(self, options: SimOptions) -> None:
        self._options = options
        self._lock = threading.Lock()
        self._executions = 0
        self._enqueues = 0

    def injected_code(self, api: str) -> int | None:
        """The code every call of ``api`` returns (``fail_calls``), or None."""
        return self._options.fail_calls.get(api)

    def execution_fails(self) -> bool:
        """Count one model execution; True for every ``fail_every_n_executes``-th."""
        every = self._options.fail_every_n_executes
        with self._lock:
            self._executions += 1
            return every is not None and self._executions % every == 0

    def delay_execution(self) -> None:
        """Sleep ``execute_delay_ms`` (the simulated execution time)."""
        if self._options.execute_delay_ms:
            time.sleep(self._options.execute_delay_ms / 1000)

    def queue_full(self) -> bool:
        """Count one ``acltdtEnqueueData``; True for every ``queue_full_every_n_enqueues``-th."""
        every = self._options.queue_full_every_n_enqueues
        with self._lock:
            self._enqueues += 1
            return every is not None and self._enqueues % every == 0

"""Failures injected on request (``[runtime.options.sim]``): failed or slow executions, an
asynchronous execution that fails on the device, a full tdt queue, failed WithQ loads, or any
API returning a chosen code."""

from __future__ import annotations

import threading
import time
from collections import Counter

from streamer.runtime.acl.options import SimOptions

__all__ = ["Faults"]


class Faults:
    """Counters and switches of the injected failures; thread-safe.

    Args:
        options: ``fail_every_n_executes``, ``task_fail_every_n_executes``,
            ``device_lost_after_n_executes``, ``execute_delay_ms``,
            ``queue_full_every_n_enqueues``, ``with_q_load_fails_after_n_loads`` and
            ``fail_calls``.
    """

    def __init__(self, options: SimOptions) -> None:
        self._options = options
        self._lock = threading.Lock()
        self._executions = 0
        self._per_device: Counter[int] = Counter()
        self._enqueues = 0
        self._async_executions = 0
        self._with_q_loads = 0

    def injected_code(self, api: str) -> int | None:
        """The code every call of ``api`` returns (``fail_calls``), or None."""
        return self._options.fail_calls.get(api)

    def execution_fails(self, device: int) -> bool:
        """Count one model execution on ``device``; True for every
        ``fail_every_n_executes``-th, and for every one on a device past its
        ``device_lost_after_n_executes`` (a device lost, as after a reset)."""
        every = self._options.fail_every_n_executes
        lost_after = self._options.device_lost_after_n_executes.get(device)
        with self._lock:
            self._executions += 1
            self._per_device[device] += 1
            if lost_after is not None and self._per_device[device] > lost_after:
                return True
            return every is not None and self._executions % every == 0

    def task_fails(self) -> bool:
        """Count one accepted ``execute_async``; True for every
        ``task_fail_every_n_executes``-th (its task fails on the device)."""
        every = self._options.task_fail_every_n_executes
        with self._lock:
            self._async_executions += 1
            return every is not None and self._async_executions % every == 0

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

    def with_q_load_fails(self) -> bool:
        """Count one ``aclmdlLoadFromFileWithQ``; True for every one after the first
        ``with_q_load_fails_after_n_loads``."""
        after = self._options.with_q_load_fails_after_n_loads
        with self._lock:
            self._with_q_loads += 1
            return after is not None and self._with_q_loads > after

"""Model replicas and the dispatcher that spreads batches over them (several devices).

A stage's model is loaded once per device and ``replicas`` times on each. Every replica has
its own enqueue thread (:class:`~streamer.scheduling.enqueuer.Enqueuer`, the only thread that
enqueues into that model) and dequeue thread. The batcher hands each batch to the
:class:`Dispatcher`, which sends it to the live replica with the fewest batches in flight.

A replica whose device fails (its enqueue or dequeue raises :class:`BackendError`, or
``max_consecutive_failures`` executions fail in a row) is taken out of rotation with one
logged event; the batches it holds (and any its enqueue thread is waiting to enqueue) get
error results and the other replicas carry on. When
no replica of a stage is left, the dispatcher raises and the daemon stops.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Sequence
from typing import Any

import structlog

from streamer.errors import BackendError, FrameError, Reason
from streamer.frames import Batch
from streamer.runtime.base import QueueModel, Tensor

__all__ = ["Dispatcher", "Replica", "every_replica_failed"]

_POLL_S = 0.1
_log = structlog.get_logger(__name__)


class Replica:
    """One loaded model on one device, and the state its two threads share.

    Args:
        index: position among the stage's replicas (names threads and logs).
        device: the device id it runs on.
        model: the loaded model.

    Attributes:
        submit: batches from the dispatcher to the enqueue thread (one waits at most).
        ledger: batches the enqueue thread enqueued, in order, for the dequeue thread.
        failed: why the replica was taken out of rotation, or None while it serves.
    """

    def __init__(self, index: int, device: int, model: QueueModel) -> None:
        self.index = index
        self.device = device
        self.model = model
        self.submit: queue.Queue[Any] = queue.Queue(maxsize=1)
        self.ledger: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self.failed: str | None = None
        self.executed = 0
        """Batches it executed successfully (a counter, written by its dequeue thread)."""
        self._lock = threading.Lock()
        self._in_flight = 0

    @property
    def name(self) -> str:
        return f"{self.model.info.name}-{self.index}"

    @property
    def in_flight(self) -> int:
        """Batches dispatched here and not yet dequeued."""
        return self._in_flight

    def took(self) -> None:
        with self._lock:
            self._in_flight += 1

    def finished(self) -> None:
        with self._lock:
            self._in_flight -= 1

    def fail(self, reason: str) -> None:
        """Take the replica out of rotation (logged once); any thread.

        Its model is interrupted: an enqueue waiting for room that the failed device will
        never make (queue mode frees a slot only when an output comes) then returns, and
        the batches it and the dispatcher hold get error results too.
        """
        with self._lock:
            if self.failed is not None:
                return
            self.failed = reason
        self.model.interrupt()
        _log.error("replica_failed", replica=self.name, device=self.device, reason=reason)

    def refuse(self, batch: Batch) -> None:
        """Fail a batch this replica can no longer run."""
        error = FrameError(Reason.INFERENCE_FAILED, f"device {self.device}: {self.failed}")
        for frame in batch.good:
            frame.fail(error)
        batch.good = []


def every_replica_failed(replicas: list[Replica]) -> str:
    """The message for a stage with no replica left: each device and why it failed."""
    reasons = "; ".join(f"device {r.device}: {r.failed}" for r in replicas)
    return f"model {replicas[0].model.info.name!r}: every replica failed ({reasons})"


class Dispatcher:
    """Sends each batch to the live replica with the fewest batches in flight.

    Only the batcher thread calls :meth:`dispatch` and :meth:`broadcast`.

    Args:
        replicas: the stage's replicas.
        abort: set when the pipeline gives up; a blocked dispatch then returns.
    """

    def __init__(self, replicas: list[Replica], abort: threading.Event) -> None:
        self.replicas = replicas
        self._abort = abort
        self._next = 0

    def dispatch(self, batch: Batch, inputs: Sequence[Tensor], device: int | None = None) -> None:
        """Queue ``batch`` (its model ``inputs``) on the least busy live replica, on
        ``device`` when given (inputs in that device's memory).

        Raises:
            BackendError: every replica of the stage has failed, or every one on ``device``.
        """
        while not self._abort.is_set():
            replica = self._pick(device)
            replica.took()
            try:
                replica.submit.put((batch, inputs), timeout=_POLL_S)
                return
            except queue.Full:
                replica.finished()

    def broadcast(self, marker: Any) -> None:
        """Queue a marker (stop, model swap) on every replica, failed ones included."""
        for replica in self.replicas:
            while not self._abort.is_set():
                try:
                    replica.submit.put(marker, timeout=_POLL_S)
                    break
                except queue.Full:
                    continue

    def _pick(self, device: int | None) -> Replica:
        live = [r for r in self.replicas if r.failed is None]
        if not live:
            raise BackendError(every_replica_failed(self.replicas))
        if device is not None:
            live = [r for r in live if r.device == device]
            if not live:
                raise BackendError(f"no live replica on device {device}")
        self._next = (self._next + 1) % len(live)
        rotated = live[self._next :] + live[: self._next]
        return min(rotated, key=lambda r: r.in_flight)

"""The enqueue thread of one replica: the only thread that enqueues into its model.

ACL's queue mode requires all enqueues of a model (all of its inputs) from one thread
(``acltdtEnqueueData``); the same shape is kept on every backend.
"""

from __future__ import annotations

import queue
import threading
import time
from typing import Any

from streamer.errors import BackendError
from streamer.frames import STOP, Batch
from streamer.lifecycle import Worker
from streamer.scheduling.replica import Replica
from streamer.scheduling.swap import StageSwap

__all__ = ["Enqueuer"]

_POLL_S = 0.1


class Enqueuer(Worker):
    """Takes dispatched batches, enqueues them, records them in the replica's ledger.

    Args:
        replica: the replica it feeds.
        abort: set when the pipeline gives up draining.
    """

    def __init__(self, replica: Replica, abort: threading.Event) -> None:
        super().__init__(name=f"enqueue-{replica.name}")
        self._replica = replica
        self._abort = abort

    def setup(self) -> None:
        self._replica.model.attach_thread()

    def loop(self) -> None:
        replica = self._replica
        while not self._abort.is_set():
            try:
                item: Any = replica.submit.get(timeout=_POLL_S)
            except queue.Empty:
                continue
            if item is STOP:
                replica.ledger.put(STOP)
                return
            if isinstance(item, StageSwap):
                replica.ledger.put(item)
                replica.model = item.models[replica.index]
                replica.model.attach_thread()
                continue
            batch, stacked = item
            self._enqueue(batch, stacked)

    def _enqueue(self, batch: Batch, stacked: Any) -> None:
        replica = self._replica
        if replica.failed is None:
            for frame in batch.good:
                frame.batched_at_ns = time.monotonic_ns()
            try:
                replica.model.enqueue([stacked])
            except BackendError as exc:
                replica.fail(str(exc))
        if replica.failed is not None:
            replica.refuse(batch)
        replica.ledger.put(batch)

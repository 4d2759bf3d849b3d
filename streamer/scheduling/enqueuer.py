"""The enqueue thread of one replica: the only thread that enqueues into its model.

ACL's queue mode requires all enqueues of a model (all of its inputs) from one thread
(``acltdtEnqueueData``); the same shape is kept on every backend.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Sequence
from typing import Any

from streamer.errors import BackendError
from streamer.frames import STOP, Batch
from streamer.lifecycle import Worker
from streamer.runtime.base import Tensor, release_inputs
from streamer.scheduling.replica import Replica

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
            batch, inputs = item
            self._enqueue(batch, inputs)

    def _enqueue(self, batch: Batch, inputs: Sequence[Tensor]) -> None:
        """Enqueue, or refuse the batch on a failed replica (its device inputs released)."""
        replica = self._replica
        if replica.failed is not None:
            release_inputs(inputs)
        else:
            for frame in batch.good:
                frame.batched_at_ns = time.monotonic_ns()
            try:
                replica.model.enqueue(inputs)
            except BackendError as exc:
                if self._abort.is_set():  # interrupted: the chain was given up
                    return
                replica.fail(str(exc))
        if replica.failed is not None:
            replica.refuse(batch)
        replica.ledger.put(batch)

"""The enqueue thread of one replica: the only thread that enqueues into its model.

ACL's queue mode requires all enqueues of a model (all of its inputs) from one thread
(``acltdtEnqueueData``); the same shape is kept on every backend.
"""

from __future__ import annotations

import queue
import threading
import time
from typing import Any

from streamer.errors import BackendError, EnqueueInterruptedError
from streamer.frames import STOP
from streamer.lifecycle import Worker
from streamer.runtime.base import release_inputs
from streamer.scheduling.replica import Dispatched, Replica

__all__ = ["Enqueuer"]

_POLL_S = 0.1


class Enqueuer(Worker):
    """Takes dispatched batches, enqueues them, records them in the replica's ledger.

    On a replica out of rotation it enqueues nothing. A failed one's batches are retried on
    another replica (put in that one's submit queue, whose enqueue thread enqueues it) or
    failed. A recovering one's (:mod:`~streamer.scheduling.recovery`) never ran, so they move
    once to a replica in rotation without using their retry, or wait until one is back (this
    one included; one that moved before waits for this one): a lost output costs its own
    batch, not the ones queued behind it. That holds for a ``tensor`` chain's batch too, whose
    inputs are device tensors: a queue-mode enqueue the recovery interrupts hands them back
    (:class:`~streamer.errors.EnqueueInterruptedError`) instead of releasing them.

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
            self._enqueue(item)

    def _enqueue(self, dispatched: Dispatched) -> None:
        """Enqueue; on a recovering replica move the batch, or wait; on a failed one refuse
        it: another replica takes it (it then leaves this one), or its frames fail (its
        device inputs released). Only a batch the model took is in its ledger."""
        replica = self._replica
        while True:
            with replica.enqueue_lock:  # a recovery reloads the model only while it is free
                entered = replica.in_rotation
                taken = self._into_model(dispatched) if entered else False
            if taken is None:  # interrupted: the chain was given up
                return
            if taken:
                replica.ledger.put(dispatched)
                return
            if replica.dispatcher is None or not self._movable(dispatched):
                break
            if self._abort.is_set():
                return
            if replica.in_rotation:  # back from its recovery already
                continue
            if replica.dispatcher.move(dispatched, replica):
                replica.finished()
                return
            # A poll passed with no replica to take it: this one may be back in rotation.
        if not dispatched.released:
            release_inputs(dispatched.inputs)  # device tensors only: never retried
        if replica.refuse(dispatched):
            replica.finished()
            return
        replica.ledger.put(dispatched)

    def _movable(self, dispatched: Dispatched) -> bool:
        """Whether a batch the model did not take never ran and may still run, elsewhere or
        here once the replica is back: it has not failed (it is recovering, or back from
        it), and the model did not release its device inputs. One that moved before waits
        for this replica (:meth:`Dispatcher.move`)."""
        return self._replica.failed is None and not dispatched.released

    def _into_model(self, dispatched: Dispatched) -> bool | None:
        """The model's ``enqueue``: True if it took the batch; False if it raised (which
        fails the replica, unless a recovery interrupted it; the device inputs are then
        released unless it was an :class:`EnqueueInterruptedError`); None if it raised as
        the chain was given up."""
        if not dispatched.retried:  # a retry's wait in the batcher ended at its first enqueue
            now = time.monotonic_ns()
            for frame in dispatched.batch.good:
                frame.batched_at_ns = now
        try:
            self._replica.model.enqueue(dispatched.inputs)
        except BackendError as exc:
            interrupted = isinstance(exc, EnqueueInterruptedError)
            dispatched.released = not (interrupted or dispatched.host_inputs)
            if self._abort.is_set():
                return None
            if self._replica.recovering is None:
                self._replica.fail(str(exc))
            return False
        return True

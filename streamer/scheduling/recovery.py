"""Recovery of a replica whose model lost an output: reload the model, back into rotation.

In ACL queue mode an execution that fails on the device returns no output, and the model
raises :class:`~streamer.errors.OutputLostError` once ``result_timeout_ms`` has passed
(:mod:`streamer.runtime.acl.model_queue`). Only a freshly loaded model on fresh queues is
sure to give no later output to the wrong batch, so the replica recovers by reloading its
model (:meth:`~streamer.runtime.base.QueueModel.reload`):

1. its dequeue thread, which found the loss, takes it out of rotation
   (:meth:`~streamer.scheduling.replica.Replica.begin_recovery`), which interrupts the model:
   an enqueue waiting for the slot the lost batch holds returns;
2. the lost batch is retried on another replica, or fails, as any failed execution; it
   counts as one, so a replica with ``max_consecutive_failures`` failed executions in a
   row, lost outputs and recoveries included, leaves rotation for good instead;
3. the dequeue thread takes the replica's ``enqueue_lock``, which the enqueue thread holds
   only while in the model's ``enqueue``, and reloads the model with it held: neither
   thread touches the old queues meanwhile, and the enqueue thread moves every batch it
   takes while the replica is out of rotation to a replica in rotation, or waits for one
   (this one included): those batches never ran, so they keep their retry;
4. the replica goes back into rotation (``replica_recovered``), or, when the reload failed,
   leaves it for good (``replica_failed``).

The dequeue thread reloads because it is the thread that found the loss and holds no model
call then; the model's context is current on it (:meth:`attach_thread`). A recovery that
finds the chain given up (``abort``) stops where it is: the model keeps what it holds, old
or new, and its close releases it.
"""

from __future__ import annotations

import threading
import time

import structlog

from streamer.errors import BackendError
from streamer.scheduling.replica import Replica

__all__ = ["recover"]

_POLL_S = 0.1
_log = structlog.get_logger(__name__)


def recover(replica: Replica, abort: threading.Event) -> None:
    """Reload the model of a replica that :meth:`~Replica.begin_recovery` took out of
    rotation, and put it back (steps 3 and 4 of the module docstring); nothing if it has
    failed for good meanwhile. Its dequeue thread's, after the lost batch was handed on.

    Logs ``replica_recovering`` (warning) as it starts, then ``replica_recovered`` (info:
    the reload's duration, ``reload_ms``) or, by :meth:`~Replica.fail`, ``replica_failed``.
    """
    if replica.failed is not None:
        return
    _log.warning(
        "replica_recovering",
        model=replica.model.info.name,
        replica=replica.name,
        device=replica.device,
        consecutive=replica.failures,
        reason=replica.recovering,
    )
    if not _hold_enqueues(replica, abort):
        return
    started_ns = time.monotonic_ns()
    try:
        reloaded = _reload(replica, abort) and replica.recovered()
        if not reloaded:
            replica.model.interrupt()  # the reload ended an interrupt that still holds
    finally:
        replica.enqueue_lock.release()
    if reloaded:
        _log.info(
            "replica_recovered",
            model=replica.model.info.name,
            replica=replica.name,
            device=replica.device,
            reload_ms=round((time.monotonic_ns() - started_ns) / 1e6, 1),
        )


def _hold_enqueues(replica: Replica, abort: threading.Event) -> bool:
    """Take ``replica.enqueue_lock`` once its enqueue thread has left the (interrupted)
    model; False on abort."""
    while not replica.enqueue_lock.acquire(timeout=_POLL_S):
        if abort.is_set():
            return False
    if abort.is_set():
        replica.enqueue_lock.release()
        return False
    return True


def _reload(replica: Replica, abort: threading.Event) -> bool:
    """Reload the model; a failed reload takes the replica out for good. True if the model
    was reloaded and the chain is not given up."""
    try:
        replica.model.reload()
    except BackendError as exc:
        if not abort.is_set():
            replica.fail(f"reload after a lost output failed: {exc}")
        return False
    return not abort.is_set()

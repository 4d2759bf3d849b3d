"""Model replicas and the dispatcher that spreads batches over them (several devices).

A stage's model is loaded once per device and ``replicas`` times on each. Every replica has
its own enqueue thread (:class:`~streamer.scheduling.enqueuer.Enqueuer`, the only thread that
enqueues into that model) and dequeue thread. The batcher hands each batch to the
:class:`Dispatcher`, which sends it to the live replica with the fewest batches in flight.

A replica whose last :data:`STREAK_FAILURES` executions failed is on a *failure streak*: a
lost device fails at once, so its replica always has the fewest batches in flight, and would
otherwise draw most batches. While another live replica has no streak, the dispatcher sends it
only a *probe* batch, at most one per :data:`PROBE_INTERVAL_S`; a success ends the streak. One
failure alone (a transient fault) sidelines nothing. A batch that fails on a replica (its
execution failed, or the replica left rotation holding it) runs once more on another live
replica, one without a streak if there is one, its frames failing only if none takes it or
it fails there too; so a probe costs no frame. Batches whose inputs are device tensors (a
``tensor`` chain) live on one device and are not retried.

A replica whose device fails (its enqueue or dequeue raises :class:`BackendError`, or
``max_consecutive_failures`` executions fail in a row) is taken out of rotation with one
logged event; the batches it holds (and any its enqueue thread is waiting to enqueue) run on
another replica as above, or get error results, and the other replicas carry on. When no
replica of a stage is left, the dispatcher raises and the daemon stops; so it does when a
``tensor`` chain has no device left with a replica of each of its stages
(:mod:`~streamer.scheduling.device_paths`).

A replica whose model lost an output (ACL queue mode) is *recovering*: out of rotation as a
failed one is, while its dequeue thread reloads the model
(:mod:`~streamer.scheduling.recovery`); then it is back in rotation. Its lost batch is retried
as a failed one; the batches queued behind it never ran, so they move to a replica in
rotation without using their retry (:meth:`Dispatcher.move`), or wait for one to come back.
It does not count as failed: while every replica of a stage is recovering, dispatches wait
for one to come back.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import structlog

from streamer.errors import BackendError, FrameError, Reason
from streamer.frames import Batch
from streamer.log_budget import LogBudget
from streamer.runtime.base import QueueModel, Tensor
from streamer.scheduling.chain import stage_error

__all__ = [
    "PROBE_INTERVAL_S",
    "RETRY_WAIT_S",
    "STREAK_FAILURES",
    "Dispatched",
    "Dispatcher",
    "Replica",
    "every_replica_failed",
]

STREAK_FAILURES = 2
"""Executions failed in a row that put a replica on a failure streak (spared by the
dispatcher): two, so that one transient failure sidelines no replica, while a lost device,
failing every execution, draws one more batch at most."""
PROBE_INTERVAL_S = 1.0
"""Least time (s) between two probe batches to a replica on a failure streak while another
replica serves: a device back from a transient fault is in use again within about a second,
and one that stays broken costs one retried batch a second (no frame) until
``max_consecutive_failures`` failed probes take it out of rotation."""
RETRY_WAIT_S = 1.0
"""Longest time (s) a failed batch waits for room at a replica to retry on, or for one back in
rotation (recovering), before its frames fail: bounded, so that replicas retrying into each
other cannot deadlock. Room comes as soon as a replica's enqueue thread takes its next batch
(one execution's time, far less than this); a result that still comes after the reorder
timeout (half ``stall_timeout_s`` by default; on ACL 4 x ``result_timeout_ms`` + 1 s more) is
published out of order, not lost."""
_POLL_S = 0.1
_RETRY_LINES = LogBudget("batch_retried")
"""Every stage's ``batch_retried`` warnings, together."""
_log = structlog.get_logger(__name__)


@dataclass(slots=True, eq=False)
class Dispatched:
    """A batch on its way through a replica: its submit queue, then its ledger.

    Attributes:
        batch: the batch.
        inputs: its model inputs, one per model input, batch first; kept until the dequeue
            so that a failed batch can run again on another replica.
        retried: it failed once already and runs on its second replica.
        moved: a recovering replica handed it on once, unrun (:meth:`Dispatcher.move`).
        released: a model's enqueue that did not take it released its device inputs: it
            can run nowhere.
    """

    batch: Batch
    inputs: Sequence[Tensor]
    retried: bool = False
    moved: bool = False
    released: bool = False

    @property
    def host_inputs(self) -> bool:
        """Every input a host array (a device tensor lives on one device, in memory of the
        model that made it)."""
        return all(isinstance(t, np.ndarray) for t in self.inputs)

    @property
    def retryable(self) -> bool:
        """Not retried yet, and every input a host array."""
        return not self.retried and self.host_inputs


class Replica:
    """One loaded model on one device, and the state its two threads share.

    Args:
        index: position among the stage's replicas (names threads and logs).
        device: the device id it runs on.
        model: the loaded model.

    Attributes:
        submit: :class:`Dispatched` batches for the enqueue thread (one waits at most).
        ledger: :class:`Dispatched` batches the enqueue thread enqueued, in order, for the
            dequeue thread.
        failed: why the replica was taken out of rotation for good, or None.
        recovering: why it is out of rotation while its model is reloaded, or None.
        enqueue_lock: held by its enqueue thread while it enqueues into the model, and by a
            recovery while it reloads the model, so that the two never overlap.
        dispatcher: the stage's dispatcher, which retries its failed batches elsewhere (set
            by the :class:`Dispatcher`).
    """

    def __init__(self, index: int, device: int, model: QueueModel) -> None:
        self.index = index
        self.device = device
        self.model = model
        self.submit: queue.Queue[Any] = queue.Queue(maxsize=1)
        self.ledger: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self.failed: str | None = None
        self.recovering: str | None = None
        self.enqueue_lock = threading.Lock()
        self.dispatcher: Dispatcher | None = None
        self.executed = 0
        """Batches it executed successfully (a counter, written by its dequeue thread)."""
        self.failures = 0
        """Its executions that failed in a row, up to now (written by its dequeue thread)."""
        self.retried = 0
        """Batches that failed here and were handed to another replica (a counter)."""
        self.recoveries = 0
        """Times its model was reloaded after a lost output and it went back into rotation
        (a counter)."""
        self._lock = threading.Lock()
        self._in_flight = 0
        self._probe_at_ns = 0

    @property
    def name(self) -> str:
        return f"{self.model.info.name}-{self.index}"

    @property
    def in_rotation(self) -> bool:
        """Neither failed nor recovering: the dispatcher may send it batches."""
        return self.failed is None and self.recovering is None

    @property
    def in_flight(self) -> int:
        """Batches dispatched here and not yet dequeued or handed on."""
        return self._in_flight

    @property
    def on_streak(self) -> bool:
        """Its last :data:`STREAK_FAILURES` executions failed."""
        return self.failures >= STREAK_FAILURES

    def took(self) -> None:
        with self._lock:
            self._in_flight += 1
        if self.dispatcher is not None:
            self.dispatcher.count_in_flight(1)

    def finished(self) -> None:
        with self._lock:
            self._in_flight -= 1
        if self.dispatcher is not None:
            self.dispatcher.count_in_flight(-1)
            self.dispatcher.settle()

    def execution_succeeded(self) -> None:
        """Count one successful execution, which ends any failure streak; its dequeue
        thread."""
        with self._lock:
            self.executed += 1
            self.failures = 0

    def execution_failed(self) -> int:
        """Count one failed execution; its dequeue thread. The one that begins a streak makes
        its first probe due :data:`PROBE_INTERVAL_S` later.

        Returns:
            the executions failed in a row, this one included.
        """
        with self._lock:
            self.failures += 1
            if self.failures == STREAK_FAILURES:
                self._probe_at_ns = time.monotonic_ns() + int(PROBE_INTERVAL_S * 1e9)
            return self.failures

    def take_probe(self, now_ns: int) -> bool:
        """Whether it is on a streak and its probe is due at ``now_ns`` (monotonic ns); if
        so the next one is due :data:`PROBE_INTERVAL_S` later. The batcher thread's."""
        with self._lock:
            if self.failures < STREAK_FAILURES or now_ns < self._probe_at_ns:
                return False
            self._probe_at_ns = now_ns + int(PROBE_INTERVAL_S * 1e9)
            return True

    def fail(self, reason: str) -> None:
        """Take the replica out of rotation (logged once); any thread.

        Its model is interrupted: an enqueue waiting for room that the failed device will
        never make (queue mode frees a slot only when an output comes) then returns, and
        the batches it and the dispatcher hold are retried or get error results too.
        """
        with self._lock:
            if self.failed is not None:
                return
            self.failed = reason
        self.model.interrupt()
        _log.error("replica_failed", replica=self.name, device=self.device, reason=reason)

    def begin_recovery(self, lost: str) -> None:
        """Take the replica out of rotation while its model is reloaded (``lost``: the
        lost output's error); its dequeue thread. Its model is interrupted, as by
        :meth:`fail`, so that an enqueue waiting for the slot the lost output holds returns,
        and the enqueue thread lets go of :attr:`enqueue_lock`."""
        with self._lock:
            self.recovering = f"reloading its model after a lost output: {lost}"
        self.model.interrupt()

    def recovered(self) -> bool:
        """Put the replica back in rotation after its model was reloaded, counting one
        recovery, unless it failed meanwhile; its dequeue thread.

        Returns:
            True if it is back in rotation.
        """
        with self._lock:
            if self.failed is not None:
                return False
            self.recovering = None
            self.recoveries += 1
        if self.dispatcher is not None:
            self.dispatcher.settle()  # a dispatch may be waiting for a replica to come back
        return True

    def retry_elsewhere(self, dispatched: Dispatched, error: FrameError) -> bool:
        """Queue a batch that failed here (with ``error``) on another replica of the stage
        (:meth:`Dispatcher.retry`); its enqueue or dequeue thread. True if one took it: the
        caller leaves the batch to it and counts it :meth:`finished` here."""
        return self.dispatcher is not None and self.dispatcher.retry(dispatched, self, error)

    def refuse(self, dispatched: Dispatched) -> bool:
        """Retry on another replica, else fail, a batch this replica can no longer run.

        Returns:
            True if another replica took it (as :meth:`retry_elsewhere`); False if its
            frames failed.
        """
        why = self.failed or self.recovering
        error = FrameError(Reason.INFERENCE_FAILED, f"device {self.device}: {why}")
        if self.retry_elsewhere(dispatched, error):
            return True
        named = stage_error(self.model.info.name, error)
        batch = dispatched.batch
        for frame in batch.good:
            frame.fail(named)
        batch.good = []
        return False


def every_replica_failed(replicas: list[Replica]) -> str:
    """The message for a stage with no replica left: each device and why it failed."""
    reasons = "; ".join(f"device {r.device}: {r.failed}" for r in replicas)
    return f"model {replicas[0].model.info.name!r}: every replica failed ({reasons})"


class Dispatcher:
    """Sends each batch to the live replica with the fewest batches in flight, sparing
    replicas on a failure streak (module docstring), and retries failed batches.

    Only the batcher thread calls :meth:`dispatch` and :meth:`broadcast`; the replicas'
    enqueue and dequeue threads call :meth:`retry`.

    Args:
        replicas: the stage's replicas; each gets this dispatcher as its ``dispatcher``.
        abort: set when the pipeline gives up; a blocked dispatch or retry then returns.
    """

    def __init__(self, replicas: list[Replica], abort: threading.Event) -> None:
        self.replicas = replicas
        self._abort = abort
        self._next = 0
        self._settled = threading.Condition()  # notified as batches leave replicas
        self._count_lock = threading.Lock()  # the replicas' ``retried`` counters, in_flight
        self._in_flight = 0
        for replica in replicas:
            replica.dispatcher = self

    def dispatch(self, batch: Batch, inputs: Sequence[Tensor], device: int | None = None) -> None:
        """Queue ``batch`` (its model ``inputs``) on the least busy live replica, on
        ``device`` when given (inputs in that device's memory); while the only ones not
        failed are recovering, wait for one to come back (or for abort).

        Raises:
            BackendError: every replica of the stage has failed, or every one on ``device``.
        """
        dispatched = Dispatched(batch, inputs)
        while not self._abort.is_set():
            replica = self._pick(device)
            if replica is None:
                with self._settled:
                    self._settled.wait(_POLL_S)
                continue
            replica.took()
            try:
                replica.submit.put(dispatched, timeout=_POLL_S)
                return
            except queue.Full:
                replica.finished()

    @property
    def in_flight(self) -> int:
        """Batches in flight on the stage's replicas, together. A batch handed from one
        replica to another is counted by its target before its source lets go, so this is
        never 0 while one moves (the replicas' own counts, read one after the other, could
        each miss it)."""
        return self._in_flight

    def count_in_flight(self, change: int) -> None:
        """Add ``change`` to :attr:`in_flight`; a replica's :meth:`~Replica.took` and
        :meth:`~Replica.finished`."""
        with self._count_lock:
            self._in_flight += change

    def broadcast(self, marker: Any) -> None:
        """Queue a marker (stop) on every replica, failed ones included, once no batch is in
        flight on any (:attr:`in_flight`): an enqueue thread ends at the marker, and a batch
        retried after it would never run. Returns at once on abort."""
        with self._settled:
            while not self._abort.is_set() and self._in_flight:
                self._settled.wait(_POLL_S)
        for replica in self.replicas:
            while not self._abort.is_set():
                try:
                    replica.submit.put(marker, timeout=_POLL_S)
                    break
                except queue.Full:
                    continue

    def retry(self, dispatched: Dispatched, source: Replica, error: FrameError) -> bool:
        """Queue a batch that failed on ``source`` (with ``error``) on another live replica
        without a failure streak, the least busy, preferably on another device; once per
        batch, and only with host inputs; logs ``batch_retried`` (budgeted). Called by
        ``source``'s threads while the batch still counts in flight there. Waits at most
        :data:`RETRY_WAIT_S` for room or for a replica back in rotation, less on abort.

        Returns:
            True if queued: the target counts it in flight and its threads finish it; False
            if not (retried before, device inputs, no replica with room in time): the caller
            fails its frames.
        """
        if not dispatched.retryable:
            return False
        frames = len(dispatched.batch.good)  # the target may finish it before the log line
        retried = Dispatched(dispatched.batch, dispatched.inputs, True)
        deadline = time.monotonic() + RETRY_WAIT_S
        target = self._place(retried, lambda: self._retry_target(source), deadline, source)
        if target is None:
            return False
        with self._count_lock:
            source.retried += 1
        _log_retry(frames, source, target, error)
        return True

    def move(self, dispatched: Dispatched, source: Replica) -> bool:
        """Queue a batch that ``source`` took while recovering and never ran on another
        replica in rotation: one without a streak first, then one with room, then the least
        busy (on ``source``'s device when its inputs are device tensors); its retry stays
        unused. The calling enqueue thread's; waits one poll at most, for room or a replica
        back in rotation.

        A batch moves once (a moved one waits for the replica it moved to, whose reload is
        short), so that it waits behind two lost outputs at most besides its own and its
        retry's, and its results still come within the reorder timeout.

        Returns:
            True if queued: the target counts it in flight and its threads finish it; False
            if it moved before (at once), or no replica took it within the poll.
        """
        if dispatched.moved:
            with self._settled:
                self._settled.wait(_POLL_S)  # for the replica it is on to come back
            return False
        dispatched.moved = True

        def pick() -> Replica | None:
            others = [
                r
                for r in self.replicas
                if r is not source
                and r.in_rotation
                and (dispatched.host_inputs or r.device == source.device)
            ]
            return min(
                others, key=lambda r: (r.on_streak, r.submit.full(), r.in_flight), default=None
            )

        if self._place(dispatched, pick, time.monotonic() + _POLL_S) is not None:
            return True
        dispatched.moved = False
        return False

    def settle(self) -> None:
        """A batch left a replica (dequeued, or handed on), or a replica came back into
        rotation: wake a :meth:`broadcast` waiting for the stage to have none in flight, or a
        :meth:`dispatch` waiting for a replica; any thread."""
        with self._settled:
            self._settled.notify_all()

    def _retry_target(self, source: Replica) -> Replica | None:
        """The live replica other than ``source`` to retry on: one without a streak first,
        then one with room in its submit queue (a full one's enqueue thread is held up,
        maybe behind an output its model will lose), then one on another device than
        ``source`` (its other replicas share a fault of the device), then the fewest batches
        in flight."""
        others = [r for r in self.replicas if r is not source and r.in_rotation]
        return min(
            others,
            key=lambda r: (r.on_streak, r.submit.full(), r.device == source.device, r.in_flight),
            default=None,
        )

    def _place(
        self,
        dispatched: Dispatched,
        pick: Callable[[], Replica | None],
        deadline: float,
        source: Replica | None = None,
    ) -> Replica | None:
        """Put ``dispatched`` in the submit queue of the replica ``pick`` names, picked anew
        at each poll (one may leave rotation, or stay full behind an output it will lose),
        until ``deadline`` (``time.monotonic()``); while it names none, wait for a replica to
        come back into rotation (with ``source``: only while one other than ``source`` is
        recovering, else give up at once). The replica that took it, or None."""
        while not self._abort.is_set():
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            target = pick()
            if target is None:
                if source is not None and not self._others_recovering(source):
                    return None
                with self._settled:
                    self._settled.wait(min(left, _POLL_S))
                continue
            target.took()
            try:
                target.submit.put(dispatched, timeout=min(left, _POLL_S))
            except queue.Full:
                target.finished()
                continue
            return target
        return None

    def _others_recovering(self, source: Replica) -> bool:
        return any(r.recovering and not r.failed for r in self.replicas if r is not source)

    def _pick(self, device: int | None) -> Replica | None:
        """The replica for the next batch (on ``device`` when given); None while every one
        not failed is recovering.

        Raises:
            BackendError: every replica has failed, or every one on ``device``.
        """
        live = [r for r in self.replicas if r.failed is None]
        if not live:
            raise BackendError(every_replica_failed(self.replicas))
        if device is not None:
            live = [r for r in live if r.device == device]
            if not live:
                raise BackendError(f"no live replica on device {device}")
        live = [r for r in live if r.recovering is None]
        if not live:
            return None
        serving = [r for r in live if not r.on_streak]
        if serving:
            now_ns = time.monotonic_ns()
            probe = next((r for r in live if r.on_streak and r.take_probe(now_ns)), None)
            if probe is not None:
                return probe
            live = serving
        self._next = (self._next + 1) % len(live)
        rotated = live[self._next :] + live[: self._next]
        return min(rotated, key=lambda r: r.in_flight)


def _log_retry(frames: int, source: Replica, target: Replica, error: FrameError) -> None:
    """A ``batch_retried`` warning, budgeted: 10 lines per 10 s over every stage."""
    if (suppressed := _RETRY_LINES.take()) is not None:
        _log.warning(
            "batch_retried",
            model=source.model.info.name,
            replica=source.name,
            device=source.device,
            to_replica=target.name,
            to_device=target.device,
            frames=frames,
            detail=error.detail,
            suppressed=suppressed,
        )

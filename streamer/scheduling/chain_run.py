"""The threads and queues of one running chain of model stages.

A :class:`ChainRun` is built from the loaded stages of a chain: per stage a batcher, and per
replica an enqueue and a dequeue thread; stage 0's batcher reads the pipeline's admission
queue, every later stage has an inbox of its own that the :class:`ChainRouter` fills, and the
router sends what leaves the last stage to egress. A pipeline runs one chain, and a reload
replaces the whole chain with a new one (:mod:`streamer.scheduling.swap`): the two are
separate sets of threads that share only the admission queue and egress.

Each chain has its own ``abort`` event, so a retired chain stuck on its models can be given
up without stopping the one in service; the frames it holds then are counted as dropped at
once (:class:`~streamer.scheduling.held_frames.HeldFrames`), so that their sources go on.

On a backend with device memory the replicas of a tensor-linked run keep to the devices that
still have a path through it (:mod:`streamer.scheduling.device_paths`).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from typing import Any, Protocol

from streamer.errors import BackendError
from streamer.frames import STOP, Batch, Frame, OutcomeCounts
from streamer.lifecycle import Worker
from streamer.release import close_all
from streamer.runtime.base import QueueModel, Tensor
from streamer.scheduling.batcher import Batcher
from streamer.scheduling.chain import ChainRouter, ChainStage
from streamer.scheduling.dequeuer import Dequeuer
from streamer.scheduling.device_paths import DevicePaths
from streamer.scheduling.enqueuer import Enqueuer
from streamer.scheduling.held_frames import HeldFrames
from streamer.scheduling.mailbox import Mailbox
from streamer.scheduling.policy import BatchPolicy
from streamer.scheduling.replica import Dispatcher, Replica, every_replica_failed
from streamer.vision.stages import ItemStage

__all__ = ["ChainRun", "LoadedStage"]

_JOIN_SLICE_S = 0.1


class LoadedStage(Protocol):
    """What a chain run needs of one loaded stage (the pipeline's ``ModelStage``)."""

    models: list[tuple[int, QueueModel]]
    policy: BatchPolicy
    items: ItemStage | None

    @property
    def name(self) -> str:
        """The stage's (model's) name."""

    @property
    def tensor_fed(self) -> bool:
        """Whether it reads its upstream's outputs through the ``tensor`` adapter."""

    def postprocess_batch(self, outputs: Sequence[Tensor], frames: list[Frame]) -> None:
        """The dequeue threads' postprocess."""

    def close(self) -> None:
        """Close the stage's models."""


class ChainRun:
    """One chain's threads, queues and router.

    Args:
        stages: the loaded stages, in chain order.
        admission: the queue stage 0's batcher reads.
        results: egress's queue.
        counts: outcome counters: a give-up counts the frames the chain holds as dropped.
        on_drop: told about each frame a give-up drops (egress's reorder buffer's ``skip``).
        max_consecutive_failures: see :class:`~streamer.scheduling.dequeuer.Dequeuer`.
        device_memory: the backend keeps the tensors a stage hands on in device memory
            (:attr:`~streamer.runtime.base.Backend.device_memory`): each batch of a
            tensor-linked run then runs on one device.
        observe_batch: told of each batch a model of the chain executed, from that
            replica's dequeue thread (the per-model metrics; see
            :class:`~streamer.scheduling.dequeuer.Dequeuer`).

    Attributes:
        stages: as given.
        abort: set (by :meth:`give_up`) to make every thread of this chain return at once.
        keep_images: frames keep their decoded image (a later stage crops from it).
        replicas: per stage, its replicas.
    """

    def __init__(
        self,
        stages: Sequence[LoadedStage],
        admission: Any,
        results: Any,
        counts: OutcomeCounts,
        on_drop: Callable[[Frame], None],
        max_consecutive_failures: int,
        device_memory: bool,
        observe_batch: Callable[[Batch], None] = lambda batch: None,
    ) -> None:
        self.stages = list(stages)
        self._observe_batch = observe_batch
        self.abort = threading.Event()
        self.keep_images = any(s.items is not None for s in self.stages[1:])
        self._held = HeldFrames(admission, results, counts, on_drop)
        self._inboxes = [admission, *(Mailbox() for _ in self.stages[1:])]
        router = ChainRouter(
            [
                ChainStage(s.name, s.items, inbox, s.tensor_fed)
                for s, inbox in zip(self.stages, self._inboxes, strict=True)
            ],
            self._held,  # what leaves the chain is no longer held by it
            self.keep_images,
        )
        self.replicas: list[list[Replica]] = []
        self._paths = DevicePaths(
            [s.name for s in self.stages], [s.tensor_fed for s in self.stages], device_memory
        )
        self._batchers: list[Batcher] = []
        self._threads = [
            self._stage_threads(i, s, router, max_consecutive_failures)
            for i, s in enumerate(self.stages)
        ]

    @property
    def workers(self) -> list[Worker]:
        """Every thread, in start order: the last stage first, each stage's batcher last."""
        return [w for threads in reversed(self._threads) for w in threads]

    @property
    def first_batcher(self) -> Worker:
        """Stage 0's batcher: the one thread that reads the admission queue."""
        return self._threads[0][-1]

    @property
    def batchers(self) -> list[Batcher]:
        """Each stage's batcher, in chain order."""
        return list(self._batchers)

    def launch(self, timeout_s: float, first_batcher: bool = True) -> None:
        """Start the threads (downstream first), each ready within ``timeout_s``; without
        ``first_batcher``, all but stage 0's batcher (:meth:`launch_first_batcher`).

        Raises:
            StreamerError: a thread failed to start.
        """
        for worker in self.workers:
            if first_batcher or worker is not self.first_batcher:
                worker.launch(timeout_s)

    def launch_first_batcher(self, timeout_s: float) -> None:
        """Start stage 0's batcher: the chain then takes frames from admission.

        Raises:
            StreamerError: it failed to start.
        """
        self.first_batcher.launch(timeout_s)

    def drain(self, deadline: float | Callable[[], float]) -> bool:
        """Once :data:`STOP` is queued for stage 0: stage by stage in chain order, STOP after
        its last item, then join its threads; False if a thread is alive at ``deadline``
        (``time.monotonic()`` seconds, or a function giving it, asked again every
        ``_JOIN_SLICE_S``: a reload's drain ends sooner once a stop is requested)."""
        current = deadline if callable(deadline) else lambda: deadline
        for index, threads in enumerate(self._threads):
            if index > 0:
                self._inboxes[index].put(STOP)
            for worker in reversed(threads):
                while worker.is_alive() and (left := current() - time.monotonic()) > 0:
                    worker.join(min(left, _JOIN_SLICE_S))
            if any(w.is_alive() for w in threads):
                return False
        return True

    def give_up(self, reason: str) -> int:
        """Make every thread of the chain return at once: set :attr:`abort`, and interrupt
        every replica's model so an enqueue thread blocked on a full model returns too
        (nothing dequeues any more). Every frame the chain holds (taken from admission, not
        yet handed to egress) is counted as dropped with ``reason`` and reported to
        ``on_drop`` now; what its threads still hand to egress later is discarded.
        Idempotent: only the first call drops frames.

        Returns:
            The number of frames dropped.
        """
        self.abort.set()
        dropped = self._held.give_up(reason)
        for replicas in self.replicas:
            for replica in replicas:
                replica.model.interrupt()
        return dropped

    def join(self, timeout_s: float) -> None:
        """Wait up to ``timeout_s`` seconds in all for the started threads (after abort)."""
        deadline = time.monotonic() + timeout_s
        for worker in self.workers:
            if worker.ident is not None:
                worker.join(max(0.0, deadline - time.monotonic()))

    def ended(self) -> bool:
        """Whether every thread it started has returned (after :meth:`give_up`, those not
        stuck inside a model call)."""
        return not any(w.is_alive() for w in self.workers if w.ident is not None)

    def failure(self) -> BaseException | None:
        """Why it cannot go on: a tensor-linked run with no device left that has a live
        replica of each of its stages (its stages' replicas then leave rotation, and a
        batcher ends for want of one: this names the cause), the first error that ended one
        of its threads, or every replica of a stage out of rotation; None while it can go
        on."""
        if (broken := self._paths.failure()) is not None:
            return BackendError(broken)
        for worker in self.workers:
            if worker.failure is not None:
                return worker.failure
        for replicas in self.replicas:
            if all(r.failed is not None for r in replicas):
                return BackendError(every_replica_failed(replicas))
        return None

    def close(self) -> None:
        """Close the stages' models, the last stage first (it may hold device memory of the
        one before it); after the threads ended. Idempotent.

        Raises:
            Exception: the first stage's failure, once every stage was closed.
        """
        close_all(stage.close for stage in reversed(self.stages))

    def _stage_threads(
        self, index: int, stage: LoadedStage, router: ChainRouter, failures: int
    ) -> list[Worker]:
        """One stage's threads: a dequeue and an enqueue thread per replica, its batcher."""
        replicas = self._paths.replicas(stage.models)
        self.replicas.append(replicas)
        outbox: Any = router.exit(index)  # routes what the stage's threads put
        abort = self.abort
        dispatcher = Dispatcher(replicas, abort)
        inbox = self._held if index == 0 else self._inboxes[index]  # stage 0 takes frames in
        batcher = Batcher(stage.name, dispatcher, stage.policy, inbox, outbox, abort)
        self._batchers.append(batcher)
        return [
            *(
                Dequeuer(r, outbox, stage.postprocess_batch, abort, failures, self._observe_batch)
                for r in replicas
            ),
            *(Enqueuer(r, abort) for r in replicas),
            batcher,
        ]

"""Builds the threads and queues of one daemon from its config, and owns shutdown order.

::

    ingress ──▶ [decode+preprocess pool] ──▶ inbox ──▶ batcher ══▶ model ══▶ dequeuer ──▶ egress
    (1/socket)    futures, in order        (bounded)  (enqueue)            (postprocess)

Start order is downstream first (egress, dequeue, batcher, then the ingresses), so nothing is
received before it can be published. Stop order is upstream first: the ingresses stop
receiving, ``STOP`` follows the last frame through every queue, each stage finishes what it
holds and passes ``STOP`` on, then models and the backend are closed. Past the drain timeout
the remaining frames are abandoned and counted as dropped (``shutdown``).
"""

from __future__ import annotations

import os
import queue
import threading
import time
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import numpy as np
import structlog
import zmq

from streamer.config import Config, ModelConfig
from streamer.errors import FrameError, Reason, StreamerError
from streamer.frames import STOP, Frame, OutcomeCounts
from streamer.lifecycle import Status, Worker
from streamer.runtime import Backend, ModelSpec, QueueModel, open_backend
from streamer.scheduling.batcher import Batcher
from streamer.scheduling.dequeuer import Dequeuer
from streamer.scheduling.policy import BatchPolicy
from streamer.transport.egress import Egress
from streamer.transport.ingress import Ingress
from streamer.vision.decode import DecodeLimits, decode_image
from streamer.vision.postprocess import Postprocessor
from streamer.vision.preprocess import Preprocessor
from streamer.vision.registry import POSTPROCESSORS, PREPROCESSORS

__all__ = ["ModelStage", "Pipeline"]

_log = structlog.get_logger(__name__)
_START_TIMEOUT_S = 10.0
_ABORT_JOIN_S = 2.0


@dataclass
class ModelStage:
    """One model with its plug-ins and batch policy, loaded and checked."""

    config: ModelConfig
    model: QueueModel
    policy: BatchPolicy
    preprocess: Preprocessor
    postprocess: Postprocessor

    def postprocess_batch(self, outputs: Sequence[np.ndarray], frames: list[Frame]) -> None:
        """Fill ``frame.results`` of each frame from the batch-first ``outputs``."""
        results = self.postprocess(outputs, [f.transform for f in frames])
        for frame, result in zip(frames, results, strict=True):
            frame.results = result


def _load_stage(backend: Backend, config: Config, index: int) -> ModelStage:
    model_config = config.models[index]
    where = f"models[{index}]"
    spec = ModelSpec(
        name=model_config.name,
        path=config.model_path(model_config),
        device=config.runtime.devices[0],
        mode=model_config.mode,
        max_in_flight=model_config.max_in_flight,
        batch_gears=model_config.batch.gears,
    )
    model = backend.load(spec)
    try:
        return ModelStage(
            model_config,
            model,
            BatchPolicy.for_model(model_config.batch, model.info, where),
            PREPROCESSORS.create(model_config.preprocess, model.info, f"{where}.preprocess"),
            POSTPROCESSORS.create(model_config.postprocess, model.info, f"{where}.postprocess"),
        )
    except BaseException:
        model.close()
        raise


def prepare_frame(frame: Frame, preprocess: Preprocessor, limits: DecodeLimits) -> Frame:
    """Decode and preprocess one frame in place (runs on the worker pool).

    Never raises: a failure marks the frame failed (``decode_failed``, ``too_large``,
    ``unsupported_dtype``, ``bad_header`` or ``preprocess_failed``).
    """
    try:
        assert frame.payload is not None
        image = decode_image(frame.encoding, frame.payload, frame.header, limits)
        frame.payload = None
        frame.height, frame.width = image.shape[:2]
        frame.tensor, frame.transform = preprocess(image)
    except FrameError as error:
        frame.fail(error)
    except Exception as exc:  # a preprocessing bug fails this frame, not the daemon
        frame.fail(FrameError(Reason.PREPROCESS_FAILED, f"{type(exc).__name__}: {exc}"))
    return frame


class Pipeline:
    """The running daemon's data path.

    Use :meth:`load` (loads models, opens no socket), then :meth:`start`, then :meth:`stop`
    and :meth:`close`, the last on every exit path.
    """

    def __init__(self, config: Config, backend: Backend, stage: ModelStage) -> None:
        self.config = config
        self.counts = OutcomeCounts()
        self.status = Status.INITIALIZING
        self._backend = backend
        self._stage = stage
        self._abort = threading.Event()
        self._context: zmq.Context[Any] | None = None
        self._pool: ThreadPoolExecutor | None = None
        self._inbox: queue.Queue[Any] = queue.Queue(maxsize=config.daemon.queue_size)
        self._ingresses: list[Ingress] = []
        self._workers: list[Worker] = []

    @classmethod
    def load(cls, config: Config) -> Pipeline:
        """Open the backend and load every model, checking it against its config.

        Raises:
            ConfigError, ModelError, BackendError: what was loaded is released first.
        """
        backend = open_backend(config.runtime)
        try:
            stage = _load_stage(backend, config, 0)
        except BaseException:
            backend.close()
            raise
        return cls(config, backend, stage)

    @property
    def models(self) -> list[QueueModel]:
        return [self._stage.model]

    def start(self) -> None:
        """Create the threads and sockets; return once every thread is ready.

        Raises:
            StreamerError: a thread failed to start (e.g. an address already in use); the
                threads already started are stopped first.
        """
        self.status = Status.STARTING
        self._context = zmq.Context()
        workers = self.config.daemon.decode_workers or os.cpu_count() or 1
        self._pool = ThreadPoolExecutor(workers, thread_name_prefix="prepare")
        ledger: queue.SimpleQueue[Any] = queue.SimpleQueue()
        results: queue.SimpleQueue[Any] = queue.SimpleQueue()
        stage = self._stage
        self._workers = [
            Egress(self.config.egress, self._context, results, self.counts, self._abort),
            Dequeuer(stage.model, ledger, results, stage.postprocess_batch, self._abort),
            Batcher(stage.model, stage.policy, self._inbox, ledger, self._abort),
        ]
        self._ingresses = [
            Ingress(c, self._context, self._submit, self._inbox, self.counts, self._abort)
            for c in self.config.ingress
        ]
        try:
            for worker in [*self._workers, *self._ingresses]:
                worker.launch(_START_TIMEOUT_S)
        except StreamerError:
            self._abort.set()
            self._join_all(_ABORT_JOIN_S)
            self._release_transport()
            raise
        self.status = Status.RUNNING

    def _submit(self, frame: Frame) -> Future[Frame]:
        assert self._pool is not None
        limits = DecodeLimits()
        return self._pool.submit(prepare_frame, frame, self._stage.preprocess, limits)

    def failure(self) -> BaseException | None:
        """The first error that ended a pipeline thread, if any (the daemon then stops)."""
        for worker in [*self._ingresses, *self._workers]:
            if worker.failure is not None:
                return worker.failure
        return None

    def stop(self, drain_timeout_s: float) -> bool:
        """Stop receiving, finish the frames in flight, stop every thread.

        Returns:
            True if everything in flight was published within ``drain_timeout_s`` seconds;
            False if frames had to be abandoned (they are counted as dropped, ``shutdown``).
        """
        self.status = Status.STOPPING
        deadline = time.monotonic() + drain_timeout_s
        for ingress in self._ingresses:
            ingress.request_stop()
        for ingress in self._ingresses:
            ingress.join(max(0.0, deadline - time.monotonic()))
        if self.failure() is not None:
            self._abort.set()
        self._put_stop(deadline)
        drained = self._join_all(max(0.0, deadline - time.monotonic()))
        if not drained:
            _log.warning("drain_timeout", drain_timeout_s=drain_timeout_s)
            self._abort.set()
            self._join_all(_ABORT_JOIN_S)
        self._release_transport()
        lost = self.counts.snapshot().in_flight
        if lost > 0:
            self.counts.dropped(Reason.SHUTDOWN, lost)
        self.status = Status.STOPPED
        return drained and lost == 0

    def _put_stop(self, deadline: float) -> None:
        while not self._abort.is_set() and time.monotonic() < deadline:
            try:
                self._inbox.put(STOP, timeout=0.1)
                return
            except queue.Full:
                continue

    def _join_all(self, timeout_s: float) -> bool:
        deadline = time.monotonic() + timeout_s
        for worker in [*self._ingresses, *reversed(self._workers)]:
            if worker.ident is not None:  # started
                worker.join(max(0.0, deadline - time.monotonic()))
        return not any(w.is_alive() for w in [*self._ingresses, *self._workers])

    def _release_transport(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None
        stuck = [w.name for w in [*self._ingresses, *self._workers] if w.is_alive()]
        if stuck:  # terminating the context would hang on their sockets
            _log.error("threads_stuck", threads=stuck)
        elif self._context is not None:
            self._context.term()
            self._context = None

    def close(self) -> None:
        """Close the models, then the backend. Call after :meth:`stop`; idempotent.

        Threads still running (an exit path that skipped :meth:`stop`) are aborted first.
        """
        if any(w.is_alive() for w in [*self._ingresses, *self._workers]):
            self._abort.set()
            self._join_all(_ABORT_JOIN_S)
            self._release_transport()
        self._stage.model.close()
        self._backend.close()

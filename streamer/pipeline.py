"""Builds the threads and queues of one daemon from its config, and owns shutdown order.

::

    ingress ──▶ admission ──▶ batcher ─▶ enqueue ══▶ model ══▶ dequeue ──▶ router ─┬─▶ egress
    (1/socket)  (on_full; starts        (1 per replica, on every device)          │  (reorder,
                decode+preprocess)       ◀── next stage of the chain (items) ◀─────┘   publish)

Start order is downstream first (egress, the stages' dequeue, enqueue and batcher threads,
then the ingresses), so nothing is received before it can be published. Stop order is
upstream first: the ingresses stop receiving, then each stage in chain order gets ``STOP``
after its last item and its threads end, then egress; then models and the backend are
closed. Past the drain timeout the remaining frames are abandoned and counted as dropped
(``shutdown``).
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

from streamer.assets import ASSETS
from streamer.config import Config, ModelConfig
from streamer.errors import BackendError, ConfigError, FrameError, Reason, StreamerError
from streamer.frames import STOP, Frame, OutcomeCounts
from streamer.lifecycle import Status, Worker
from streamer.observability.metrics import PipelineMetrics, PipelineSample
from streamer.runtime import Backend, ModelSpec, QueueModel, open_backend
from streamer.scheduling.admission import AdmissionQueue
from streamer.scheduling.batcher import Batcher
from streamer.scheduling.chain import ChainRouter, ChainStage, make_items, store_outputs
from streamer.scheduling.dequeuer import Dequeuer
from streamer.scheduling.enqueuer import Enqueuer
from streamer.scheduling.policy import BatchPolicy
from streamer.scheduling.reorder import ReorderBuffer
from streamer.scheduling.replica import Dispatcher, Replica, every_replica_failed
from streamer.scheduling.sources import SourceTracker
from streamer.scheduling.swap import StageSwap
from streamer.transport.egress import Egress
from streamer.transport.endpoints import check_endpoints
from streamer.transport.ingress import Ingress, widest_limits
from streamer.transport.security import CurveAuthenticator, start_authenticator
from streamer.vision.decode import DecodeLimits, decode_image, decode_jpeg_reduced
from streamer.vision.opencv import configure_opencv
from streamer.vision.postprocess import Postprocessor
from streamer.vision.preprocess import Letterbox, Preprocessor
from streamer.vision.registry import POSTPROCESSORS, PREPROCESSORS
from streamer.vision.stages import ITEM_STAGES, ItemStage

__all__ = ["ModelStage", "Pipeline"]

_log = structlog.get_logger(__name__)
_START_TIMEOUT_S = 10.0
_ABORT_JOIN_S = 2.0
_SWAP_TIMEOUT_S = 60.0


@dataclass
class ModelStage:
    """One model stage: its replicas (one model per device and replica), plug-ins and batch
    policy, loaded and checked. A *single* stage has a preprocessor and a postprocessor; an
    *item* stage (``items``) prepares and finishes its own inputs."""

    config: ModelConfig
    models: list[tuple[int, QueueModel]]
    policy: BatchPolicy
    preprocess: Preprocessor | None
    postprocess: Postprocessor | None
    items: ItemStage | None = None

    @property
    def model(self) -> QueueModel:
        """The first replica's model (they all have the same ModelInfo)."""
        return self.models[0][1]

    def close(self) -> None:
        """Close every replica's model; idempotent."""
        for _, model in self.models:
            model.close()

    def postprocess_batch(self, outputs: Sequence[np.ndarray], frames: list[Frame]) -> None:
        """Fill ``frame.results`` of each frame (item) from the batch-first ``outputs``."""
        if self.postprocess is None:
            store_outputs(outputs, frames)
            return
        results = self.postprocess(outputs, [f.transform for f in frames])
        for frame, result in zip(frames, results, strict=True):
            frame.results = result

    def swap_marker(self) -> StageSwap:
        """The marker that switches the running threads to this stage."""
        return StageSwap([m for _, m in self.models], self.policy, self.postprocess_batch)


def _check_asset(model: ModelConfig, config: Config, where: str) -> None:
    """A named ``asset`` must be a model of the catalog, fetched.

    Raises:
        ConfigError: an unknown asset (the message lists the known ones), or one not fetched.
    """
    if model.asset is None:
        return
    known = sorted(a.name for a in ASSETS if a.kind != "media")
    if model.asset not in known:
        raise ConfigError(f"{where}.asset: unknown {model.asset!r}; known: {', '.join(known)}")
    if not config.model_path(model).exists():
        raise ConfigError(f"{where}.asset: {model.asset!r} is not fetched: streamer models fetch")


def _load_replicas(backend: Backend, config: Config, index: int) -> list[tuple[int, QueueModel]]:
    """Load model ``index`` ``replicas`` times on every device; all or nothing."""
    model_config = config.models[index]
    _check_asset(model_config, config, f"models[{index}]")
    loaded: list[tuple[int, QueueModel]] = []
    try:
        for device in config.runtime.devices:
            for _ in range(model_config.replicas):
                spec = ModelSpec(
                    name=model_config.name,
                    path=config.model_path(model_config),
                    device=device,
                    mode=model_config.mode,
                    max_in_flight=model_config.max_in_flight,
                    batch_gears=model_config.batch.gears,
                    preprocess=model_config.preprocess,
                )
                loaded.append((device, backend.load(spec)))
    except BaseException:
        for _, model in loaded:
            model.close()
        raise
    return loaded


def _load_stage(backend: Backend, config: Config, index: int, first: bool) -> ModelStage:
    model_config = config.models[index]
    models = _load_replicas(backend, config, index)
    try:
        return _plug_in(model_config, models, f"models[{index}]", first)
    except BaseException:
        for _, model in models:
            model.close()
        raise


def _plug_in(
    model_config: ModelConfig, models: list[tuple[int, QueueModel]], where: str, first: bool
) -> ModelStage:
    """The stage's plug-ins, checked against the loaded model.

    Raises:
        ConfigError: a bad plug-in, a missing preprocess table, or a single stage that is not
            the first of a chain.
    """
    info = models[0][1].info
    policy = BatchPolicy.for_model(model_config.batch, info)
    post = model_config.postprocess
    if post.kind in ITEM_STAGES:
        items = ITEM_STAGES.create(post, info, f"{where}.postprocess")
        return ModelStage(model_config, models, policy, None, None, items)
    if not first:
        raise ConfigError(
            f"{where}.postprocess.kind: a stage fed by another stage needs an item stage "
            f"({', '.join(ITEM_STAGES.names())}), got {post.kind!r}"
        )
    if model_config.preprocess is None:
        raise ConfigError(f"{where}.preprocess: required for postprocess kind {post.kind!r}")
    return ModelStage(
        model_config,
        models,
        policy,
        PREPROCESSORS.create(model_config.preprocess, info, f"{where}.preprocess"),
        POSTPROCESSORS.create(post, info, f"{where}.postprocess"),
    )


def _load_chain(backend: Backend, config: Config) -> list[ModelStage]:
    """Every stage, in chain order; all or nothing."""
    stages: list[ModelStage] = []
    try:
        for position, model in enumerate(config.chain()):
            index = config.models.index(model)
            stages.append(_load_stage(backend, config, index, first=position == 0))
    except BaseException:
        for stage in stages:
            stage.close()
        raise
    return stages


def _models_identity(config: Config) -> list[tuple[object, ...]]:
    """What makes two configs' models the same: their settings and their files' stat."""
    identity: list[tuple[object, ...]] = []
    for model in config.models:
        path = config.model_path(model)
        stat = path.stat() if path.exists() else None
        stamp = (stat.st_mtime_ns, stat.st_size) if stat else None
        identity.append((model.model_dump(exclude={"path", "asset"}), str(path), stamp))
    return identity


_REDUCE_MARGIN = 2
"""A reduced decode keeps at least this many image pixels per model-input pixel, so the final
resize still averages (INTER_AREA) and detections stay within a pixel of a full decode."""


def _reduced_decode(frame: Frame, stage: ModelStage, limits: DecodeLimits, keep: bool) -> bool:
    """Decode a JPEG much larger than the model input at a reduced size and letterbox it with
    a transform that maps back to full-frame pixels; False when that does not apply (not a
    JPEG, not a letterbox stage, or a later stage crops from the decoded image)."""
    letterbox = stage.preprocess
    if frame.encoding != "jpeg" or keep or not isinstance(letterbox, Letterbox):
        return False
    assert frame.payload is not None
    height, width = max(letterbox.sizes)
    cover = (height * _REDUCE_MARGIN, width * _REDUCE_MARGIN)
    image, factor, size = decode_jpeg_reduced(frame.payload, frame.header, limits, cover)
    frame.payload = None
    frame.width, frame.height = size
    frame.tensor, transform = letterbox(image)
    frame.transform = transform.enlarged(factor, *size) if factor > 1 else transform
    frame.prepared_at_ns = time.monotonic_ns()
    return True


def prepare_frame(frame: Frame, stage: ModelStage, limits: DecodeLimits, keep_image: bool) -> Frame:
    """Decode one frame and prepare it for the chain's first stage, in place (runs on the
    worker pool): its tensor, or for an item stage its items.

    Never raises: a failure marks the frame failed (``decode_failed``, ``too_large``,
    ``unsupported_dtype``, ``bad_header`` or ``preprocess_failed``).
    """
    try:
        assert frame.payload is not None
        if _reduced_decode(frame, stage, limits, keep_image):
            return frame
        image = decode_image(frame.encoding, frame.payload, frame.header, limits)
        frame.payload = None
        frame.height, frame.width = image.shape[:2]
        if keep_image:
            frame.image = image
        if stage.items is not None:
            tensors, transforms = stage.items.items(image, frame.results)
            frame.children = make_items(frame, tensors, transforms, frame.received_at_ns)
        else:
            assert stage.preprocess is not None
            frame.tensor, frame.transform = stage.preprocess(image)
        frame.prepared_at_ns = time.monotonic_ns()
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

    def __init__(
        self,
        config: Config,
        backend: Backend,
        stages: list[ModelStage],
        metrics: PipelineMetrics | None = None,
    ) -> None:
        self.config = config
        self.metrics = metrics if metrics is not None else PipelineMetrics()
        self.counts = OutcomeCounts()
        self.status = Status.INITIALIZING
        self._backend = backend
        self._stages = stages
        self._keep_images = any(s.items is not None for s in stages[1:])
        self._abort = threading.Event()
        self._context: zmq.Context[Any] | None = None
        self._authenticator: CurveAuthenticator | None = None
        self._pool: ThreadPoolExecutor | None = None
        daemon = config.daemon
        self.sources = SourceTracker(daemon.source_idle_s)
        self.reorder = ReorderBuffer(
            daemon.reorder_window, daemon.reorder_timeout_s, daemon.source_idle_s
        )
        self._inbox = AdmissionQueue(
            daemon.queue_size,
            self.sources,
            self._submit,
            self.counts,
            self.reorder.skip,
            self._abort,
        )
        self._submit_lock = threading.Lock()
        self._ingresses: list[Ingress] = []
        self._workers: list[Worker] = []
        self._stage_threads: list[list[Worker]] = []
        self._replicas: list[list[Replica]] = []
        self._inboxes: list[Any] = []
        self._results: queue.SimpleQueue[Any] = queue.SimpleQueue()

    @classmethod
    def load(cls, config: Config, metrics: PipelineMetrics | None = None) -> Pipeline:
        """Open the backend and load every model, checking it against its config.

        Args:
            config: the validated configuration.
            metrics: where the egress thread observes latencies (a new set when None).

        Raises:
            ConfigError, ModelError, BackendError: what was loaded is released first.
        """
        check_endpoints(config.ingress, config.egress)
        backend = open_backend(config.runtime)
        try:
            stages = _load_chain(backend, config)
        except BaseException:
            backend.close()
            raise
        return cls(config, backend, stages, metrics)

    @property
    def _stage(self) -> ModelStage:
        """The first stage (the one reload swaps)."""
        return self._stages[0]

    @property
    def models(self) -> list[QueueModel]:
        """One model per stage (its first replica), in chain order."""
        return [stage.model for stage in self._stages]

    def start(self) -> None:
        """Create the threads and sockets; return once every thread is ready.

        Raises:
            StreamerError: a thread failed to start (e.g. an address already in use); the
                threads already started are stopped first.
        """
        self.status = Status.STARTING
        self._context = zmq.Context()
        self._authenticator = start_authenticator(
            self._context, [*self.config.ingress, *self.config.egress]
        )
        workers = self.config.daemon.decode_workers or os.cpu_count() or 1
        configure_opencv()
        self._pool = ThreadPoolExecutor(workers, thread_name_prefix="prepare")
        self._workers = self._build_workers(self._context)
        self._ingresses = [
            Ingress(c, self._context, self._inbox, self.counts, self._abort)
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

    def _build_workers(self, context: zmq.Context[Any]) -> list[Worker]:
        """Egress, then for each stage (last first) its dequeue, enqueue and batcher threads."""
        egress = Egress(
            self.config.egress,
            context,
            self._results,
            self.reorder,
            self.counts,
            self._abort,
            metrics=self.metrics,
        )
        self._inboxes = [self._inbox] + [queue.Queue() for _ in self._stages[1:]]
        chain = [
            ChainStage(stage.config.name, stage.items, inbox)
            for stage, inbox in zip(self._stages, self._inboxes, strict=True)
        ]
        router = ChainRouter(chain, self._results, self._keep_images)
        self._replicas = []
        self._stage_threads = []
        for index, stage in enumerate(self._stages):
            self._stage_threads.append(self._stage_workers(index, stage, router.exit(index)))
        return [egress, *(w for threads in reversed(self._stage_threads) for w in threads)]

    def _stage_workers(self, index: int, stage: ModelStage, outbox: Any) -> list[Worker]:
        """One stage's threads: a dequeue and an enqueue thread per replica, its batcher."""
        abort, failures = self._abort, self.config.daemon.max_consecutive_failures
        replicas = [Replica(i, d, m) for i, (d, m) in enumerate(stage.models)]
        self._replicas.append(replicas)
        dispatcher = Dispatcher(replicas, abort)
        inbox = self._inboxes[index]
        return [
            *(Dequeuer(r, outbox, stage.postprocess_batch, abort, failures) for r in replicas),
            *(Enqueuer(r, abort) for r in replicas),
            Batcher(stage.config.name, dispatcher, stage.policy, inbox, outbox, abort),
        ]

    def _submit(self, frame: Frame) -> Future[Frame]:
        """Start preparing ``frame`` for the current stage (called under admission's order)."""
        assert self._pool is not None
        limits = widest_limits(self.config.ingress)
        keep = self._keep_images
        with self._submit_lock:
            return self._pool.submit(prepare_frame, frame, self._stage, limits, keep)

    def reload(self, config: Config) -> bool:
        """Swap in the models of ``config`` that changed, without losing a frame.

        The new model is loaded beside the running one; a marker then goes down the queues
        so frames received before it finish on the old model and frames after it run on the
        new one; the old model is closed once it has nothing in flight. Settings other than
        ``[[models]]`` need a restart and are reported, not applied.

        Returns:
            True if the new config is in force (also when nothing changed); False if it was
            rejected (the old one keeps running; the reason is logged).
        """
        sections = ("daemon", "ingress", "egress", "runtime")
        changed = [k for k in sections if getattr(config, k) != getattr(self.config, k)]
        if changed:
            _log.warning("reload_needs_restart", sections=changed)
        if len(config.models) > 1 or len(self.config.models) > 1:
            _log.error("reload_rejected", error="reloading a chain of models needs a restart")
            return False
        if config.models[0].replicas != self.config.models[0].replicas:
            _log.error("reload_rejected", error="changing models.replicas needs a restart")
            return False
        if _models_identity(config) == _models_identity(self.config):
            _log.info("reload_unchanged")
            return True
        try:
            stage = _load_stage(self._backend, config, 0, first=True)
        except StreamerError as exc:
            _log.error("reload_rejected", error=str(exc))
            return False
        self._swap(stage)
        update = {"models": config.models, "source_file": config.source_file}
        self.config = self.config.model_copy(update=update)
        _log.info("reloaded", model=stage.model.info.name)
        return True

    def _swap(self, stage: ModelStage) -> None:
        old, marker = self._stage, stage.swap_marker()
        with self._submit_lock:
            self._stages[0] = stage
            self._inbox.put_marker(marker)
        if not marker.done.wait(_SWAP_TIMEOUT_S):
            _log.error("reload_swap_stuck", model=old.model.info.name)
            return
        old.close()

    def housekeeping(self) -> None:
        """Periodic upkeep from the control loop: forget sources idle past ``source_idle_s``."""
        self.sources.evict_idle()

    def stream_stats(self) -> dict[str, int]:
        """Per-source stream totals for logs and metrics (see SourceTracker, ReorderBuffer)."""
        stats = self.sources.stats()
        return {
            "seq_gaps": stats.seq_gaps,
            "stale_frames": stats.stale,
            "source_restarts": stats.restarts,
            "active_sources": stats.active_sources,
            "reorder_gave_up": self.reorder.gave_up,
            "reorder_late": self.reorder.late,
        }

    def sample(self) -> PipelineSample:
        """Counters and gauges for ``/metrics``, read at scrape time; any thread."""
        depths = {
            "batcher": self._inbox.qsize(),
            "dequeue": sum(r.ledger.qsize() for rs in self._replicas for r in rs),
            "egress": self._results.qsize(),
        }
        flushes: dict[str, int] = {}
        for worker in self._workers:
            if isinstance(worker, Batcher):
                flushes.update(worker.flushes)
        replicas = [
            (r.model.info.name, r.device, r.executed, r.failed is None)
            for rs in self._replicas
            for r in rs
        ]
        return PipelineSample(
            self.counts.snapshot(), depths, self.stream_stats(), flushes, replicas
        )

    def failure(self) -> BaseException | None:
        """Why the pipeline cannot go on, if it cannot: the first error that ended a thread,
        or every replica of a stage out of rotation (the daemon then stops)."""
        for worker in [*self._ingresses, *self._workers]:
            if worker.failure is not None:
                return worker.failure
        for replicas in self._replicas:
            if all(r.failed is not None for r in replicas):
                return BackendError(every_replica_failed(replicas))
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
        self._inbox.put_marker(STOP)
        drained = self._drain(deadline)
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

    def _drain(self, deadline: float) -> bool:
        """Stage by stage in chain order: STOP after its last item, join its threads; then
        tell egress everything is in and join it. (Stage 0's STOP is already queued.)"""
        for index, threads in enumerate(self._stage_threads):
            if index > 0:
                self._inboxes[index].put(STOP)
            for worker in reversed(threads):
                worker.join(max(0.0, deadline - time.monotonic()))
            if any(w.is_alive() for w in threads):
                return False
        self._results.put(STOP)
        egress = self._workers[0]
        egress.join(max(0.0, deadline - time.monotonic()))
        return not egress.is_alive()

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
        if self._authenticator is not None:
            self._authenticator.stop()
            self._authenticator = None
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
        for stage in self._stages:
            stage.close()
        self._backend.close()

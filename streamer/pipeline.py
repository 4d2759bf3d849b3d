"""Builds the threads and queues of one daemon from its config, and owns shutdown order.

::

    ingress ──▶ admission ──▶ batcher ─▶ enqueue ══▶ model ══▶ dequeue ──▶ router ─┬─▶ egress
    (1/socket)  (on_full; starts        (1 per replica, on every device)          │  (reorder,
                decode+preprocess)       ◀── next stage of the chain ◀─────────────┘   publish)
                                             (items, or the batch's tensors)

The stages are loaded by :mod:`streamer.model_stages`; their threads and queues, from stage
0's batcher to the router, are one :class:`~streamer.scheduling.chain_run.ChainRun`. Start
order is downstream first (egress, the chain's dequeue, enqueue and batcher threads, then the
ingresses), so nothing is received before it can be published. Stop order is upstream first:
the ingresses stop receiving, then each stage in chain order gets ``STOP`` after its last item
and its threads end, then egress; then models and the backend are closed. Past the drain
timeout the remaining frames are abandoned and counted as dropped (``shutdown``). A reload
(SIGHUP) replaces the whole chain at an in-band marker (:mod:`streamer.scheduling.swap`).
"""

from __future__ import annotations

import os
import queue
import threading
import time
from collections import Counter
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import structlog
import zmq

from streamer.config import Config, ModelConfig
from streamer.errors import ConfigError, FrameError, Reason, StreamerError
from streamer.frames import STOP, Frame, OutcomeCounts
from streamer.lifecycle import Status, Worker
from streamer.model_stages import ModelStage, load_chain
from streamer.observability.metrics import PipelineMetrics, PipelineSample
from streamer.release import close_all, close_logged
from streamer.reload_progress import ReloadProgress, ReloadStage
from streamer.runtime import Backend, QueueModel, check_runtime, open_backend
from streamer.scheduling.admission import AdmissionQueue
from streamer.scheduling.chain import make_items
from streamer.scheduling.chain_run import ChainRun
from streamer.scheduling.reorder import ReorderBuffer
from streamer.scheduling.replica import RETRY_WAIT_S, Replica
from streamer.scheduling.sources import SourceTracker
from streamer.scheduling.swap import StopRequest, retire
from streamer.transport.egress import Egress
from streamer.transport.endpoints import check_endpoints
from streamer.transport.ingress import Ingress, widest_limits
from streamer.transport.security import CurveAuthenticator, check_curve_keys, start_authenticator
from streamer.vision.decode import DecodeLimits, decode_image, decode_jpeg_reduced
from streamer.vision.opencv import configure_opencv
from streamer.vision.preprocess import Letterbox

__all__ = [
    "INLINE_MAX_PIXELS",
    "Pipeline",
    "prepare_frame",
    "prepared_inline",
    "reorder_timeout_s",
]

_log = structlog.get_logger(__name__)
_START_TIMEOUT_S = 10.0
_ABORT_JOIN_S = 2.0


def _models_identity(config: Config) -> list[tuple[object, ...]]:
    """What makes two configs' models the same: their settings and their files' stat (a
    model deployed at the same path, or an asset fetched again, is a change). Taken before
    the models load, so a file replaced meanwhile is loaded again at the next reload."""
    identity: list[tuple[object, ...]] = []
    for model in config.models:
        path = config.model_path(model)
        try:
            stat: os.stat_result | None = path.stat()
        except OSError:  # missing, a name too long: the load says why
            stat = None
        stamp = (stat.st_mtime_ns, stat.st_size) if stat else None
        identity.append((model.model_dump(exclude={"path", "asset"}), str(path), stamp))
    return identity


def _check_sockets(config: Config) -> None:
    """The checks of the sockets' settings that need no socket (``streamer check``'s).

    Raises:
        ConfigError: a bad endpoint (:func:`~streamer.transport.endpoints.check_endpoints`)
            or CURVE key file.
    """
    check_endpoints(config.ingress, config.egress, config.daemon.http_endpoint)
    check_curve_keys(config.ingress, config.egress)


def _check_restart_settings(config: Config, changed: Sequence[str]) -> None:
    """Check the ``changed`` sections a reload leaves for a restart as ``streamer check``
    and the restart would, so a file the next start would refuse is rejected now.

    Raises:
        ConfigError: as :func:`_check_sockets` and :func:`~streamer.runtime.check_runtime`.
    """
    if "runtime" in changed:
        check_runtime(config.runtime)
    if {"daemon", "ingress", "egress"} & set(changed):
        _check_sockets(config)


_REDUCE_MARGIN = 2
"""A reduced decode keeps at least this many image pixels per model-input pixel, so the final
resize still averages (INTER_AREA) and detections stay within about a model-input pixel of a
full decode (measured on faces from 513x932 to 4000x3000: 0.04 to 1.0, most under 0.5)."""


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
    if factor > 1:
        frame.tensor, frame.transform = letterbox.reduced(image, factor, *size)
    else:
        frame.tensor, frame.transform = letterbox(image)
    frame.prepared_at_ns = time.monotonic_ns()
    return True


INLINE_MAX_PIXELS = 640 * 480
"""Raw frames up to this many pixels are prepared on the ingress thread that received them:
a letterbox of a 176x144 frame costs about 0.1 ms of CPU, and handing it to the worker pool
and back costs about as much again (``streamer bench``, carphone raw: 6 % more frames/s
inline). Larger raw frames and encoded ones (decoding is the expensive part) go to the pool,
whose threads run OpenCV in parallel while the ingress goes on receiving."""


def decode_workers(config: Config) -> int:
    """The worker pool's threads: ``daemon.decode_workers``, or one per CPU core."""
    return config.daemon.decode_workers or os.cpu_count() or 1


def prepare_ahead(config: Config, first: ModelConfig) -> int:
    """``drop_oldest`` / ``latest`` frames prepared ahead of the batcher at most: two batches
    of the ``first`` stage and two frames per decode worker. Measured on 2 cores (3 JPEG
    sources at 2.3 x capacity): one batch and one frame per worker left 0.4 cores idle, as
    the batcher waited for frames that began decoding only when it took them."""
    return 2 * (decode_workers(config) + first.batch.max_size)


def prepared_inline(frame: Frame) -> bool:
    """Whether ``frame`` is raw and at most :data:`INLINE_MAX_PIXELS` (its size from the
    ingress's check)."""
    return frame.encoding == "raw" and 0 < frame.width * frame.height <= INLINE_MAX_PIXELS


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
            if not tensors:  # nothing to run (an image under P-Net's smallest window)
                frame.model = stage.name
                frame.results = stage.items.finish([], [], frame.results)
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
        self._models_in_force = _models_identity(config)
        self.metrics = metrics if metrics is not None else PipelineMetrics()
        self.counts = OutcomeCounts()
        self.status = Status.INITIALIZING
        self._backend = backend
        self._stages = stages
        self._abort = threading.Event()
        self._threads_ended = False
        self._context: zmq.Context[Any] | None = None
        self._authenticator: CurveAuthenticator | None = None
        self._pool: ThreadPoolExecutor | None = None
        daemon = config.daemon
        self.reorder = ReorderBuffer(
            _reorder_window(config), reorder_timeout_s(config, backend), daemon.source_idle_s
        )
        self.sources = SourceTracker(
            daemon.source_idle_s,
            self.reorder.released_through,
            self.reorder.close,
            daemon.max_sources,
        )
        self.reorder.tracked = self.sources.tracks
        self._inbox = AdmissionQueue(
            daemon.queue_size,
            self.sources,
            self._submit,
            self.counts,
            self.reorder.skip,
            self._abort,
            prepare_ahead=prepare_ahead(config, stages[0].config),
        )
        self._ingresses: list[Ingress] = []
        self._egress: Egress | None = None
        self._results: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._chain = self._new_chain(stages)
        self._retired: list[ChainRun] = []
        self._retiring: ChainRun | None = None  # the old chain a reload is draining
        # A reload runs on a thread of its own while the control loop and /metrics read:
        # the chains and carried counts below change only under this lock, and are read
        # under it (never held while waiting for anything, nor around the admission lock).
        self._chains_lock = threading.Lock()
        # Held by a reload from its new chain's start to the end of its swap, and by stop()
        # and close() as they begin: a stop waits for a swap under way (the stop cuts its
        # drain short), and a reload that loaded after the stop began swaps nothing.
        self._swapping = threading.Lock()
        self._closed = False
        # Counts of the chains retired and gone, so that /metrics counters never go back.
        self._carried_flushes: Counter[str] = Counter()
        self._carried_batches: Counter[tuple[str, int, int]] = Counter()
        self._carried_retried: Counter[str] = Counter()
        self._carried_recoveries: Counter[str] = Counter()

    @classmethod
    def load(cls, config: Config, metrics: PipelineMetrics | None = None) -> Pipeline:
        """Open the backend and load every model, checking it against its config.

        Args:
            config: the validated configuration.
            metrics: where the dequeue threads observe each model's batches and the
                egress thread end-to-end latencies (a new set when None).

        Raises:
            ConfigError, ModelError, BackendError: what was loaded is released first.
        """
        _check_sockets(config)
        identity = _models_identity(config)
        backend = open_backend(config.runtime)
        try:
            stages = load_chain(backend, config)
        except BaseException:
            close_logged(backend.close, "backend")
            raise
        pipeline = cls(config, backend, stages, metrics)
        pipeline._models_in_force = identity
        return pipeline

    def _new_chain(self, stages: list[ModelStage]) -> ChainRun:
        failures = self.config.daemon.max_consecutive_failures
        return ChainRun(
            stages,
            self._inbox,
            self._results,
            self.counts,
            self.reorder.skip,
            failures,
            self._backend.device_memory,
            self.metrics.observe_batch,
        )

    @property
    def _workers(self) -> list[Worker]:
        """Egress (once started), then the threads of the chain in service and of any
        retired chain still around."""
        egress: list[Worker] = [self._egress] if self._egress is not None else []
        return [*egress, *(w for chain in self._chains() for w in chain.workers)]

    def _chains(self) -> list[ChainRun]:
        """The chain in service, then every retired chain still around; any thread."""
        with self._chains_lock:
            return [self._chain, *self._retired]

    def _abort_all(self) -> None:
        """Make every thread return at once (ingresses, egress, every chain); the frames the
        chains hold are dropped (``shutdown``)."""
        self._abort.set()
        for chain in self._chains():
            chain.give_up(Reason.SHUTDOWN)

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
        configure_opencv()
        self._pool = ThreadPoolExecutor(decode_workers(self.config), thread_name_prefix="prepare")
        self._egress = Egress(
            self.config.egress,
            self._context,
            self._results,
            self.reorder,
            self.counts,
            self._abort,
            metrics=self.metrics,
        )
        self._ingresses = [
            Ingress(c, self._context, self._inbox, self.counts, self._abort)
            for c in self.config.ingress
        ]
        try:
            self._egress.launch(_START_TIMEOUT_S)
            self._chain.launch(_START_TIMEOUT_S)
            for ingress in self._ingresses:
                ingress.launch(_START_TIMEOUT_S)
        except StreamerError:
            self._abort_all()
            self._join_all(_ABORT_JOIN_S)
            self._release_transport()
            raise
        self.status = Status.RUNNING

    def _submit(self, frame: Frame, *, inline: bool = True) -> Future[Frame] | None:
        """Prepare ``frame`` for the current chain's first stage: a small raw frame for a
        single stage at once, on the calling thread (None), unless ``inline`` is False;
        anything else on the worker pool (its future). Called by admission, never while a
        reload switches the chain."""
        assert self._pool is not None
        limits = widest_limits(self.config.ingress)
        stage, keep = self._stages[0], self._chain.keep_images
        if inline and stage.preprocess is not None and prepared_inline(frame):
            prepare_frame(frame, stage, limits, keep)
            return None
        return self._pool.submit(prepare_frame, frame, stage, limits, keep)

    def reload(
        self,
        config: Config,
        stop: StopRequest | None = None,
        progress: ReloadProgress | None = None,
    ) -> bool:
        """Replace the chain of models by the one of ``config`` when its models changed,
        without losing a frame.

        The whole new chain (any number of stages and replicas) is loaded and started beside
        the running one; an in-band marker then makes frames received before it finish on
        the old chain and frames after it run on the new one, and the old chain is closed
        once it has drained (:mod:`streamer.scheduling.swap`). The models changed when their
        settings or their files' stat did, against the files as the running chain loaded
        them. Settings other than ``[[models]]`` need a restart and are reported, not
        applied, once checked as ``streamer check`` checks them. When ``stop`` is set
        meanwhile, the old chain gets ``drain_timeout_s`` from then to drain, as at a stop.

        One reload at a time, on a thread of its own, which may take long: the loading has
        no bound (a hung mount), the old chain's drain ``reload_timeout_s``. Meanwhile the
        control loop's calls (:meth:`housekeeping`, :meth:`failure`, :meth:`stream_stats`)
        and :meth:`sample` read a consistent pipeline, and :meth:`stop` waits for a swap
        under way. A chain that loaded once ``stop`` was set or :meth:`stop` began is
        released instead (``reload_skipped``), or left to the process exit once
        :meth:`close` began. ``progress``, if given, enters ``swapping`` as the old chain
        begins to drain.

        Returns:
            True if the whole new config is in force (also when nothing changed); False if
            it was rejected (the old chain keeps running; the reason is logged: a model that
            does not load, a setting left for a restart that the restart would refuse), if settings
            of it wait for a restart (``reload_needs_restart``; its models are applied), if
            the daemon began stopping, or if the new chain failed to start
            (``reload_failed``; the daemon then stops).
        """
        sections = ("daemon", "ingress", "egress", "runtime")
        changed = [k for k in sections if getattr(config, k) != getattr(self.config, k)]
        try:
            _check_restart_settings(config, changed)
        except ConfigError as exc:
            _log.error("reload_rejected", error=str(exc))
            return False
        if changed:
            _log.warning("reload_needs_restart", sections=changed)
        identity = _models_identity(config)
        if identity == self._models_in_force:
            _log.info("reload_unchanged")
            return not changed
        _log.info("reload_loading", models=[m.name for m in config.models])
        try:
            stages = load_chain(self._backend, config)
        except Exception as exc:  # noqa: BLE001 - what was loaded is released
            _log_rejected(exc)
            return False
        return self._put_in_service(config, identity, stages, stop, progress) and not changed

    def _put_in_service(
        self,
        config: Config,
        identity: list[tuple[object, ...]],
        stages: list[ModelStage],
        stop: StopRequest | None,
        progress: ReloadProgress | None,
    ) -> bool:
        """Start the loaded ``stages`` as a chain and swap it in; False if it did not start
        (``reload_rejected``, ``reload_failed``) or the daemon began stopping
        (``reload_skipped``)."""
        with self._swapping:
            stopping = self._closed or self.status is not Status.RUNNING
            if stopping or (stop is not None and stop.is_set()):
                _log.warning("reload_skipped", reason="the daemon is stopping")
                if not self._closed:  # else the backend is closed: the exit reclaims them
                    for stage in reversed(stages):
                        close_logged(stage.close, f"model {stage.name!r}")
                return False
            try:
                chain = self._start_chain(stages)
            except Exception as exc:  # noqa: BLE001 - what was loaded or started is released
                _log_rejected(exc)
                return False
            if progress is not None:
                progress.enter(ReloadStage.SWAPPING)
            launched = self._swap(chain, stages, stop)
            update = {"models": config.models, "source_file": config.source_file}
            self.config = self.config.model_copy(update=update)
            self._models_in_force = identity
            self.reorder.window = _reorder_window(self.config)
        _log.info("reloaded", models=[s.name for s in stages])
        return launched

    def _start_chain(self, stages: list[ModelStage]) -> ChainRun:
        """A new chain with its threads started, all but its first batcher.

        Raises:
            StreamerError: a thread failed to start. On any failure the chain and its stages
                are released first.
        """
        try:
            chain = self._new_chain(stages)
        except BaseException:
            for stage in reversed(stages):
                close_logged(stage.close, f"model {stage.name!r}")
            raise
        try:
            chain.launch(_START_TIMEOUT_S, first_batcher=False)
        except BaseException:
            chain.give_up(Reason.SHUTDOWN)  # it holds no frame yet
            chain.join(_ABORT_JOIN_S)
            close_logged(chain.close, "new chain")
            raise
        return chain

    def _swap(self, chain: ChainRun, stages: list[ModelStage], stop: StopRequest | None) -> bool:
        """Put ``chain`` into service at an in-band marker and retire the old one; False if
        its first batcher failed to start (``reload_failed``)."""
        old = self._chain

        def switch() -> None:  # under the admission queue's lock
            with self._chains_lock:
                self._chain, self._stages = chain, stages
                self._retired.append(old)
                self._retiring = old
            self._inbox.prepare_ahead = prepare_ahead(self.config, stages[0].config)

        self._inbox.put_marker(STOP, switch)
        settings = self.config.daemon
        _log.info("reload_swapping", stages=[s.name for s in old.stages])
        given_up = retire(old, settings.reload_timeout_s, stop, settings.drain_timeout_s)
        if given_up is not None and (dropped := self._inbox.discard_through(STOP, given_up)):
            _log.warning("reload_dropped_frames", frames=dropped, reason=given_up)
        with self._chains_lock:
            self._retiring = None  # given up, it is housekeeping's to close
            if given_up is None:
                self._retired.remove(old)
                self._carry_counts(old)
            self._forget_retired_models()
        try:
            chain.launch_first_batcher(_START_TIMEOUT_S)
        except StreamerError as exc:  # its failure() now stops the daemon
            _log.error("reload_failed", error=str(exc))
            return False
        return True

    def _carry_counts(self, chain: ChainRun) -> None:
        """Keep a chain's counters, which ``/metrics`` reports, once it is gone; under
        ``_chains_lock``."""
        flushes, batches = _batch_counts(chain)
        self._carried_flushes += flushes
        self._carried_batches += batches
        self._carried_retried += _retried_counts(chain)
        self._carried_recoveries += _recovery_counts(chain)

    def _forget_retired_models(self) -> None:
        """Drop the per-model series and carried counts of the models no longer in the chain
        (a reload that renames its models each time must not grow ``/metrics``); those of
        the models still in it go on counting. Under ``_chains_lock``."""
        names = {stage.name for stage in self._chain.stages}
        self.metrics.models_in_service(names)
        self._carried_batches = Counter(
            {key: n for key, n in self._carried_batches.items() if key[0] in names}
        )
        self._carried_retried = Counter(
            {model: n for model, n in self._carried_retried.items() if model in names}
        )
        self._carried_recoveries = Counter(
            {model: n for model, n in self._carried_recoveries.items() if model in names}
        )

    def housekeeping(self) -> None:
        """Periodic upkeep from the control loop: forget sources idle past ``source_idle_s``,
        and close the models of a given-up chain once its threads have ended."""
        self.sources.evict_idle()
        with self._chains_lock:
            ended = [c for c in self._retired if c is not self._retiring and c.ended()]
            for chain in ended:
                self._retired.remove(chain)
                self._carry_counts(chain)
            if ended:
                self._forget_retired_models()
        for chain in ended:
            close_logged(chain.close, "given-up chain")
            _log.info("given_up_chain_closed", stages=[s.name for s in chain.stages])

    def stream_stats(self) -> dict[str, int]:
        """Per-source stream totals for logs and metrics (see SourceTracker, ReorderBuffer)."""
        stats = self.sources.stats()
        return {
            "seq_gaps": stats.seq_gaps,
            "stale_frames": stats.stale,
            "source_restarts": stats.restarts,
            "active_sources": stats.active_sources,
            "tracked_sources": stats.tracked_sources,
            "reorder_gave_up": self.reorder.gave_up,
            "reorder_late": self.reorder.late,
        }

    def sample(self) -> PipelineSample:
        """Counters and gauges for ``/metrics``, read at scrape time; any thread."""
        with self._chains_lock:  # the chains and what the chains gone left, at one moment
            current, chains = self._chain, [self._chain, *self._retired]
            flushes, batches = Counter(self._carried_flushes), Counter(self._carried_batches)
            retried = Counter(self._carried_retried)
            recoveries = Counter(self._carried_recoveries)
        depths = {
            "batcher": self._inbox.qsize(),
            "dequeue": sum(r.ledger.qsize() for rs in current.replicas for r in rs),
            "egress": self._results.qsize(),
        }
        for chain in chains:
            chain_flushes, chain_batches = _batch_counts(chain)
            flushes.update(chain_flushes)  # not +=, which drops the reasons still at 0
            batches.update(chain_batches)
            retried.update(_retried_counts(chain))  # every model, 0 included
            recoveries.update(_recovery_counts(chain))
        names = {stage.name for stage in current.stages}  # not a given-up chain's
        retried = Counter({model: n for model, n in retried.items() if model in names})
        recoveries = Counter({model: n for model, n in recoveries.items() if model in names})
        replicas = [
            (r.model.info.name, r.device, r.index, batches[_replica_key(r)], r.in_rotation)
            for rs in current.replicas
            for r in rs
        ]
        return PipelineSample(
            self.counts.snapshot(),
            depths,
            self.stream_stats(),
            flushes,
            replicas,
            retried,
            recoveries,
        )

    def failure(self) -> BaseException | None:
        """Why the pipeline cannot go on, if it cannot: the first error that ended a thread,
        every replica of a stage out of rotation, or a tensor-linked run with no device left
        that has a live replica of each of its stages (the daemon then stops)."""
        for worker in [*self._ingresses, *([self._egress] if self._egress else [])]:
            if worker.failure is not None:
                return worker.failure
        for chain in self._chains():
            if (failure := chain.failure()) is not None:
                return failure
        return None

    def stop(self, drain_timeout_s: float) -> bool:
        """Stop receiving, finish the frames in flight, stop every thread.

        A reload's swap under way (:meth:`reload`) ends first, within the same
        ``drain_timeout_s`` when its ``stop`` is set: its old chain's drain is cut short.

        Returns:
            True if everything in flight was published within ``drain_timeout_s`` seconds;
            False if frames had to be abandoned (they are counted as dropped, ``shutdown``).
        """
        deadline = time.monotonic() + drain_timeout_s
        for ingress in self._ingresses:
            ingress.request_stop()
        with self._swapping:
            self.status = Status.STOPPING
        for ingress in self._ingresses:
            ingress.join(max(0.0, deadline - time.monotonic()))
        if self.failure() is not None:
            self._abort_all()
        self._inbox.put_marker(STOP)
        drained = self._drain(deadline)
        if not drained:
            _log.warning("drain_timeout", drain_timeout_s=drain_timeout_s)
            self._abort_all()
        self._join_all(_ABORT_JOIN_S)
        self._release_transport()
        self._threads_ended = True  # or given up on: close() does not wait for them again
        lost = self.counts.snapshot().in_flight
        if lost > 0:
            self.counts.dropped(Reason.SHUTDOWN, lost)
        self.status = Status.STOPPED
        return drained and lost == 0

    def _drain(self, deadline: float) -> bool:
        """The chain stage by stage (:meth:`ChainRun.drain`; stage 0's STOP is already
        queued), then tell egress everything is in and join it."""
        if not self._chain.drain(deadline) or self._egress is None:
            return False
        self._results.put(STOP)
        self._egress.join(max(0.0, deadline - time.monotonic()))
        return not self._egress.is_alive()

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
        stuck = [w for w in [*self._ingresses, *self._workers] if w.is_alive()]
        if stuck:  # terminating the context would hang on their sockets
            # An old chain's thread and its successor share a name; the thread id tells
            # them apart and is what `top -H` and stack dumps show.
            _log.error("threads_stuck", threads=[f"{w.name}/{w.native_id}" for w in stuck])
        elif self._context is not None:
            self._context.term()
            self._context = None

    def close(self) -> None:
        """Close the models, then the backend. Call after :meth:`stop`; idempotent.

        Threads still running (an exit path that skipped :meth:`stop`) are aborted first.

        Raises:
            Exception: the first release that failed, once everything was released.
        """
        with self._swapping:  # a reload that loads from now on leaves its models to the exit
            self._closed = True
        if not self._threads_ended and any(
            w.is_alive() for w in [*self._ingresses, *self._workers]
        ):
            self._abort_all()
            self._join_all(_ABORT_JOIN_S)
            self._release_transport()
        self._threads_ended = True
        close_all([*(c.close for c in [*self._retired, self._chain]), self._backend.close])


def _log_rejected(exc: Exception) -> None:
    """Log ``reload_rejected`` for a new chain that did not load or start: a StreamerError
    says what is wrong; anything else (an unforeseen value in the new config, which must not
    stop a serving daemon) is named with its type."""
    error = str(exc) if isinstance(exc, StreamerError) else f"{type(exc).__name__}: {exc}"
    _log.error("reload_rejected", error=error)


def _batch_counts(chain: ChainRun) -> tuple[Counter[str], Counter[tuple[str, int, int]]]:
    """A chain's batches flushed, by reason (every stage), and executed, by replica."""
    flushes: Counter[str] = Counter()
    for batcher in chain.batchers:
        flushes.update(batcher.flushes)
    batches = Counter({_replica_key(r): r.executed for rs in chain.replicas for r in rs})
    return flushes, batches


def _retried_counts(chain: ChainRun) -> Counter[str]:
    """A chain's batches retried on another replica, by model (each of its models, 0
    included)."""
    retried: Counter[str] = Counter()
    for replica in (r for rs in chain.replicas for r in rs):
        retried[replica.model.info.name] += replica.retried
    return retried


def _recovery_counts(chain: ChainRun) -> Counter[str]:
    """A chain's replicas reloaded after a lost output and back in rotation, by model (each
    of its models, 0 included)."""
    recoveries: Counter[str] = Counter()
    for replica in (r for rs in chain.replicas for r in rs):
        recoveries[replica.model.info.name] += replica.recoveries
    return recoveries


def _replica_key(replica: Replica) -> tuple[str, int, int]:
    """A replica's metric labels: a reload's new replica of the same model, device and
    index goes on counting where the old one stopped."""
    return replica.model.info.name, replica.device, replica.index


def reorder_timeout_s(config: Config, backend: Backend) -> float:
    """``daemon.reorder_timeout_s``, or when unset half of ``daemon.stall_timeout_s``: a frame
    behind ones that leave a chain early (no detection, so no crop for the next stage) may
    legitimately take seconds (1 s, the old default, published the shipped MTCNN chain's
    results out of order at light load), and the results held behind a frame that long are
    released before a source's held results would read as a stall (they count as completed
    once published). Plus, where the backend has a
    ``result_timeout_s``, four times that and :data:`RETRY_WAIT_S`: on ACL a batch may wait
    behind a lost output (found only after ``result_timeout_ms``) on the replica it was sent
    to, then once more on the one it moved to (:meth:`Dispatcher.move`), then be lost itself,
    retried (waiting up to ``RETRY_WAIT_S`` for room) and lost there too, and its frames'
    results should still come in order."""
    if config.daemon.reorder_timeout_s is not None:
        return config.daemon.reorder_timeout_s
    late_s = backend.result_timeout_s
    retried_s = 0.0 if late_s is None else 4 * late_s + RETRY_WAIT_S
    return config.daemon.stall_timeout_s / 2 + retried_s


def _reorder_window(config: Config) -> int:
    """The reorder window for ``config``'s chain; an explicit ``daemon.reorder_window`` below
    what the chain can have in flight is logged (``reorder_window_small``): the results of
    its sources can then leave out of order."""
    window = config.reorder_window()
    in_flight = config.frames_in_flight()
    if window < in_flight:
        _log.warning("reorder_window_small", reorder_window=window, frames_in_flight=in_flight)
    return window

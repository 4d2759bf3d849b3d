"""Prometheus metrics of one daemon, with the standard client library (``prometheus_client``).

Counters the pipeline already keeps (:class:`~streamer.frames.OutcomeCounts`, source
statistics, queue sizes) are read at scrape time by a custom collector, so no frame pays for
them. Only the histograms are observed on the data path, by the egress thread: batch size,
queue wait and inference time once per batch (a loop over its frames), end-to-end time as
each result leaves. The split follows Triton's queue / compute / request durations and the
``latency_ms`` of every result (``queue``, ``infer``, ``total``)::

    streamer_frames_received_total                     counter
    streamer_frames_published_total                    counter
    streamer_frames_failed_total{reason}               counter   (error results; every
                                                                 Reason.FAILURES from 0)
    streamer_frames_dropped_total{reason}              counter   (not published; every
                                                                 Reason.DROPS from 0)
    streamer_frames_in_flight                          gauge     received - published
                                                                 - failed - dropped
    streamer_queue_depth{queue}                        gauge     items waiting for a thread
    streamer_seq_gap_frames_total                      counter   frames missing in seq gaps
    streamer_stale_frames_total                        counter   duplicate or late seq
    streamer_source_restarts_total                     counter   producers restarting a source
    streamer_sources_active                            gauge     sources not ended by an eos
    streamer_sources_tracked                           gauge     sources against max_sources
    streamer_reorder_gave_up_frames_total              counter   missing frames not waited for
    streamer_reorder_late_frames_total                 counter   frames after they were given up
    streamer_batch_flushes_total{reason}               counter   batches flushed by the batcher
    streamer_replica_batches_total{model,device,replica} counter batches a replica executed
    streamer_replica_up{model,device,replica}          gauge     1 in rotation, 0 while it
                                                                 recovers or once failed
    streamer_batches_retried_total{model}              counter   failed batches run again on
                                                                 another replica (every model
                                                                 from 0)
    streamer_replica_recoveries_total{model}           counter   replicas reloaded after a
                                                                 lost output and back in
                                                                 rotation (every model from 0)
    streamer_batch_size{model}                         histogram frames per executed batch
    streamer_batch_rows_total{model}                   counter   rows executed, padding included
    streamer_batch_padding_rows_total{model}           counter   padding rows executed
    streamer_batch_wait_duration_seconds{model}        histogram preprocessed -> enqueued
    streamer_queue_duration_seconds{model}             histogram receive -> inference start
    streamer_inference_duration_seconds{model}         histogram the batch's execution
    streamer_end_to_end_duration_seconds{model}        histogram receive -> result sent
    streamer_egress_dropped_results_total{egress}      counter   results a socket had no room for
    streamer_config_last_reload_successful             gauge     1: the config file is in force
    streamer_config_last_reload_success_timestamp_seconds gauge  start or last good reload
    streamer_reload_in_progress_seconds                gauge     how long the reload under
                                                                 way has run, 0 when none
    streamer_config_reloads_total                      counter   reloads ended, whatever their
                                                                 outcome
    streamer_log_lines_dropped_total                   counter   log lines the log writer
                                                                 could not write

plus the library's ``process_*`` (memory, CPU, file descriptors) and ``python_info``. Labels
are bounded: model names come from the config, reasons from :class:`~streamer.errors.Reason`,
queue names from the pipeline; there are no per-source labels. The series of a model a
reload took out of the chain are removed (:meth:`PipelineMetrics.models_in_service`), so
renaming models at each reload does not grow ``/metrics``.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from dataclasses import dataclass, field

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    PlatformCollector,
    ProcessCollector,
)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from streamer.errors import Reason
from streamer.frames import Batch, Frame, OutcomeSnapshot
from streamer.observability.log_writer import LOG_WRITER

__all__ = ["LATENCY_BUCKETS_S", "PipelineMetrics", "PipelineSample"]

LATENCY_BUCKETS_S = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
"""Histogram buckets of the latency metrics, seconds (1 ms to 10 s)."""
_BATCH_BUCKETS = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 128)


_STREAM_METRICS = {
    "seq_gaps": ("streamer_seq_gap_frames", "Frames missing in seq gaps.", True),
    "stale_frames": ("streamer_stale_frames", "Frames with a duplicate or late seq.", True),
    "source_restarts": (
        "streamer_source_restarts",
        "Restarts of a source's producer (a new run, or seq back to 0), every one counted.",
        True,
    ),
    "active_sources": (
        "streamer_sources_active",
        "Sources seen and not forgotten, those ended by their eos left out.",
        False,
    ),
    "tracked_sources": (
        "streamer_sources_tracked",
        "Sources held against daemon.max_sources: the active ones and those ended by their "
        "eos, until forgotten.",
        False,
    ),
    "reorder_gave_up": (
        "streamer_reorder_gave_up_frames",
        "Missing frames whose source's results stopped waiting for them (window or timeout).",
        True,
    ),
    "reorder_late": (
        "streamer_reorder_late_frames",
        "Frames released out of order, after they had been given up on.",
        True,
    ),
}
"""``Pipeline.stream_stats()`` key -> (metric name, help, is a counter); a key not listed is
exported as a gauge named ``streamer_<key>``."""


@dataclass(frozen=True)
class PipelineSample:
    """What the pipeline reports at one scrape.

    Attributes:
        outcomes: the frame outcome counts.
        queue_depths: items waiting in each internal queue, by the name of the thread that
            takes them (``batcher``: frames; ``dequeue``, ``egress``: batches).
        streams: per-source stream totals, summed over sources (``seq_gaps``,
            ``source_restarts``, ``active_sources``, …; see ``_STREAM_METRICS``).
        flushes: batches the batcher flushed, by reason (``full``, ``deadline``, ``marker``).
        replicas: per model replica ``(model, device, index, batches executed, in
            rotation)``, the index being its place among its stage's replicas.
        retried: batches that failed on one replica and were queued on another, by model
            (every model of the chain, 0 included).
        recoveries: replicas whose model was reloaded after a lost output and that went
            back into rotation, by model (every model of the chain, 0 included).
    """

    outcomes: OutcomeSnapshot
    queue_depths: Mapping[str, int]
    streams: Mapping[str, int]
    flushes: Mapping[str, int] = field(default_factory=dict)
    replicas: Sequence[tuple[str, int, int, int, bool]] = ()
    retried: Mapping[str, int] = field(default_factory=dict)
    recoveries: Mapping[str, int] = field(default_factory=dict)


class _PipelineCollector(Collector):
    """Turns a :class:`PipelineSample`, read at scrape time, into metric families."""

    def __init__(self, read: Callable[[], PipelineSample]) -> None:
        self._read = read

    def collect(self) -> Iterator[Metric]:
        sample = self._read()
        yield from _outcome_families(sample.outcomes)
        depth = GaugeMetricFamily(
            "streamer_queue_depth", "Items waiting in an internal queue.", labels=["queue"]
        )
        for name, items in sorted(sample.queue_depths.items()):
            depth.add_metric([name], items)
        yield depth
        for key, value in sorted(sample.streams.items()):
            name, doc, counter = _STREAM_METRICS.get(key, (f"streamer_{key}", key, False))
            family = CounterMetricFamily if counter else GaugeMetricFamily
            yield family(name, doc, value)
        flushes = CounterMetricFamily(
            "streamer_batch_flushes", "Batches flushed by the batcher.", labels=["reason"]
        )
        for reason, count in sorted(sample.flushes.items()):
            flushes.add_metric([reason], count)
        yield flushes
        yield from _replica_families(sample.replicas)
        yield _by_model(
            "streamer_batches_retried",
            "Batches that failed on one replica and were queued on another.",
            sample.retried,
        )
        yield _by_model(
            "streamer_replica_recoveries",
            "Replicas whose model was reloaded after a lost output and went back into rotation.",
            sample.recoveries,
        )
        yield CounterMetricFamily(
            "streamer_log_lines_dropped",
            "Log lines dropped: standard output not read (10000 waiting) or its file full.",
            LOG_WRITER.dropped,
        )


def _replica_families(replicas: Sequence[tuple[str, int, int, int, bool]]) -> Iterator[Metric]:
    labels = ["model", "device", "replica"]
    executed = CounterMetricFamily(
        "streamer_replica_batches", "Batches a model replica executed.", labels=labels
    )
    up = GaugeMetricFamily(
        "streamer_replica_up",
        "1 while a replica is in rotation, 0 while it recovers or once it failed.",
        labels=labels,
    )
    for model, device, index, batches, alive in replicas:
        executed.add_metric([model, str(device), str(index)], batches)
        up.add_metric([model, str(device), str(index)], 1 if alive else 0)
    yield executed
    yield up


def _outcome_families(outcomes: OutcomeSnapshot) -> Iterator[Metric]:
    yield CounterMetricFamily("streamer_frames_received", "Frames received.", outcomes.received)
    yield CounterMetricFamily(
        "streamer_frames_published", "Frames published with a result.", outcomes.published
    )
    failed = "Frames published as error results."
    yield _by_reason("streamer_frames_failed", failed, Reason.FAILURES, outcomes.failed)
    dropped = "Frames dropped (not published)."
    yield _by_reason("streamer_frames_dropped", dropped, Reason.DROPS, outcomes.dropped)
    yield GaugeMetricFamily(
        "streamer_frames_in_flight",
        "Frames received and not yet published, failed or dropped.",
        outcomes.in_flight,
    )


def _by_reason(
    name: str, doc: str, known: Sequence[str], counts: Mapping[str, int]
) -> CounterMetricFamily:
    """A counter by ``reason``: each ``known`` reason (the ones it can carry) from 0, so that
    ``rate()`` sees the first increment and an alert on an absent series does not fire, and
    any other reason counted."""
    family = CounterMetricFamily(name, doc, labels=["reason"])
    for reason, count in sorted((dict.fromkeys(known, 0) | dict(counts)).items()):
        family.add_metric([reason], count)
    return family


def _by_model(name: str, doc: str, counts: Mapping[str, int]) -> CounterMetricFamily:
    """A counter by ``model``, one series per model in ``counts``."""
    family = CounterMetricFamily(name, doc, labels=["model"])
    for model, count in sorted(counts.items()):
        family.add_metric([model], count)
    return family


class PipelineMetrics:
    """The daemon's metrics, in a registry of their own.

    The ``observe_*`` methods are for the egress thread; :attr:`registry` may be read by any
    thread (the HTTP server's).

    Attributes:
        registry: what ``/metrics`` exposes.
    """

    def __init__(self) -> None:
        # Collectors that cannot name their series up front (the process, platform and
        # pipeline collectors) still answer a ``name[]``-filtered scrape.
        self.registry = CollectorRegistry(support_collectors_without_names=True)
        ProcessCollector(registry=self.registry)
        PlatformCollector(registry=self.registry)
        self._batch_size = Histogram(
            "streamer_batch_size",
            "Frames per executed batch (padding rows excluded).",
            ["model"],
            buckets=_BATCH_BUCKETS,
            registry=self.registry,
        )
        self._rows = Counter(
            "streamer_batch_rows",
            "Rows executed (frames plus padding); padding ratio = padding_rows / rows.",
            ["model"],
            registry=self.registry,
        )
        self._padding = Counter(
            "streamer_batch_padding_rows",
            "Padding rows executed to fill a batch up to a gear.",
            ["model"],
            registry=self.registry,
        )
        self._egress_dropped = Counter(
            "streamer_egress_dropped_results",
            "Results an egress socket had no room for (a PUSH reader behind or absent).",
            ["egress"],
            registry=self.registry,
        )
        self._batch_wait_s = self._latency(
            "batch_wait", "Preprocessed to enqueued: the wait in the batcher, per frame."
        )
        self._queue_s = self._latency("queue", "Receive to inference start, per frame.")
        self._inference_s = self._latency("inference", "The batch's execution, per frame.")
        self._end_to_end_s = self._latency("end_to_end", "Receive to result sent, per frame.")
        self._config_in_force = Gauge(
            "streamer_config_last_reload_successful",
            "1 when the config file is in force (start, good reload); 0 after a reload that "
            "was rejected, failed or left settings for a restart.",
            registry=self.registry,
        )
        self._config_in_force_at_s = Gauge(
            "streamer_config_last_reload_success_timestamp_seconds",
            "Unix time of the start or of the last successful reload.",
            registry=self.registry,
        )
        self._reload_started_s: float | None = None
        self._reloads_ended = Counter(
            "streamer_config_reloads",
            "Reloads (SIGHUP) ended, whatever their outcome: once it has moved past its value "
            "before a SIGHUP, the config gauges are that reload's.",
            registry=self.registry,
        )
        Gauge(
            "streamer_reload_in_progress_seconds",
            "Seconds the reload under way (SIGHUP) has run; 0 when none.",
            registry=self.registry,
        ).set_function(self._reload_running_s)
        self._per_model = [
            self._batch_size,
            self._rows,
            self._padding,
            self._batch_wait_s,
            self._queue_s,
            self._inference_s,
            self._end_to_end_s,
        ]
        # The models whose series are kept (None: any), and the names that have series.
        self._models_lock = threading.Lock()
        self._in_service: frozenset[str] | None = None
        self._observed: set[str] = set()

    def _latency(self, name: str, doc: str) -> Histogram:
        return Histogram(
            f"streamer_{name}_duration_seconds",
            doc,
            ["model"],
            buckets=LATENCY_BUCKETS_S,
            registry=self.registry,
        )

    def watch(self, read: Callable[[], PipelineSample]) -> None:
        """Export what ``read`` returns at every scrape; call once, with the pipeline loaded.

        Args:
            read: returns the pipeline's current counters and gauges; called by the HTTP
                thread, so it must be thread-safe.
        """
        self.registry.register(_PipelineCollector(read))

    def models_in_service(self, names: Collection[str]) -> None:
        """The models of the chain in service, once a reload retired the one before: the
        per-model series (``{model}`` labels) of every other model are removed, and its
        observations from now on ignored (the last results of a retired model still on
        their way to egress); those of ``names`` go on counting. Until the first call every
        model's series are kept. Any thread.

        Args:
            names: the ``[[models]]`` names of the chain in service.
        """
        with self._models_lock:
            self._in_service = frozenset(names)
            for model in self._observed - self._in_service:
                for metric in self._per_model:
                    with contextlib.suppress(KeyError):  # no series of it (older clients raise)
                        metric.remove(model)
            self._observed &= self._in_service

    def _tracked(self, model: str) -> bool:
        """Under ``_models_lock``: whether ``model``'s series are kept (its labels are then
        recorded as observed)."""
        if self._in_service is not None and model not in self._in_service:
            return False
        self._observed.add(model)
        return True

    def observe_batch(self, batch: Batch) -> None:
        """Batch size, and queue wait and inference time of each executed frame.

        Args:
            batch: a batch back from its model, ``infer_*_ns`` set on the frames it executed
                (``batch.good``); a batch that executed nothing, or of a model out of
                service, is ignored.
        """
        executed = [f for f in batch.good if f.infer_start_ns]
        if not executed:
            return
        model = executed[0].model
        with self._models_lock:
            if self._tracked(model):
                self._observe_executed(model, batch, executed)

    def _observe_executed(self, model: str, batch: Batch, executed: list[Frame]) -> None:
        self._batch_size.labels(model).observe(len(executed))
        self._rows.labels(model).inc(max(batch.rows, len(executed)))
        self._padding.labels(model).inc(max(batch.rows - len(executed), 0))
        queue_s, inference_s = self._queue_s.labels(model), self._inference_s.labels(model)
        wait_s = self._batch_wait_s.labels(model)
        for frame in executed:
            queue_s.observe((frame.infer_start_ns - frame.received_at_ns) / 1e9)
            inference_s.observe((frame.infer_end_ns - frame.infer_start_ns) / 1e9)
            if frame.prepared_at_ns:
                wait_s.observe((frame.batched_at_ns - frame.prepared_at_ns) / 1e9)

    def observe_config(self, in_force: bool, wall_s: float) -> None:
        """The outcome of reading the config file, at start and at each reload (SIGHUP);
        the control thread's. Named after Prometheus' own
        ``prometheus_config_last_reload_successful`` and ``…_success_timestamp_seconds``.

        Args:
            in_force: True when the whole file is in force (the start, a reload applied or
                with nothing to change); False when a reload was rejected, failed, or
                changed settings that wait for a restart.
            wall_s: when, ``time.time()`` (Unix seconds); kept only when ``in_force``.
        """
        self._config_in_force.set(1 if in_force else 0)
        if in_force:
            self._config_in_force_at_s.set(wall_s)

    def observe_reload(self, started_s: float | None) -> None:
        """The reload under way: when it began (``time.monotonic()`` s), None once it has
        ended (``streamer_reload_in_progress_seconds`` then reads 0 and
        ``streamer_config_reloads_total`` counts it); the control thread's."""
        if started_s is None and self._reload_started_s is not None:
            self._reloads_ended.inc()
        self._reload_started_s = started_s

    def _reload_running_s(self) -> float:
        """``streamer_reload_in_progress_seconds`` at scrape time (any thread)."""
        started_s = self._reload_started_s  # one read: the control thread may clear it
        return 0.0 if started_s is None else time.monotonic() - started_s

    def observe_dropped(self, egress: str, results: int = 1) -> None:
        """``results`` the ``egress`` socket (its ``[[egress]]`` name) had no room for; 0
        exports its series from 0."""
        self._egress_dropped.labels(egress).inc(results)

    def observe_sent(self, frame: Frame, done_ns: int) -> None:
        """End-to-end time of a frame whose result was sent; frames no model ran, or whose
        model is out of service, are ignored.

        Args:
            frame: the frame, ``received_at_ns`` set.
            done_ns: ``time.monotonic_ns()`` when its result was encoded and sent.
        """
        if not frame.model:
            return
        with self._models_lock:
            if self._tracked(frame.model):
                elapsed_s = (done_ns - frame.received_at_ns) / 1e9
                self._end_to_end_s.labels(frame.model).observe(elapsed_s)

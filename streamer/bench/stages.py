"""Per-stage time inside the daemon during one run, and the slowest stage named.

Two views, each only where it can be observed from outside the daemon:

- **CPU** of each stage's threads, per frame, from the per-thread CPU times of the daemon
  process (:mod:`.threads`), grouped by thread name (``ingress-*`` → ingress, ``prepare_*``
  → decode+preprocess, …), with how busy each thread was (CPU time ÷ the run's wall time).
- **Wall** time per frame from the ``/metrics`` histograms (:mod:`.scrape`):
  ``streamer_queue_duration_seconds`` (receive → inference start),
  ``streamer_batch_wait_duration_seconds`` (preprocessed → enqueued),
  ``streamer_inference_duration_seconds`` (a batch's execution) and
  ``streamer_end_to_end_duration_seconds`` (receive → result sent). Their differences give
  spans that cover more than one stage; each row says which span it shows. Ingress and
  egress have no histogram of their own.

The slowest stage is the one whose threads spend the most time per frame each (CPU ms per
frame ÷ its threads): a stage that needs more than 1 / throughput per frame on each of its
threads is what caps the rate. Without thread names (no py-spy) it falls back to the
largest ``/metrics`` span, and says so.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import overload

from streamer.bench.components import Components
from streamer.bench.scrape import MetricsDelta

__all__ = ["Stage", "StageReport", "stage_report"]

_STAGES: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("ingress", ("ingress-",)),
    ("decode+preprocess", ("prepare",)),
    ("batching", ("batcher-", "enqueue-")),
    ("inference", ("onnx-", "acl-sim-", "acl-thread-")),
    ("acl callbacks", ("acl-report-",)),
    ("postprocess", ("dequeue-",)),
    ("egress", ("egress",)),
    ("zmq i/o", ("ZMQbg/",)),
    ("control+http", ("MainThread", "http")),
)
_NOT_STAGES = ("zmq i/o", "control+http")
_DEVICE_STAGES = ("inference",)
"""The threads that execute the model: on an NPU, the device's work."""
_HIST = "streamer_{}_duration_seconds"


@dataclass(frozen=True)
class Stage:
    """One stage of the daemon during a run.

    Attributes:
        name: ``ingress``, ``decode+preprocess``, ``batching``, ``inference``, …, or a
            thread's own name when it belongs to no known stage.
        threads: threads of the stage (0 when threads could not be told apart).
        cpu_ms: CPU time of its threads per frame, ms; None when not observable.
        busy_pct: CPU time ÷ (run wall time × threads), %; None when not observable.
        wall_ms: mean wall time per frame of the span in ``wall_span``, ms; None if none.
        wall_span: what ``wall_ms`` covers, or why there is no wall time.
        alone_cpu_ms: the same step alone on one thread (``components``), CPU ms per frame.
    """

    name: str
    threads: int
    cpu_ms: float | None
    busy_pct: float | None
    wall_ms: float | None
    wall_span: str
    alone_cpu_ms: float | None


@dataclass(frozen=True)
class StageReport:
    """The stages of one run and what they add up to.

    Attributes:
        stages: in pipeline order.
        slowest: the name of the slowest stage.
        slowest_basis: how it was chosen.
        mean_batch_size: frames per executed batch (``streamer_batch_size``).
        rows_per_run: the rows per model run at most that the daemon's backend cuts its
            batches into (onnxruntime's ``rows_per_run`` where it applies; 0 = whole).
        daemon_cpu_ms: the daemon process's CPU time per frame, ms.
        work_cpu_ms: decode + preprocess + inference of ``mean_batch_size`` batches in runs
            of at most ``rows_per_run`` rows + postprocess, each alone (``components``), CPU
            ms per frame.
        overhead_cpu_ms: ``daemon_cpu_ms - work_cpu_ms``: what the daemon adds per frame
            (receive, header, queues, batch assembly, result, publish, metrics).
        cores_used: the daemon's CPU time ÷ the run's wall time.
        host_cpu_ms: the daemon's CPU time per frame outside the threads that execute the
            model (``inference``: onnxruntime's session thread, the simulator's device
            threads): what an NPU leaves to the host CPU, ms; None when the threads could not
            be told apart.
    """

    stages: tuple[Stage, ...]
    slowest: str
    slowest_basis: str
    mean_batch_size: float | None
    rows_per_run: int
    daemon_cpu_ms: float
    work_cpu_ms: float
    overhead_cpu_ms: float
    cores_used: float | None
    host_cpu_ms: float | None = None

    def against(self, components: Components) -> StageReport:
        """This report with its steps-alone figures (each stage's ``alone_cpu_ms``,
        ``work_cpu_ms``, ``overhead_cpu_ms``) from ``components``: the benchmark's cheapest
        round of each step, which the limit comes from too."""
        stages, work_cpu, overhead = _steps_alone(
            self.stages, self.daemon_cpu_ms, components, self.mean_batch_size, self.rows_per_run
        )
        return replace(self, stages=stages, work_cpu_ms=work_cpu, overhead_cpu_ms=overhead)


def stage_report(
    thread_cpu_ns: Mapping[int, int],
    thread_names: Mapping[int, str],
    metrics: MetricsDelta,
    components: Components,
    frames: int,
    seconds: float,
    rows_per_run: int = 0,
) -> StageReport:
    """Put one run's measurements together.

    Args:
        thread_cpu_ns: thread id → CPU ns spent during the run.
        thread_names: thread id → name (:func:`streamer.bench.threads.thread_names`).
        metrics: the ``/metrics`` change over the run.
        components: the in-process cost of each step.
        frames: frames that got a result during the run.
        seconds: the run's wall time, s.
        rows_per_run: the rows per model run at most that the daemon's backend cuts its
            batches into (:attr:`~streamer.bench.work.FrameWork.rows_per_run`); 0 = whole.
    """
    frames = max(frames, 1)
    groups = _group_threads(thread_cpu_ns, thread_names)
    walls = _wall_spans(metrics)
    mean_batch = metrics.mean("streamer_batch_size")
    measured = tuple(
        _stage(name, groups.get(name, []), walls.get(name), frames, seconds)
        for name in _stage_order(groups)
    )
    slowest, basis = _slowest(measured)
    cpu_s = _daemon_cpu_s(thread_cpu_ns, metrics)
    daemon_cpu = cpu_s * 1000 / frames
    stages, work_cpu, overhead = _steps_alone(
        measured, daemon_cpu, components, mean_batch, rows_per_run
    )
    cores = cpu_s / seconds if seconds > 0 else None
    device = [ns for name in _DEVICE_STAGES for ns in groups.get(name, [])]
    host_cpu = daemon_cpu - sum(device) / 1e6 / frames if device else None
    return StageReport(
        stages, slowest, basis, _round(mean_batch), rows_per_run, _round(daemon_cpu),
        work_cpu, overhead, _round(cores), _round(host_cpu),
    )  # fmt: skip


def _steps_alone(
    stages: tuple[Stage, ...],
    daemon_cpu_ms: float,
    components: Components,
    mean_batch: float | None,
    rows_per_run: int,
) -> tuple[tuple[Stage, ...], float, float]:
    """``stages`` with each one's ``alone_cpu_ms`` from ``components``, the work alone
    (CPU ms per frame) and the daemon's overhead over it."""
    alone = _alone_costs(components, mean_batch, rows_per_run)
    work_cpu = sum(alone.values())
    with_alone = tuple(replace(s, alone_cpu_ms=_round(alone.get(s.name))) for s in stages)
    return with_alone, _round(work_cpu), _round(daemon_cpu_ms - work_cpu)


def _daemon_cpu_s(thread_cpu_ns: Mapping[int, int], metrics: MetricsDelta) -> float:
    """The daemon's CPU seconds in the run: its threads' (ns resolution), else ``/metrics``'
    ``process_cpu_seconds_total`` (clock-tick resolution)."""
    if thread_cpu_ns:
        return sum(thread_cpu_ns.values()) / 1e9
    return metrics.get("process_cpu_seconds_total")


def _stage_of(thread: str) -> str:
    for stage, prefixes in _STAGES:
        if thread.startswith(prefixes):
            return stage
    return thread


def _group_threads(cpu_ns: Mapping[int, int], names: Mapping[int, str]) -> dict[str, list[int]]:
    """Stage → CPU ns of each of its threads."""
    groups: dict[str, list[int]] = defaultdict(list)
    for tid, ns in cpu_ns.items():
        groups[_stage_of(names.get(tid, "?"))].append(ns)
    return dict(groups)


def _stage_order(groups: Mapping[str, list[int]]) -> list[str]:
    known = [stage for stage, _ in _STAGES]
    return known + sorted(name for name in groups if name not in known)


def _wall_spans(metrics: MetricsDelta) -> dict[str, tuple[float | None, str]]:
    """Stage → (mean wall ms per frame, the span it covers)."""
    queue, wait = metrics.mean(_HIST.format("queue")), metrics.mean(_HIST.format("batch_wait"))
    infer, total = metrics.mean(_HIST.format("inference")), metrics.mean(_HIST.format("end_to_end"))
    return {
        "ingress": (None, "not observable: a frame's receive time is taken after it is read"),
        "decode+preprocess": (
            _minus(queue, wait),
            "receive → preprocessed, plus enqueued → inference start (queue − batch_wait)",
        ),
        "batching": (_ms(wait), "preprocessed → enqueued (batch_wait)"),
        "inference": (_ms(infer), "one batch's execution (inference)"),
        "postprocess": (
            _minus(total, queue, infer),
            "inference end → result sent: postprocess and egress (end_to_end − queue − inference)",
        ),
        "egress": (None, "not observable apart: inside the postprocess row's span"),
    }


def _alone_costs(
    components: Components, mean_batch: float | None, rows_per_run: int
) -> dict[str, float]:
    """Stage → the CPU ms per frame of the same step alone (``components``), inference of
    ``mean_batch`` batches (the smallest batch size measured when unknown) as the daemon
    runs them."""
    batch = mean_batch if mean_batch is not None else min(components.inference)
    return {
        "decode+preprocess": components.decode.cpu_ms + components.preprocess.cpu_ms,
        "inference": components.inference_in_runs(batch, rows_per_run).cpu_ms,
        "postprocess": components.postprocess.cpu_ms,
    }


def _stage(
    name: str,
    cpu_ns: list[int],
    wall: tuple[float | None, str] | None,
    frames: int,
    seconds: float,
) -> Stage:
    """One stage as measured; its ``alone_cpu_ms`` comes from :func:`_steps_alone`."""
    wall_ms, span = wall if wall is not None else (None, "no metric")
    if not cpu_ns:
        return Stage(name, 0, None, None, _round(wall_ms), span, None)
    total_ns = sum(cpu_ns)
    busy = total_ns / 1e9 / (seconds * len(cpu_ns)) * 100 if seconds > 0 else None
    cpu_ms = total_ns / 1e6 / frames
    return Stage(name, len(cpu_ns), _round(cpu_ms), _round(busy), _round(wall_ms), span, None)


def _slowest(stages: tuple[Stage, ...]) -> tuple[str, str]:
    """The slowest stage, and how it was chosen."""
    timed = [s for s in stages if s.cpu_ms is not None and s.name not in _NOT_STAGES]
    known = {stage for stage, _ in _STAGES}
    if any(s.name in known for s in timed):
        slowest = max(timed, key=lambda s: s.cpu_ms / s.threads)  # type: ignore[operator]
        return slowest.name, "most CPU time per frame on each of its threads"
    walled = [s for s in stages if s.wall_ms is not None and s.name != "batching"]
    if not walled:
        return "unknown", "neither thread names nor /metrics were available"
    slowest = max(walled, key=lambda s: s.wall_ms)  # type: ignore[arg-type, return-value]
    return slowest.name, "largest /metrics span (thread names not readable: install py-spy)"


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else seconds * 1000


def _minus(first: float | None, *others: float | None) -> float | None:
    if first is None or any(o is None for o in others):
        return None
    return (first - sum(o for o in others if o is not None)) * 1000


@overload
def _round(value: float) -> float: ...


@overload
def _round(value: float | None) -> float | None: ...


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 4)

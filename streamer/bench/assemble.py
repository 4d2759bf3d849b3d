"""Turning the measurements of one invocation into its :class:`BenchReport`."""

from __future__ import annotations

import datetime
import math
import platform
import statistics
import sys
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import cv2
import numpy as np
import onnxruntime as ort

from streamer.bench.ceiling import Ceiling, find_ceiling
from streamer.bench.components import Components, Limit, find_limit
from streamer.bench.daemon_run import DaemonDetail
from streamer.bench.frameset import FrameSet
from streamer.bench.harness import Measured
from streamer.bench.modes import DAEMON, PROFILED, daemon_mode
from streamer.bench.pace import limit_at_pace
from streamer.bench.report import BenchReport, InputReport
from streamer.bench.targets import (
    BatchSizeFinding,
    batch_size_target,
    input_targets,
    rows_per_run_target,
)

__all__ = ["Measurements", "assemble"]


@dataclass(frozen=True)
class Measurements:
    """Everything one invocation measured.

    Attributes:
        settings: how it ran (see :func:`settings`).
        frames: input name → its frames.
        components: input name → the steps alone.
        rounds: per round, input name → mode → run.
        profiled: input name → the profiled run (empty without ``--profile``).
        max_sizes: the daemons' ``max_size``, the primary first.
        configured_max_size: the base config's ``max_size``.
        max_delay_ms: the config's ``max_delay_ms``.
        cores: CPU cores of the machine.
        files: what was written, by kind.
    """

    settings: dict[str, Any]
    frames: dict[str, FrameSet]
    components: dict[str, Components]
    rounds: list[dict[str, dict[str, Measured]]]
    profiled: dict[str, Measured]
    max_sizes: tuple[int, ...]
    configured_max_size: int
    max_delay_ms: float
    cores: int
    files: dict[str, str]


def assemble(data: Measurements) -> BenchReport:
    """The report: each mode's best round, the limits, the targets."""
    inputs = [_input_report(data, name, frames) for name, frames in data.frames.items()]
    rows = _rows_per_run(data)
    finding = _batch_size_finding(data, inputs, rows or 0)
    targets = [batch_size_target(data.configured_max_size, finding)]
    if rows is not None:
        components = [i.components for i in inputs]
        targets.append(rows_per_run_target(rows, data.configured_max_size, components))
    return BenchReport(data.settings, inputs, finding, targets, data.files)


def _rows_per_run(data: Measurements) -> int | None:
    """The rows per model run at most that applied in the primary daemon (its stage
    report's), or None on a backend without ``rows_per_run``."""
    if data.settings["backend"] != "onnxruntime":
        return None
    detail = next(iter(data.rounds[0].values()))[DAEMON].detail
    return detail.stages.rows_per_run if detail is not None else None


def _input_report(data: Measurements, name: str, frames: FrameSet) -> InputReport:
    picked = {mode: _pick([r[name][mode] for r in data.rounds]) for mode in data.rounds[0][name]}
    if name in data.profiled:
        picked[PROFILED] = data.profiled[name]
    runs = {mode: measured.result for mode, measured in picked.items()}
    components = data.components[name]
    details = {  # steps alone as in the limit, not as in the round the run was picked from
        mode: replace(m.detail, stages=m.detail.stages.against(components))
        for mode, m in picked.items()
        if m.detail is not None
    }
    limit = find_limit(components, data.cores)
    ceiling = _ceiling(components, limit, details.get(DAEMON))
    daemon_rounds = [r[name][DAEMON] for r in data.rounds]
    at_pace = limit_at_pace(limit.cores, [(m.result.fps, m.pace) for m in daemon_rounds])
    primary = data.max_sizes[0]
    rows = _rows_per_run(data) or 0
    targets = input_targets(name, runs, limit, components, primary, data.max_delay_ms, rows)
    return InputReport(
        name, frames.encoding, frames.width, frames.height, round(frames.mean_bytes(), 1),
        components, limit, runs, details, targets, ceiling, at_pace,
    )  # fmt: skip


def _ceiling(components: Components, limit: Limit, daemon: DaemonDetail | None) -> Ceiling | None:
    """The ceiling with the producer and subscriber of the daemon run reported."""
    if daemon is None:
        return None
    return find_ceiling(components, limit, daemon.producer_cpu_ms, daemon.subscriber_cpu_ms)


def _pick(rounds: Sequence[Measured]) -> Measured:
    """Of one mode's rounds, the best, with every round's fps in ``rounds_fps``.

    Load from elsewhere on a shared machine (other processes, other virtual machines on the
    host, which no counter here sees) only slows a run down, so the best round is the least
    disturbed one: the fastest, or for a paced run the one with the lowest p99 latency.
    """
    best = max(rounds, key=_goodness)
    every = tuple(m.result.fps for m in rounds)
    return replace(best, result=replace(best.result, rounds_fps=every))


def _goodness(measured: Measured) -> float:
    if measured.detail is not None and measured.detail.rate_fps:
        latency = measured.result.latency
        return -latency.p99_ms if latency is not None else -math.inf
    return measured.result.fps


def _batch_size_finding(
    data: Measurements, inputs: list[InputReport], rows_per_run: int
) -> BatchSizeFinding:
    """Speed per ``max_size``: the daemon's throughput over both inputs (geometric mean of
    each input's median fps over the rounds), or with only one daemon, 1 ÷ the inference CPU
    time per frame alone, as the daemon runs it; in runs of at most ``rows_per_run`` rows
    that cannot tell the sizes apart (inconclusive)."""
    sizes = data.max_sizes
    if len(sizes) == 1:
        batch_sizes = inputs[0].components.inference
        cost = {
            b: sum(i.components.inference_in_runs(b, rows_per_run).cpu_ms for i in inputs)
            for b in batch_sizes
        }
        speeds = {b: 1 / ms for b, ms in cost.items()}
        runs = f", in runs of at most {rows_per_run} rows" if rows_per_run else ""
        basis = f"inference alone: 1 / CPU ms per frame{runs}"
        return BatchSizeFinding.of(speeds, basis, conclusive=not rows_per_run)

    def fps(item: InputReport, size: int) -> float:
        return statistics.median(item.runs[daemon_mode(size, sizes[0])].rounds_fps)

    speeds = {s: float(np.prod([fps(i, s) for i in inputs])) ** (1 / len(inputs)) for s in sizes}
    return BatchSizeFinding.of(speeds, "daemon: median fps of its rounds, both inputs")


def settings(**given: Any) -> dict[str, Any]:
    """``given`` (config, backend, frames, rounds, …) and what describes the machine."""
    return {
        "started": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        **given,
        "cpu": _cpu_model(),
        "python": platform.python_version(),
        "onnxruntime": ort.__version__,
        "opencv": cv2.__version__,
        "numpy": np.__version__,
        "platform": platform.platform(),
        "argv": sys.argv[1:],
    }


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.partition(":")[2].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"

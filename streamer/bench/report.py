"""The benchmark's report: its data, the JSON file, and the table printed at the end."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from streamer.bench.ceiling import Ceiling
from streamer.bench.components import Components, Limit, mean_run_rows
from streamer.bench.daemon_run import DaemonDetail
from streamer.bench.modes import DAEMON, DEVICE_SIDE, PROFILED
from streamer.bench.pace import LimitAtPace
from streamer.bench.profile import Profile
from streamer.bench.stages import StageReport
from streamer.bench.stats import RunResult
from streamer.bench.targets import BatchSizeFinding, Target

__all__ = ["BenchReport", "InputReport", "format_report", "write_json"]


@dataclass(frozen=True)
class InputReport:
    """Everything measured on one input.

    Attributes:
        name, encoding: the input (``carphone_raw``, ``raw``).
        width, height: frame size, pixels.
        mean_payload_bytes: average message payload, bytes.
        components, limit: the steps alone and the bound.
        runs: mode → throughput and latency, by the names of :mod:`.modes`.
        daemon: the daemon runs' details, by the same mode names.
        targets: the per-input targets.
        ceiling: what a daemon with no overhead could reach beside the daemon run's
            producer and subscriber (:mod:`.ceiling`); None where not measured.
        limit_at_pace: each round's daemon run against the limit at its pace
            (:mod:`.pace`); None where not measured.
    """

    name: str
    encoding: str
    width: int
    height: int
    mean_payload_bytes: float
    components: Components
    limit: Limit
    runs: dict[str, RunResult]
    daemon: dict[str, DaemonDetail]
    targets: list[Target]
    ceiling: Ceiling | None = None
    limit_at_pace: LimitAtPace | None = None


@dataclass(frozen=True)
class BenchReport:
    """One invocation of ``streamer bench``.

    Attributes:
        settings: how it ran (frames, backend, max sizes, config, cores, versions).
        inputs: one report per input.
        max_size: which batch ``max_size`` is fastest.
        targets: the targets that span inputs.
        files: what was written (``json``, ``plot``, logs), paths.
    """

    settings: dict[str, Any]
    inputs: list[InputReport]
    max_size: BatchSizeFinding
    targets: list[Target]
    files: dict[str, str]


def write_json(report: BenchReport, path: Path) -> None:
    """Write ``report`` as indented JSON."""
    path.write_text(json.dumps(dataclasses.asdict(report), indent=2) + "\n")


def format_report(report: BenchReport) -> str:
    """The report as text tables: modes, components, stages, targets."""
    lines = [_title(report.settings), _NOTE]
    for item in report.inputs:
        lines += ["", *_modes(item), "", *_components(item.components)]
        stages = item.daemon.get(DAEMON)
        if stages is not None:
            lines += ["", *_stages(stages.stages)]
        if item.ceiling is not None:
            lines += _ceiling(item.ceiling, item.runs[DAEMON].fps)
        if item.limit_at_pace is not None:
            lines += _at_pace(item.limit_at_pace)
        device = item.daemon.get(DEVICE_SIDE)
        if stages is not None and device is not None:
            lines.append(_host_cpu(stages.stages, device.stages))
        profiled = item.daemon.get(PROFILED)
        if profiled is not None and profiled.profile is not None:
            lines += ["", *_profile(profiled.profile)]
    lines += ["", *_targets([t for i in report.inputs for t in i.targets] + report.targets)]
    speeds = ", ".join(f"{s}: {v:.2f}" for s, v in report.max_size.relative_speed.items())
    lines += ["", f"max_size speed / fastest ({report.max_size.basis}): {speeds}"]
    lines += [f"{kind}: {path}" for kind, path in report.files.items()]
    return "\n".join(lines)


_NOTE = (
    "each mode: the best of its rounds (the fastest; for a paced run, the lowest p99); "
    "a daemon's frames/s is its steady rate, while its producer sent, once the first tenth "
    "of its results were in (whole run = from its first frame sent to its last result); "
    "others = CPU cores other processes used during it; idle = CPU cores left idle from an "
    "unpaced daemon run's first frame sent to its last result"
)


def _title(settings: dict[str, Any]) -> str:
    rounds = settings["rounds"]
    return (
        f"streamer bench: backend {settings['backend']}, {settings['cores']} CPU cores, "
        f"{settings['frames']} frames per run, {rounds} round{'s' if rounds != 1 else ''}, "
        f"max_size {settings['max_sizes'][0]}, config {settings['config']}"
    )


def _modes(item: InputReport) -> list[str]:
    header = f"{item.name} ({item.width}x{item.height} {item.encoding})"
    lines = [
        f"{header:54} {'frames/s':>9} {'x limit':>7} {'p50 ms':>8} {'p95 ms':>8} "
        f"{'p99 ms':>8} {'others':>6} {'idle':>5} {'whole run':>9}"
    ]
    lines.append(_mode_line(f"limit (batch {item.limit.batch_size})", item.limit.fps, item.limit))
    for mode, run in item.runs.items():
        lines.append(_mode_line(_mode_label(mode, item), run.fps, item.limit, run))
    return lines


def _mode_label(mode: str, item: InputReport) -> str:
    detail = item.daemon.get(mode)
    if detail is None:
        return mode
    label = f"{mode} (max_size {detail.max_size}"
    if detail.rate_fps:
        label += f", {detail.rate_fps:.0f} fps offered"
    return label + ")"


def _mode_line(label: str, fps: float, limit: Limit, run: RunResult | None = None) -> str:
    ratio = fps / limit.fps if limit.fps else 0.0
    line = f"  {label:52} {fps:9.1f} {ratio:7.2f}"
    if run is None:
        return line
    latency = run.latency
    percentiles = (latency.p50_ms, latency.p95_ms, latency.p99_ms) if latency else (None,) * 3
    cells = (*percentiles, run.others_cores, run.idle_cores)
    widths = (8, 8, 8, 6, 5)
    line += "".join(f" {_cell(v, width, 2)}" for v, width in zip(cells, widths, strict=True))
    return f"{line} {_cell(run.whole_run_fps, 9, 1)}"


def _components(components: Components) -> list[str]:
    lines = [f"  {'step alone, one thread':40} {'CPU ms/frame':>13} {'wall ms/frame':>14}"]
    rows = [("decode", components.decode), ("preprocess", components.preprocess)]
    rows += [(f"inference, batch {b}", c) for b, c in sorted(components.inference.items())]
    rows += [("postprocess", components.postprocess)]
    lines += [f"  {name:40} {cost.cpu_ms:13.3f} {cost.wall_ms:14.3f}" for name, cost in rows]
    return lines


def _stages(report: StageReport) -> list[str]:
    lines = [
        f"  {'daemon stage at full load':24} {'threads':>7} {'CPU ms/fr':>9} {'busy %':>7} "
        f"{'alone ms':>8} {'wall ms':>8}  wall span"
    ]
    lines += [
        f"  {s.name:24} {s.threads:7d} {_cell(s.cpu_ms, 9, 3)} {_cell(s.busy_pct, 7, 1)} "
        f"{_cell(s.alone_cpu_ms, 8, 3)} {_cell(s.wall_ms, 8, 3)}  {s.wall_span}"
        for s in report.stages
        if s.threads or s.wall_ms is not None or s.alone_cpu_ms is not None
    ]
    lines.append(f"  slowest stage: {report.slowest} ({report.slowest_basis})")
    lines += list(_totals(report))
    return lines


def _totals(report: StageReport) -> Iterator[str]:
    yield (
        f"  daemon CPU {_cell(report.daemon_cpu_ms, 0, 3)} ms/frame on "
        f"{_cell(report.cores_used, 0, 2)} cores; the same work alone "
        f"{_cell(report.work_cpu_ms, 0, 3)} ms/frame at the mean batch "
        f"{_cell(report.mean_batch_size, 0, 2)}{_runs(report)}; daemon overhead "
        f"{_cell(report.overhead_cpu_ms, 0, 3)} ms/frame"
    )


def _runs(report: StageReport) -> str:
    batch = report.mean_batch_size
    if batch is None or batch == mean_run_rows(batch, report.rows_per_run):
        return ""
    return f" in runs of {_cell(mean_run_rows(batch, report.rows_per_run), 0, 2)} rows"


def _ceiling(ceiling: Ceiling, daemon_fps: float) -> list[str]:
    return [
        f"  ceiling here: {ceiling.fps:.1f} frames/s ({ceiling.limit_ratio:.2f} x limit), the "
        f"limit's work with inference at batch {ceiling.batch_size} on every replica at once "
        f"({ceiling.inference_together_ms:.3f} ms/frame; alone {ceiling.inference_alone_ms:.3f},"
        " the larger counted)",
        f"  and the producer ({ceiling.producer_cpu_ms:.3f} ms/frame) and subscriber "
        f"({ceiling.subscriber_cpu_ms:.3f}) on the same cores; the daemon reached "
        f"{daemon_fps / ceiling.fps:.2f} of it",
    ]


def _at_pace(at_pace: LimitAtPace) -> list[str]:
    best, pace = at_pace.best, at_pace.best.pace
    rounds = ", ".join(
        f"{run.daemon_fps:.0f} / {run.limit_fps:.0f} = {run.ratio:.2f}" for run in at_pace.runs
    )
    return [
        f"  limit at the daemon run's pace: inference alone at batch {pace.batch_size} took "
        f"{pace.before_ms:.3f} ms/frame before the fastest run and {pace.after_ms:.3f} after, "
        f"{best.slowdown:.2f} x the {pace.components_ms:.3f} right after its round's components;",
        f"  its round's limit then: {best.limit_fps:.1f} frames/s; daemon / it by round: {rounds}",
    ]


def _host_cpu(daemon: StageReport, device_side: StageReport) -> str:
    return (
        f"  host CPU per frame outside the model's threads: {DAEMON} (as configured) "
        f"{_cell(daemon.host_cpu_ms, 0, 3)} ms, {DEVICE_SIDE} (normalisation and NMS off "
        f"the host) {_cell(device_side.host_cpu_ms, 0, 3)} ms"
    )


def _profile(profile: Profile, top: int = 10) -> list[str]:
    threads = ", ".join(f"{t.where} {t.share_pct:.0f} %" for t in profile.threads[:6])
    lines = [
        f"  py-spy under full load: the GIL was held {profile.gil_held_pct:.0f} % of "
        f"{profile.seconds:.1f} s; by thread: {threads}",
        "  GIL samples by the deepest line of streamer's code:",
    ]
    lines += [f"    {spot.share_pct:5.1f} %  {spot.where}" for spot in profile.lines[:top]]
    return lines + [f"  stacks: {profile.raw_path}"]


def _targets(targets: list[Target]) -> list[str]:
    lines = [f"  {'target':44} {'input':20} {'value':>9}  goal"]
    for target in targets:
        mark = {True: "met", False: "MISSED", None: "n/a"}[target.met]
        value = _cell(target.value, 9, 3)
        lines.append(f"  {target.name:44} {target.scope:20} {value}  {target.goal:10} {mark}")
    return lines


def _cell(value: float | None, width: int, digits: int) -> str:
    return f"{'-':>{width}}" if value is None else f"{value:{width}.{digits}f}"

"""``streamer bench``: every mode of issue 8 in one invocation, then the report.

The inputs are read and saved once; the in-process model, the ``naive`` receiver and one
daemon per ``max_size`` are started (:class:`~streamer.bench.harness.Harness`); the
``components`` are timed; then every mode runs once per round, ``--rounds`` times, and each
mode's best round is reported; with ``--profile`` a last full-load run per input
is sampled with py-spy. Everything is written under ``--out``: ``report.json``,
``report.png``, the configs the daemons ran, their logs and the receiver's, the profiles.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tqdm import tqdm

from streamer.bench.assemble import Measurements, assemble, settings
from streamer.bench.bench_config import Ports, bench_config
from streamer.bench.components import Components, cpu_cores
from streamer.bench.deferred_signals import signals_deferred
from streamer.bench.frameset import FrameSet
from streamer.bench.harness import PROFILE_FRAMES_FACTOR, DaemonPlan, Harness, Measured
from streamer.bench.inputs import INPUTS
from streamer.bench.modes import DEVICE_SIDE, MANY_SOURCES_FRAMES_FACTOR, daemon_mode
from streamer.bench.plot import INSTALL_HINT, plot_available, write_plot
from streamer.bench.report import BenchReport, format_report, write_json
from streamer.bench.work import check_benchable, replica_sessions
from streamer.config import Config, load_config
from streamer.config_writer import write_config
from streamer.errors import ConfigError

__all__ = [
    "DEFAULT_FRAMES",
    "DEFAULT_ROUNDS",
    "DEFAULT_SETTLE_S",
    "QUICK_FRAMES",
    "BenchOptions",
    "run_bench",
]

DEFAULT_FRAMES = 1000
DEFAULT_ROUNDS = 3
DEFAULT_SETTLE_S = 10.0
QUICK_FRAMES = 32
BATCH_SIZES = (1, 2, 4, 8, 16)
REPORT_FILES = ("report.json", "report.png")
"""What a run writes last into ``--out``; an earlier run's are removed when a run starts."""

Echo = Callable[[str], None]
Progress = Callable[[str, int], None]


@dataclass(frozen=True)
class BenchOptions:
    """How to run the benchmark.

    Attributes:
        config_path: the base config (``configs/default.toml``).
        frames: frames per run, mode and input.
        rounds: times every mode runs; the best run of each is reported.
        backend: ``onnxruntime`` or ``acl-sim``.
        max_sizes: batch ``max_size`` values for the daemon, the first one (the primary)
            with every run (a value given twice counts once); empty for the config's.
        out_dir: where the report and the run's files go.
        profile: also sample the daemon with py-spy under full load.
        settle_s: before each run, wait up to this long for other processes to quiet down.
    """

    config_path: Path
    frames: int = DEFAULT_FRAMES
    rounds: int = DEFAULT_ROUNDS
    backend: str = "onnxruntime"
    max_sizes: tuple[int, ...] = ()
    out_dir: Path = Path("results/bench")
    profile: bool = False
    settle_s: float = DEFAULT_SETTLE_S


@dataclass(frozen=True)
class _Plan:
    """What the options resolve to: the base config, the daemons and their configs."""

    base: Config
    batch_sizes: tuple[int, ...]
    daemons: list[DaemonPlan]
    primary_config: Config

    @property
    def max_sizes(self) -> tuple[int, ...]:
        return tuple(d.max_size for d in self.daemons if d.mode != DEVICE_SIDE)


def run_bench(options: BenchOptions, echo: Echo = print) -> BenchReport:
    """Run every mode, write ``report.json`` (and ``report.png``), print the tables.

    Raises:
        ConfigError, ModelError, AssetError: the config, model or media cannot be used, or
            ``out_dir`` cannot be made or written to.
        StreamerError: a subprocess (daemon, receiver, producer, py-spy) failed, or its log
            could not be written.
        OSError: the frame files or the report could not be written (a full disk).
    """
    plan = _plan(options)
    if not plot_available():
        echo(f"matplotlib is not installed, so no plot will be drawn: {INSTALL_HINT}")
    sessions = replica_sessions(plan.primary_config)
    total = _total_frames(options, len(plan.daemons), max(plan.batch_sizes), sessions)
    try:
        frames = _save_inputs(options)
        with tqdm(total=total, unit="frame", dynamic_ncols=True) as bar:
            components, rounds, profiled = _measure(options, plan, frames, _progress(bar))
    finally:
        with signals_deferred():
            for bench_input in INPUTS:
                _frames_path(options, bench_input.name).unlink(missing_ok=True)
    measurements = _measurements(options, plan, frames, components, rounds, profiled)
    report = assemble(measurements)
    write_json(report, options.out_dir / REPORT_FILES[0])
    if "plot" in report.files:
        write_plot(report, Path(report.files["plot"]))
    echo(format_report(report))
    return report


def _plan(options: BenchOptions) -> _Plan:
    base = load_config(options.config_path)
    check_benchable(base)
    max_sizes = tuple(dict.fromkeys(options.max_sizes)) or (base.models[0].batch.max_size,)
    batch_sizes = tuple(sorted({*BATCH_SIZES, *max_sizes}))
    with _writing_out(options):
        options.out_dir.mkdir(parents=True, exist_ok=True)  # once the config is known to suit
        for earlier in REPORT_FILES:  # a run that fails leaves no report to be taken for its own
            (options.out_dir / earlier).unlink(missing_ok=True)
    configs = [
        _daemon_config(base, options, m, daemon_mode(m, max_sizes[0]), batch_sizes)
        for m in max_sizes
    ]
    configs.append(_daemon_config(base, options, max_sizes[0], DEVICE_SIDE, batch_sizes))
    daemons = [daemon for daemon, _ in configs]
    return _Plan(base, batch_sizes, daemons, configs[0][1])


def _daemon_config(
    base: Config, options: BenchOptions, max_size: int, mode: str, batch_sizes: tuple[int, ...]
) -> tuple[DaemonPlan, Config]:
    """The config of the daemon whose full-load runs are ``mode``, written under ``--out``."""
    ports = Ports.free()
    config = bench_config(
        base,
        backend=options.backend,
        max_size=max_size,
        ports=ports,
        models_dir=options.out_dir / "models" / mode,
        batch_sizes=batch_sizes,
        device_side=mode == DEVICE_SIDE,
    )
    path = options.out_dir / f"config-{mode}.toml"
    with _writing_out(options):
        written = write_config(config, path)
    return DaemonPlan(path, ports, max_size, mode), written


@contextlib.contextmanager
def _writing_out(options: BenchOptions) -> Iterator[None]:
    """An OSError of the body (``--out`` cannot be made or written to) as a ConfigError."""
    try:
        yield
    except OSError as exc:
        raise ConfigError(f"--out {options.out_dir}: {exc.strerror or exc}") from exc


def _save_inputs(options: BenchOptions) -> dict[str, tuple[FrameSet, Path]]:
    """Each input's frames, read once and saved for the producer processes (the files are
    removed at the end)."""
    frames = {}
    for bench_input in INPUTS:
        frame_set = bench_input.load(options.frames)
        path = _frames_path(options, bench_input.name)
        frame_set.save(path)
        frames[bench_input.name] = (frame_set, path)
    return frames


def _frames_path(options: BenchOptions, input_name: str) -> Path:
    return options.out_dir / f"frames-{input_name}.pickle"


def _measure(
    options: BenchOptions,
    plan: _Plan,
    frames: dict[str, tuple[FrameSet, Path]],
    progress: Progress,
) -> tuple[dict[str, Components], list[dict[str, dict[str, Measured]]], dict[str, Measured]]:
    """(components, rounds, profiled runs), everything under test started once.

    The components are measured again at the start of every round, and each step keeps its
    cheapest round, as each mode keeps its best: a limit from one measurement taken while
    the machine was slow would flatter every ratio to it.
    """
    harness = Harness(
        plan.primary_config,
        plan.daemons,
        frames,
        options.frames,
        options.out_dir,
        progress,
        options.settle_s,
    )
    cheapest: dict[str, Components] = {}
    rounds = []
    try:
        for _ in range(options.rounds):
            components = {
                name: _components(harness, name, plan.batch_sizes, progress) for name in frames
            }
            rounds.append(harness.run_round(components))
            cheapest = {
                name: cheapest[name].cheapest(measured) if name in cheapest else measured
                for name, measured in components.items()
            }
        profiled = harness.profile(cheapest, options.out_dir) if options.profile else {}
    finally:
        harness.close()
    return cheapest, rounds, profiled


def _components(
    harness: Harness, name: str, batch_sizes: tuple[int, ...], progress: Progress
) -> Components:
    def done(frames_done: int) -> None:
        progress(f"{name}: components", frames_done)

    harness.settle(f"{name}: components")
    return harness.measure_components(name, batch_sizes, done)


def _measurements(
    options: BenchOptions,
    plan: _Plan,
    frames: dict[str, tuple[FrameSet, Path]],
    components: dict[str, Components],
    rounds: list[dict[str, dict[str, Measured]]],
    profiled: dict[str, Measured],
) -> Measurements:
    batch = plan.base.models[0].batch
    given = {
        "config": str(options.config_path),
        "backend": options.backend,
        "frames": options.frames,
        "rounds": options.rounds,
        "settle_s": options.settle_s,
        "max_sizes": list(plan.max_sizes),
        "batch_sizes": list(plan.batch_sizes),
        "cores": cpu_cores(),
        "daemon_cpu_scheduling_policy": plan.primary_config.daemon.cpu_scheduling_policy,
    }
    return Measurements(
        settings=settings(**given),
        frames={name: frame_set for name, (frame_set, _) in frames.items()},
        components=components,
        rounds=rounds,
        profiled=profiled,
        max_sizes=plan.max_sizes,
        configured_max_size=batch.max_size,
        max_delay_ms=batch.max_delay_ms,
        cores=cpu_cores(),
        files=_files(options, plan),
    )


def _total_frames(options: BenchOptions, daemons: int, chunk: int, sessions: int) -> int:
    """Frames the progress bar counts: every run of every input (the components' frames
    once alone, and once per replica session together)."""
    components = math.ceil(options.frames / chunk) * chunk * (1 + sessions)
    # serial, naive, a full load per daemon, 50 %, and the longer run of 16 sources
    runs_per_round = 2 + daemons + 1 + MANY_SOURCES_FRAMES_FACTOR
    runs = options.rounds * runs_per_round + options.profile * PROFILE_FRAMES_FACTOR
    return len(INPUTS) * (options.rounds * components + runs * options.frames)


def _progress(bar: tqdm[Any]) -> Progress:
    def report(what: str, frames: int) -> None:
        bar.set_description(what, refresh=False)
        bar.update(frames)

    return report


def _files(options: BenchOptions, plan: _Plan) -> dict[str, str]:
    out = options.out_dir
    files = {"json": str(out / REPORT_FILES[0])}
    if plot_available():
        files["plot"] = str(out / REPORT_FILES[1])
    files["configs"] = ", ".join(str(d.path) for d in plan.daemons)
    return files

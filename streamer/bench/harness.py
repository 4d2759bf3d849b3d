"""Everything under test, started once and kept running while the modes take turns.

:class:`Harness` holds the in-process :class:`FrameWork`, the ``naive`` receiver and one
daemon per ``max_size``. :meth:`Harness.run_round` runs every mode once on every input, in
turn, so that a burst of load from other processes on a shared machine hits one round of
one mode rather than a whole mode; each run records the CPU other processes used meanwhile
(:mod:`.machine`), and the report keeps each mode's best round.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from streamer.bench.bench_config import Ports, free_port
from streamer.bench.child import Stoppable, stop_all
from streamer.bench.components import Components, measure_components
from streamer.bench.daemon_run import DaemonDetail, DaemonUnderTest, Load
from streamer.bench.deferred_signals import signals_deferred
from streamer.bench.frameset import FrameSet
from streamer.bench.machine import CpuSnapshot, others_cores, wait_until_quiet
from streamer.bench.modes import (
    DAEMON,
    HALF_RATE,
    MANY_SOURCES,
    MANY_SOURCES_FRAMES_FACTOR,
    MANY_SOURCES_MODE,
    NAIVE,
    PROFILED,
    SERIAL,
)
from streamer.bench.naive import NaiveReceiver, run_naive_sender
from streamer.bench.pace import Pace, time_pace
from streamer.bench.serial import run_serial
from streamer.bench.stats import RunResult
from streamer.bench.work import FrameWork
from streamer.config import Config

__all__ = ["PROFILE_FRAMES_FACTOR", "DaemonPlan", "Harness", "Measured"]

_NAIVE_WARMUP = 16
PROFILE_FRAMES_FACTOR = 3
"""A profiled run sends this many times the frames of the others (more samples)."""

Progress = Callable[[str, int], None]
"""Told ``(what is running, frames just done)``."""


@dataclass(frozen=True)
class Measured:
    """One run of one mode: its result; for the daemon its details, and for the primary
    daemon's full-load run the pace of the machine around it (:mod:`.pace`)."""

    result: RunResult
    detail: DaemonDetail | None = None
    pace: Pace | None = None


@dataclass(frozen=True)
class DaemonPlan:
    """A daemon to start: its config file, ports, batch ``max_size``, and the mode its
    full-load runs are reported as (:mod:`.modes`)."""

    path: Path
    ports: Ports
    max_size: int
    mode: str


class Harness:
    """The in-process steps, the naive receiver and the daemons; close it on every path.

    Args:
        config: the primary config (the in-process modes use it).
        daemons: one per ``max_size``, the primary first, then the device-side one.
        frames: input name → (frames, the file they are saved in).
        count: frames per run.
        out_dir: where logs go.
        progress: told what runs and how many frames each run did.
        settle_s: before each run, wait up to this long for other processes to quiet down.

    Raises:
        StreamerError, ConfigError, ModelError: something did not start; what did is stopped.
    """

    def __init__(
        self,
        config: Config,
        daemons: list[DaemonPlan],
        frames: dict[str, tuple[FrameSet, Path]],
        count: int,
        out_dir: Path,
        progress: Progress,
        settle_s: float = 0.0,
    ) -> None:
        self.frames, self._count, self._progress = frames, count, progress
        self._settle_s = settle_s
        self._best_fps: dict[str, float] = {}
        self._components_pace: dict[str, float] = {}  # input → ms, the round's (see .pace)
        self._modes = [plan.mode for plan in daemons]
        self.daemons: list[DaemonUnderTest] = []
        self.work = FrameWork(config)
        self._endpoint = f"tcp://127.0.0.1:{free_port()}"
        self.receiver: NaiveReceiver | None = None
        try:
            self._start(daemons[0].path, daemons, out_dir)
        except BaseException:
            self.close()
            raise

    def _start(self, config_path: Path, daemons: list[DaemonPlan], out_dir: Path) -> None:
        self._progress("starting the naive receiver", 0)
        self.receiver = NaiveReceiver(config_path, self._endpoint, out_dir / "naive.log")
        for plan in daemons:
            self._progress(f"starting the daemon, {plan.mode}", 0)
            log = out_dir / f"{plan.mode}.log"
            rows = self.work.rows_per_run or 0  # the daemons load the model as work did
            self.daemons.append(DaemonUnderTest(plan.path, plan.ports, plan.max_size, log, rows))
        for daemon in self.daemons:
            for frames, _ in self.frames.values():
                daemon.warm_up(frames)

    def close(self) -> None:
        """Stop the daemons and the receiver, every one even when a stop fails, with Ctrl-C
        and SIGTERM deferred until they are stopped (:func:`stop_all`); release the model;
        idempotent.

        Raises:
            StreamerError: a child's log could not be written (all are stopped).
        """
        with signals_deferred():  # from the moment the children leave these lists
            children: list[Stoppable] = [*self.daemons, *self._receivers()]
            self.daemons, self.receiver = [], None
            try:
                stop_all(children)
            finally:
                self.work.close()

    def run_round(self, components: dict[str, Components]) -> dict[str, dict[str, Measured]]:
        """Every mode once on every input: input name → mode → its run.

        The 50 % run is paced at half the best full-load rate of the rounds so far.
        """
        return {name: self._input_round(name, components[name]) for name in self.frames}

    def _input_round(self, name: str, components: Components) -> dict[str, Measured]:
        frames, path = self.frames[name]
        runs = {
            SERIAL: self._measured(
                SERIAL, name, [], lambda: run_serial(self.work, frames, self._count)
            ),
            NAIVE: self._measured(NAIVE, name, self._receiver_pids(), self._naive(path)),
        }
        for daemon, mode in zip(self.daemons, self._modes, strict=True):
            load = Load(mode, 1, self._count)
            runs[mode] = self._daemon_run(daemon, load, name, components, paced=mode == DAEMON)
        primary = self.daemons[0]
        best = self._best_fps[name] = max(self._best_fps.get(name, 0.0), runs[DAEMON].result.fps)
        half = Load(HALF_RATE, 1, self._count, round(best / 2, 1))
        many = Load(MANY_SOURCES_MODE, MANY_SOURCES, self._count * MANY_SOURCES_FRAMES_FACTOR)
        for load in (half, many):
            runs[load.mode] = self._daemon_run(primary, load, name, components)
        return runs

    def profile(self, components: dict[str, Components], out_dir: Path) -> dict[str, Measured]:
        """A full-load run of the primary daemon on each input under py-spy.

        Raises:
            StreamerError: py-spy is missing or failed.
        """
        load = Load(PROFILED, 1, self._count * PROFILE_FRAMES_FACTOR)
        return {
            name: self._daemon_run(
                self.daemons[0], load, name, components[name], out_dir / f"profile-{name}.txt"
            )
            for name in self.frames
        }

    def _daemon_run(
        self,
        daemon: DaemonUnderTest,
        load: Load,
        name: str,
        components: Components,
        profile_path: Path | None = None,
        paced: bool = False,
    ) -> Measured:
        """One daemon run; ``paced``: with inference alone timed just before and after it,
        as right after the round's ``components`` (:meth:`measure_components`, :mod:`.pace`)."""
        frames, path = self.frames[name]
        self.settle(f"{name}: {load.mode}")
        size = components.best_batch_size()
        batch = self._model_inputs(name, size) if paced else None
        pace_before = time_pace(self.work, batch) if batch is not None else 0.0
        before = CpuSnapshot.take([daemon.pid])
        result, detail = daemon.run(load, frames, path, components, profile_path)
        after = CpuSnapshot.take([daemon.pid])
        pace = None
        if batch is not None:
            pace_after = time_pace(self.work, batch)
            pace = Pace(
                size,
                self._components_pace[name],
                pace_before,
                pace_after,
                limit_cpu_ms=components.cpu_ms_per_frame(size),
                inference_ms=components.inference[size].cpu_ms,
            )
        self._progress(f"{name}: {load.mode}", load.count)
        result = replace(result, others_cores=others_cores(before, after))
        return Measured(result, detail, pace)

    def _model_inputs(self, name: str, batch_size: int) -> np.ndarray:
        """A batch of ``batch_size`` of the input's frames, decoded and preprocessed."""
        frames, _ = self.frames[name]
        images = [self.work.decode(*frames.decode_args(i)) for i in range(batch_size)]
        return np.stack([self.work.preprocess(image)[0] for image in images])

    def measure_components(
        self, name: str, batch_sizes: Sequence[int], on_progress: Callable[[int], None]
    ) -> Components:
        """The steps alone on ``name``'s frames (:func:`measure_components`), then inference
        alone at their cheapest batch size timed as around the round's daemon run
        (:func:`time_pace`), which that run's pace is compared with."""
        frames, _ = self.frames[name]
        components = measure_components(self.work, frames, self._count, batch_sizes, on_progress)
        batch = self._model_inputs(name, components.best_batch_size())
        self._components_pace[name] = time_pace(self.work, batch)
        return components

    def settle(self, what: str) -> None:
        """Announce ``what`` runs next, once the machine is quiet (or ``settle_s`` passed)."""
        self._progress(f"{what} (waiting for a quiet machine)", 0)
        wait_until_quiet(self._settle_s, self._live_pids())
        self._progress(what, 0)

    def _live_pids(self) -> list[int]:
        return [d.pid for d in self.daemons] + self._receiver_pids()

    def _naive(self, path: Path) -> Callable[[], RunResult]:
        return lambda: run_naive_sender(self._endpoint, path, self._count, _NAIVE_WARMUP)

    def _receivers(self) -> list[NaiveReceiver]:
        return [self.receiver] if self.receiver is not None else []

    def _receiver_pids(self) -> list[int]:
        return [receiver.pid for receiver in self._receivers()]

    def _measured(
        self, mode: str, name: str, live_pids: Iterable[int], run: Callable[[], RunResult]
    ) -> Measured:
        self.settle(f"{name}: {mode}")
        before = CpuSnapshot.take(live_pids)
        result = run()
        after = CpuSnapshot.take(live_pids)
        self._progress(f"{name}: {mode}", self._count)
        return Measured(replace(result, others_cores=others_cores(before, after)))

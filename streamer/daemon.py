"""Daemon lifecycle: start, the control loop, reload, drain, release.

Start order: the HTTP server (so probes answer while the models load), the models, the
pipeline's threads and sockets, then ``READY=1`` to systemd and the ``ready`` log line. The
models load on a :class:`~streamer.background_call.BackgroundCall` thread, so that a stop
is acted on while a load blocks (a model file on a hung mount): the load gets
``daemon.drain_timeout_s`` to end, then is abandoned (``load_abandoned``).

The control loop runs on the main thread, one tick every 0.2 s at most (a quarter of the
watchdog timeout when that is shorter). Each tick checks the pipeline for a failure, reads
its outcome counts to tell progress from a stall
(:class:`~streamer.observability.progress.ProgressMonitor`), does the pipeline's
housekeeping, sends ``WATCHDOG=1`` when a ping is due and the pipeline is not stalled, and
``STATUS=`` every ``daemon.status_interval_s``. SIGHUP asks for a reload (``RELOADING=1``
… ``READY=1``): the config file is read again on a thread of its own
(:class:`~streamer.config_read.ConfigRead`, given up after ``daemon.reload_timeout_s``) and
handed to :meth:`Pipeline.reload` on another (:class:`~streamer.pipeline_reload.
PipelineReload`), so neither a read that blocks nor the new models' loading nor the old
chain's drain holds up the ticks or a stop; a config that does not load is rejected and the
running one kept. One reload runs at a time: a SIGHUP meanwhile is logged as deferred
(``reload_deferred``) and acted on after it, however many came. A model load has no bound (it
cannot be cancelled): while a reload runs, ``reload_in_progress`` says so every
``reload_timeout_s``, ``STATUS=`` and ``streamer_reload_in_progress_seconds`` tell how long
(:mod:`streamer.reload_progress`). ``READY=1`` ends every reload, whatever its outcome, once
it has ended: ``streamer_config_last_reload_successful`` in ``/metrics`` (1 at start and
after a reload whose whole file is in force, else 0) and the log tell. SIGINT and SIGTERM
end the loop, and so does a pipeline failure, during a reload too: ``STOPPING=1``,
``/readyz`` fails, the pipeline drains for at most
``daemon.drain_timeout_s`` (a reload under way gets the same time to end, its old chain's
drain cut short; one whose load has not returned by then is abandoned, ``reload_abandoned``)
and the last log line, ``stopped``, gives the counts.

Exit codes: 0 after a clean stop (SIGINT/SIGTERM), 1 when an unrecoverable error stopped the
daemon (a backend failure, a thread that died, an address in use), 2 for a bad configuration
or model at start.
"""

from __future__ import annotations

import os
import queue
import signal
import sys
import threading
import time
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from types import FrameType
from typing import NoReturn

import structlog

from streamer.background_call import BackgroundCall
from streamer.config import Config, DaemonConfig
from streamer.config_read import ConfigRead
from streamer.errors import (
    EXIT_FATAL,
    EXIT_OK,
    EXIT_USAGE,
    ConfigError,
    ModelError,
    StreamerError,
)
from streamer.lifecycle import Status
from streamer.log_budget import LogBudget, take_unreported
from streamer.observability.health import HealthServer, HealthState
from streamer.observability.log_writer import EXIT_FLUSH_S, LOG_WRITER
from streamer.observability.metrics import PipelineMetrics
from streamer.observability.progress import ProgressMonitor, status_line
from streamer.observability.systemd import Notifier
from streamer.pipeline import Pipeline
from streamer.pipeline_reload import PipelineReload
from streamer.release import abandoned, close_logged
from streamer.reload_progress import ReloadProgress
from streamer.signals import DAEMON_SIGNALS, SignalFlag, release_daemon_signals

__all__ = ["EXIT_FATAL", "EXIT_OK", "EXIT_USAGE", "exit_daemon", "run_daemon"]

_TICK_S = 0.2
FAILED_DRAIN_S = 1.0
"""Longest drain (s) after the pipeline failed (a stage lost every replica, a thread died):
what is left mostly cannot finish, and the restart should come soon."""
MAX_BLOCKED_READS = 3
"""Reads of the config file given up on and still blocked (threads stuck in the kernel) at
most: beyond, a SIGHUP is rejected at once instead of leaving one more thread stuck."""
_HTTP_START_TIMEOUT_S = 5.0
_log = structlog.get_logger(__name__)


@dataclass
class _Requests:
    """What signal handlers ask of the control loop, and the signals they received."""

    stop: threading.Event | SignalFlag
    reload: SignalFlag = field(default_factory=SignalFlag)
    received: queue.SimpleQueue[int] = field(default_factory=queue.SimpleQueue)
    lines: LogBudget = field(default_factory=lambda: LogBudget("signal_received"))

    def log_received(self) -> None:
        """Log each signal received since the last call (``signal_received``; a burst of
        thousands is budgeted like the other lines a peer can multiply)."""
        while True:
            try:
                signum = self.received.get_nowait()
            except queue.Empty:
                return
            if (suppressed := self.lines.take()) is not None:
                name = signal.Signals(signum).name
                _log.info("signal_received", signal=name, suppressed=suppressed)


def _install_signal_handlers(requests: _Requests) -> None:
    # A handler runs between two bytecodes of the main thread, possibly while it holds a
    # lock, so handlers take none: they record (SimpleQueue.put is reentrant) and set
    # SignalFlags; the control loop logs. Logging here deadlocked a SIGHUP that came during a
    # log line, and threading.Event.set ended a burst of SIGHUPs in RecursionError.
    def stop(signum: int, _frame: FrameType | None) -> None:
        requests.received.put(signum)
        requests.stop.set()

    def reload(signum: int, _frame: FrameType | None) -> None:
        requests.received.put(signum)
        requests.reload.set()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    signal.signal(signal.SIGHUP, reload)
    release_daemon_signals()  # those that came while `streamer run` started are handled now


def exit_daemon(code: int) -> NoReturn:
    """End the process with the daemon's exit ``code``.

    A thread stuck in native code (a model execution on a hung device, which the drain gave
    up on) would keep the interpreter waiting at exit without end, until systemd kills it,
    and work abandoned in native code (:func:`~streamer.release.abandon`) would abort the
    process if it returned while the interpreter finalises: then, with the final log line
    written and everything else released, the process ends at once (``os._exit``) with
    exit code 1, logged as ``exit_forced``.
    """
    for signum in DAEMON_SIGNALS:  # the handlers go as the interpreter ends: a late SIGHUP
        signal.signal(signum, signal.SIG_IGN)  # would end it with "Hangup" instead of ``code``
    main = threading.main_thread()
    stuck = [
        f"{t.name}/{t.native_id}" for t in threading.enumerate() if t is not main and not t.daemon
    ]
    left = abandoned()
    if not stuck and not left:
        sys.exit(code)
    code = code or EXIT_FATAL
    _log.error("exit_forced", threads=stuck, abandoned=left, code=code)
    LOG_WRITER.flush(EXIT_FLUSH_S)  # os._exit runs no atexit handler
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def run_daemon(
    config: Config, config_path: Path, stop: threading.Event | SignalFlag | None = None
) -> int:
    """Run the daemon until ``stop`` is set (by SIGINT/SIGTERM in the main thread).

    Args:
        config: the validated configuration, read from ``config_path``.
        config_path: the config file, read again on SIGHUP.
        stop: an event that ends the daemon; signal handlers (SIGINT, SIGTERM, SIGHUP) are
            installed only when this is None (they need the main thread), so tests can run
            the daemon in a thread.

    Returns:
        The process exit code (see the module docstring).
    """
    requests = _Requests(stop or SignalFlag())
    if stop is None:
        _install_signal_handlers(requests)
    health, metrics = HealthState(), PipelineMetrics()
    metrics.observe_config(in_force=True, wall_s=time.time())
    try:
        server = _start_http(config.daemon, health, metrics)
    except StreamerError as exc:
        _log.error("start_failed", error=str(exc), config=str(config_path))
        return EXIT_FATAL
    try:
        return _load_and_serve(config, config_path, requests, health, metrics)
    finally:
        if server is not None:
            server.stop()


def _start_http(
    daemon: DaemonConfig, health: HealthState, metrics: PipelineMetrics
) -> HealthServer | None:
    """Start the HTTP server, or nothing when ``http_address`` is empty.

    Raises:
        StreamerError: the address could not be bound.
    """
    endpoint = daemon.http_endpoint
    if endpoint is None:
        return None
    server = HealthServer(*endpoint, health, metrics.registry)
    server.launch(_HTTP_START_TIMEOUT_S)
    return server


def _load_and_serve(
    config: Config,
    config_path: Path,
    requests: _Requests,
    health: HealthState,
    metrics: PipelineMetrics,
) -> int:
    load = BackgroundCall(partial(Pipeline.load, config, metrics), "model-load")
    while not load.wait(_TICK_S):
        if requests.stop.is_set():
            return _stop_during_load(load, config, config_path, requests)
    pipeline = _loaded(load, config_path)
    if isinstance(pipeline, int):
        return pipeline
    metrics.watch(pipeline.sample)
    control = _Control(pipeline, config_path, requests, health, metrics)
    try:
        code = control.serve()
    finally:
        control.close()
        released = close_logged(pipeline.close, "pipeline")
    return code if released else EXIT_FATAL


def _loaded(load: BackgroundCall[Pipeline], config_path: Path) -> Pipeline | int:
    """The pipeline ``load`` (ended) made, or the exit code of its failure, logged as
    ``start_failed``: 2 for a config or model the daemon cannot use, 1 for the backend."""
    try:
        return load.result()
    except (ConfigError, ModelError) as exc:
        _log.error("start_failed", error=str(exc), config=str(config_path))
        return EXIT_USAGE
    except StreamerError as exc:
        _log.error("start_failed", error=str(exc), config=str(config_path))
        return EXIT_FATAL


def _stop_during_load(
    load: BackgroundCall[Pipeline], config: Config, config_path: Path, requests: _Requests
) -> int:
    """A stop came while the models loaded: the load gets ``daemon.drain_timeout_s`` to end,
    and what it loaded is released. One still loading then (a model file on a hung mount) is
    abandoned, as a reload's is (``load_abandoned``): its daemon thread does not hold up the
    exit. Returns the exit code; the last line is ``stopped``."""
    requests.log_received()
    why = "a stop came while the models loaded"
    if not load.wait(config.daemon.drain_timeout_s):
        running_s = round(time.monotonic() - load.started_s, 1)
        _log.warning("load_abandoned", reason=why, running_s=running_s)
        _log.info("stopped", reason=why, config=str(config_path))
        return EXIT_OK
    pipeline = _loaded(load, config_path)
    if isinstance(pipeline, int):
        return pipeline
    released = close_logged(pipeline.close, "pipeline")
    _log.info("stopped", reason=why, config=str(config_path))
    return EXIT_OK if released else EXIT_FATAL


class _Control:
    """The control loop and the notifications it sends; main thread only."""

    def __init__(
        self,
        pipeline: Pipeline,
        config_path: Path,
        requests: _Requests,
        health: HealthState,
        metrics: PipelineMetrics,
    ) -> None:
        daemon = pipeline.config.daemon
        self._pipeline = pipeline
        self._config_path = config_path
        self._requests = requests
        self._health = health
        self._metrics = metrics
        self._notifier = Notifier()
        self._progress = ProgressMonitor(daemon.stall_timeout_s, time.monotonic())
        self._ping_s = self._notifier.watchdog_interval_s
        self._tick_s = min(_TICK_S, self._ping_s / 2) if self._ping_s else _TICK_S
        self._next_ping_s = 0.0
        self._next_status_s = 0.0  # the first STATUS= at the first tick, right after READY=1
        self._read: ConfigRead | None = None
        self._blocked_reads: list[ConfigRead] = []  # reads given up on, perhaps not ended
        self._reload: PipelineReload | None = None
        self._under_way: ReloadProgress | None = None  # from RELOADING=1 to READY=1
        self._reload_error: str | None = None  # a reload that ended half-way: stop
        self._stopping = threading.Event()  # the loop ended: a reload under way cuts short

    def serve(self) -> int:
        """Start the pipeline, run the control loop, drain; returns the exit code."""
        self._health.set_status(Status.STARTING)
        try:
            self._pipeline.start()
        except StreamerError as exc:
            _log.error("start_failed", error=str(exc), config=str(self._config_path))
            return EXIT_FATAL
        for model in self._pipeline.models:
            gears = list(model.info.batch_gears)
            _log.info("model_loaded", model=model.info.name, batch_gears=gears)
        if not self._requests.stop.is_set():  # a stop held during the start: never ready
            self._health.set_status(Status.RUNNING)
            self._notifier.ready()
            _log.info("ready", systemd=self._notifier.enabled, watchdog_interval_s=self._ping_s)
        failed = self._loop()
        self._stopping.set()
        self._requests.log_received()
        deferred = self._under_way is not None and self._under_way.deferred
        if self._requests.reload.is_set() or self._read is not None or deferred:
            _log.warning("reload_skipped", reason="the daemon is stopping")
        return self._drain(failed)

    def close(self) -> None:
        """Release the notification socket."""
        self._notifier.close()

    def _loop(self) -> bool:
        """Tick until a stop is requested or the pipeline fails; True when it failed."""
        while not self._requests.stop.wait(self._tick_s):
            self._requests.log_received()
            if (error := self._failure()) is not None:
                _log.error("pipeline_failed", error=error)
                self._health.set_failure(error)
                return True
            now_s = time.monotonic()
            self._tick(now_s)
            self._reload_step(now_s)
        return False

    def _failure(self) -> str | None:
        """Why the daemon cannot go on: the pipeline's failure, or a reload that ended
        half-way (the chains' state is then unknown)."""
        if (failure := self._pipeline.failure()) is not None:
            return f"{type(failure).__name__}: {failure}"
        return self._reload_error

    def _tick(self, now_s: float) -> None:
        snapshot = self._pipeline.counts.snapshot()
        self._progress.update(snapshot, now_s)
        stalled_for_s = self._progress.stalled_for_s(now_s)
        self._health.tick(now_s, stalled_for_s)
        self._pipeline.housekeeping()
        if self._ping_s is not None and now_s >= self._next_ping_s and not self._progress.stalled:
            self._notifier.watchdog()
            self._next_ping_s = now_s + self._ping_s
        if now_s >= self._next_status_s:
            rate = self._progress.rate_per_s(snapshot, now_s)
            self._notifier.status(status_line(self._state(now_s), snapshot, rate))
            self._next_status_s = now_s + self._pipeline.config.daemon.status_interval_s

    def _state(self, now_s: float) -> str:
        """The state for ``STATUS=``: ``running`` or ``stalled N s``, and the reload under
        way, e.g. ``running, reload loading for 45 s``."""
        state = self._progress.state(now_s)
        if self._under_way is None:
            return state
        return f"{state}, {self._under_way.describe(now_s)}"

    def _reload_step(self, now_s: float) -> None:
        """Go on with the reload a SIGHUP asked for, one at a time: ``RELOADING=1``, the file
        read on a :class:`ConfigRead` thread and given up after ``reload_timeout_s``, then
        the config read handed to the pipeline on a :class:`PipelineReload` thread, whose
        load has no bound. ``READY=1`` and the ``streamer_config_last_reload_*`` gauges end
        every reload. While it runs, a SIGHUP is deferred until its end and the reload's
        progress reported (:meth:`ReloadProgress.defer`, :meth:`ReloadProgress.report`)."""
        self._advance_reload(now_s)
        if self._under_way is not None:
            if self._requests.reload.is_set():
                self._requests.reload.clear()
                self._under_way.defer(now_s)
            self._under_way.report(now_s)

    def _advance_reload(self, now_s: float) -> None:
        """End the pipeline's reload once its thread has, go on with the file's read, or
        begin the reload a SIGHUP asked for."""
        if self._reload is not None:
            self._reload_ended()
            return
        wait_s = 0.0
        if self._read is None:
            if not self._begin_read(now_s):
                return
            wait_s = self._tick_s  # a read that ends at once ends this tick
        self._read_step(now_s, wait_s)

    def _begin_read(self, now_s: float) -> bool:
        """Begin the reload a SIGHUP asked for, if any, with a read of the file; False when
        none was asked for or it was rejected at once."""
        if not self._requests.reload.is_set():
            return False
        self._requests.reload.clear()
        self._notifier.reloading()
        self._under_way = ReloadProgress(now_s, self._pipeline.config.daemon.reload_timeout_s)
        self._metrics.observe_reload(now_s)
        self._blocked_reads = [r for r in self._blocked_reads if not r.wait(0)]
        if len(self._blocked_reads) >= MAX_BLOCKED_READS:
            self._reject(
                f"{self._config_path}: its last {MAX_BLOCKED_READS} reads are still blocked "
                "(a hung mount?); a reload reads it once one ends, or restart the daemon"
            )
            return False
        self._read = ConfigRead(self._config_path)
        return True

    def _read_step(self, now_s: float, wait_s: float) -> None:
        """Once the read ends (within ``wait_s``), hand its config to the pipeline; after
        ``reload_timeout_s`` without an end, give the read up."""
        assert self._read is not None
        if self._read.wait(wait_s):
            result, self._read = self._read.result(), None
            if isinstance(result, str):
                self._reject(result)
            else:
                assert self._under_way is not None  # it began with the read
                progress = self._under_way
                self._reload = PipelineReload(self._pipeline, result, self._stopping, progress)
        elif now_s - self._read.started_s >= self._pipeline.config.daemon.reload_timeout_s:
            timeout_s = self._pipeline.config.daemon.reload_timeout_s
            self._blocked_reads.append(self._read)
            self._read = None
            self._reject(
                f"{self._config_path}: not read and validated in {timeout_s:g} s (a hung mount?)"
            )

    def _reload_ended(self) -> None:
        """End the pipeline's reload once its thread has (``READY=1``, the gauges)."""
        assert self._reload is not None
        if not self._reload.wait(0):
            return
        result, self._reload = self._reload.result(), None
        self._end_reload(self._reload_outcome(result))

    def _reload_outcome(self, result: bool | Exception) -> bool:
        """Whether the reload's config is in force; one that ended half-way is logged
        (``reload_failed``) and stops the daemon."""
        if isinstance(result, Exception):
            self._reload_error = f"reload: {type(result).__name__}: {result}"
            _log.error("reload_failed", error=self._reload_error)
            return False
        return result

    def _reject(self, error: str) -> None:
        _log.error("reload_rejected", error=error)
        self._end_reload(in_force=False)

    def _end_reload(self, in_force: bool) -> None:
        """The reload has ended: the gauges, ``READY=1``; the SIGHUPs deferred meanwhile ask
        for the next one."""
        deferred = self._forget_reload()
        self._metrics.observe_config(in_force, time.time())
        self._notifier.ready()
        if deferred:
            self._requests.reload.set()

    def _forget_reload(self) -> bool:
        """No reload is under way any more (``streamer_reload_in_progress_seconds`` reads
        0); whether a SIGHUP was deferred during the one that was."""
        deferred = self._under_way is not None and self._under_way.deferred
        self._under_way = None
        self._metrics.observe_reload(None)
        return deferred

    def _finish_reload(self, deadline_s: float) -> None:
        """At a stop, wait for a reload under way until ``deadline_s`` (``time.monotonic()``
        s): a chain it loads meanwhile is released before the backend closes. One still
        running then (a load that does not return) is abandoned, ``reload_abandoned``: its
        daemon thread does not hold up the exit. No ``READY=1``: the daemon is stopping."""
        if self._reload is not None:
            if self._reload.wait(max(0.0, deadline_s - time.monotonic())):
                self._reload_outcome(self._reload.result())
            else:
                self._abandon_reload()
            self._reload = None
        self._forget_reload()  # a deferred SIGHUP was reported skipped as the loop ended

    def _abandon_reload(self) -> None:
        """``reload_abandoned``: how long the reload ran (``running_s``) and its ``stage``."""
        under_way, now_s = self._under_way, time.monotonic()
        _log.warning(
            "reload_abandoned",
            reason="its models have not loaded",
            running_s=None if under_way is None else round(under_way.running_s(now_s), 1),
            stage=None if under_way is None else under_way.stage.value,
        )

    def _drain(self, failed: bool) -> int:
        """STOPPING=1, drain, the final ``stopped`` line; returns the exit code."""
        self._health.set_status(Status.STOPPING)
        self._notifier.stopping()
        timeout_s = self._pipeline.config.daemon.drain_timeout_s
        if failed:  # a stage with no replica left runs nothing more: do not wait it out
            timeout_s = min(timeout_s, FAILED_DRAIN_S)
        _log.info("draining", drain_timeout_s=timeout_s)
        deadline_s = time.monotonic() + timeout_s
        drained = self._pipeline.stop(timeout_s)  # after a reload's swap under way, if any
        self._finish_reload(deadline_s)
        if not failed and (error := self._failure()) is not None:
            # Every replica of a stage failed while the daemon stopped: still a failure.
            _log.error("pipeline_failed", error=error)
            failed = True
        # Models and devices are released before the last line; a failed release exits 1.
        released = close_logged(self._pipeline.close, "pipeline")
        self._requests.log_received()  # signals that came during the drain
        self._health.set_status(Status.STOPPED)
        counts = self._pipeline.counts.snapshot()
        self._notifier.status(status_line("stopped", counts, 0.0))
        streams = self._pipeline.stream_stats()
        suppressed = take_unreported()  # lines the budgets left out since their last line
        _log.info(
            "stopped",
            drained=drained,
            **counts.as_log_fields(),
            **streams,
            **({"suppressed_lines": suppressed} if suppressed else {}),
        )
        return EXIT_FATAL if failed or not released else EXIT_OK

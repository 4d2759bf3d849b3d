"""Daemon lifecycle: load, start, wait for a signal or a fatal error, drain, release.

Exit codes: 0 after a clean stop (SIGINT/SIGTERM), 1 when an unrecoverable error stopped the
daemon (a backend failure, a thread that died), 2 for a bad configuration or model at start.
"""

from __future__ import annotations

import signal
import threading
from types import FrameType

import structlog

from streamer.config import Config
from streamer.errors import ConfigError, ModelError, StreamerError
from streamer.pipeline import Pipeline

__all__ = ["EXIT_FATAL", "EXIT_OK", "EXIT_USAGE", "run_daemon"]

EXIT_OK = 0
EXIT_FATAL = 1
EXIT_USAGE = 2
_WATCH_INTERVAL_S = 0.2
_log = structlog.get_logger(__name__)


def _install_signal_handlers(stop: threading.Event) -> None:
    def handle(signum: int, _frame: FrameType | None) -> None:
        if stop.is_set():
            return
        _log.info("signal_received", signal=signal.Signals(signum).name)
        stop.set()

    signal.signal(signal.SIGTERM, handle)
    signal.signal(signal.SIGINT, handle)


def run_daemon(config: Config, stop: threading.Event | None = None) -> int:
    """Run the daemon until ``stop`` is set (by SIGINT/SIGTERM in the main thread).

    Args:
        config: the validated configuration.
        stop: an event that ends the daemon; signal handlers are installed only when this is
            None (they need the main thread), so tests can run the daemon in a thread.

    Returns:
        The process exit code (see the module docstring).
    """
    if stop is None:
        stop = threading.Event()
        _install_signal_handlers(stop)
    try:
        pipeline = Pipeline.load(config)
    except (ConfigError, ModelError) as exc:
        _log.error("start_failed", error=str(exc))
        return EXIT_USAGE
    except StreamerError as exc:
        _log.error("start_failed", error=str(exc))
        return EXIT_FATAL
    try:
        return _serve(pipeline, stop)
    finally:
        pipeline.close()


def _serve(pipeline: Pipeline, stop: threading.Event) -> int:
    try:
        pipeline.start()
    except StreamerError as exc:
        _log.error("start_failed", error=str(exc))
        return EXIT_FATAL
    for model in pipeline.models:
        _log.info("model_loaded", model=model.info.name, batch_gears=list(model.info.batch_gears))
    _log.info("ready")
    while not stop.wait(_WATCH_INTERVAL_S):
        if (failure := pipeline.failure()) is not None:
            _log.error("pipeline_failed", error=f"{type(failure).__name__}: {failure}")
            break
    failed = pipeline.failure() is not None
    _log.info("draining", drain_timeout_s=pipeline.config.daemon.drain_timeout_s)
    drained = pipeline.stop(pipeline.config.daemon.drain_timeout_s)
    counts = pipeline.counts.snapshot()
    _log.info("stopped", drained=drained, **counts.as_log_fields())
    return EXIT_FATAL if failed else EXIT_OK

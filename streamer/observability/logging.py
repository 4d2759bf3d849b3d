"""structlog set-up: key=value lines on a terminal, JSON lines otherwise (or when asked).

One event per state change or error, never one per frame at info level (DESIGN.md §7).
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
from typing import Any, Literal

import structlog

__all__ = ["configure_logging", "renders_json"]

LogFormat = Literal["auto", "console", "json"]


def renders_json(fmt: LogFormat) -> bool:
    """Whether log format ``fmt`` writes JSON lines: ``json``, or ``auto`` when stdout is not
    a terminal (a pipe, a file, the journal)."""
    return fmt == "json" or (fmt == "auto" and not sys.stdout.isatty())


def configure_logging(level: str = "info", fmt: LogFormat = "auto") -> None:
    """Configure structlog process-wide; call once at start-up, before any thread starts.

    Args:
        level: ``debug`` | ``info`` | ``warning`` | ``error``.
        fmt: ``console`` (key=value), ``json`` (one JSON object per line), or ``auto``
            (console when stdout is a terminal, JSON otherwise).
    """
    use_json = renders_json(fmt)
    processors: list[structlog.typing.Processor] = [
        structlog.contextvars.merge_contextvars,
        structlog.processors.add_log_level,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
        structlog.processors.StackInfoRenderer(),
    ]
    if use_json:
        processors += [structlog.processors.format_exc_info, structlog.processors.JSONRenderer()]
    else:
        processors.append(structlog.dev.ConsoleRenderer(colors=sys.stdout.isatty()))
    structlog.configure(
        processors=processors,
        wrapper_class=structlog.make_filtering_bound_logger(getattr(logging, level.upper())),
        logger_factory=_StdoutLogger.factory,
        cache_logger_on_first_use=False,
    )


class _StdoutLogger(structlog.PrintLogger):
    """structlog's PrintLogger on ``sys.stdout`` that survives its reader going away.

    A log line that cannot be written (the journal restarted, a pipe's reader exited: EPIPE;
    a full disk) must not raise into the thread that logged it: that stopped a serving daemon
    without a drain, or killed a pipeline thread. On the first such error standard output is
    pointed at ``/dev/null`` (what the line held is dropped), and the daemon goes on without a
    log; ``/metrics`` still tells how it is doing.
    """

    @classmethod
    def factory(cls, *_args: Any) -> _StdoutLogger:
        """structlog's ``logger_factory``: a logger on ``sys.stdout``."""
        return cls(sys.stdout)

    def msg(self, message: str) -> None:
        """Print ``message`` and a newline; dropped if standard output refuses it."""
        try:
            super().msg(message)
        except OSError:
            _discard_stdout()

    log = debug = info = warn = warning = msg
    fatal = failure = err = error = critical = exception = msg


def _discard_stdout() -> None:
    """Point descriptor 1 at ``/dev/null`` and drop what ``sys.stdout`` still buffers, so
    later lines and the flush at exit succeed."""
    null = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(null, 1)
    finally:
        os.close(null)
    with contextlib.suppress(OSError):
        sys.stdout.flush()  # the unwritten rest goes to /dev/null now

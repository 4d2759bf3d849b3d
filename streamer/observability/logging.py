"""structlog set-up: key=value lines on a terminal, JSON lines otherwise (or when asked).

One event per state change or error, never one per frame at info level (DESIGN.md §7).
"""

from __future__ import annotations

import io
import logging
import os
import sys
from typing import Any, Literal

import structlog

from streamer.observability.log_writer import LOG_WRITER

__all__ = ["configure_logging", "renders_json"]

LogFormat = Literal["auto", "console", "json"]


def renders_json(fmt: LogFormat) -> bool:
    """Whether log format ``fmt`` writes JSON lines: ``json``, or ``auto`` when stdout is not
    a terminal (a pipe, a file, the journal)."""
    return fmt == "json" or (fmt == "auto" and not (sys.stdout and sys.stdout.isatty()))


def configure_logging(level: str = "info", fmt: LogFormat = "auto") -> None:
    """Configure structlog process-wide; call once at start-up, before any thread starts.

    Args:
        level: ``debug`` | ``info`` | ``warning`` | ``error``.
        fmt: ``console`` (key=value), ``json`` (one JSON object per line), or ``auto``
            (console when stdout is a terminal, JSON otherwise).
    """
    _usable_stdout()
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
    """structlog's PrintLogger whose lines go to standard output through
    :data:`~streamer.observability.log_writer.LOG_WRITER`: a logging thread never waits for
    the log's reader, and a reader that went away never raises into it."""

    @classmethod
    def factory(cls, *_args: Any) -> _StdoutLogger:
        """structlog's ``logger_factory``."""
        return cls(sys.stdout)

    def msg(self, message: str) -> None:
        """Queue ``message`` as one line."""
        LOG_WRITER.write(message)

    log = debug = info = warn = warning = msg
    fatal = failure = err = error = critical = exception = msg


def _usable_stdout() -> None:
    """Give a process started with standard output closed ``/dev/null`` there (so nothing
    opened later takes descriptor 1), and make any stdout encoding take any text: a source id
    the encoding cannot hold is escaped, not an error in the thread that logs it."""
    if sys.stdout is None:
        null = os.open(os.devnull, os.O_WRONLY)
        if null != 1:
            os.dup2(null, 1)
            os.close(null)
        sys.stdout = open(1, "w", buffering=1, closefd=False)  # noqa: SIM115
    if isinstance(sys.stdout, io.TextIOWrapper):
        sys.stdout.reconfigure(errors="backslashreplace")

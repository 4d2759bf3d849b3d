"""structlog set-up: key=value lines on a terminal, JSON lines otherwise (or when asked).

One event per state change or error, never one per frame at info level (DESIGN.md §7).
"""

from __future__ import annotations

import logging
import sys
from typing import Literal

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
        logger_factory=structlog.PrintLoggerFactory(sys.stdout),
        cache_logger_on_first_use=False,
    )

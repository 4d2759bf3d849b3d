"""Click callbacks that check option values, shared by the ``streamer`` command line and the
client tools (:mod:`streamer.clients.tool_options`); light to import, for a fast ``--help``."""

from __future__ import annotations

import math

import click

__all__ = ["finite"]


def finite(_ctx: click.Context, _param: click.Parameter, value: float | None) -> float | None:
    """A click callback: ``value``, refused when NaN or infinite (click's FloatRange lets
    them through).

    Raises:
        click.BadParameter: ``value`` is NaN or infinite.
    """
    if value is not None and not math.isfinite(value):
        raise click.BadParameter(f"must be a finite number, got {value}")
    return value

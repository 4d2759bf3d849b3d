"""The ``streamer`` command's entry point (also ``python -m streamer``): for ``streamer run``
it holds the daemon's signals before anything else is imported (:mod:`streamer.signals`)."""

from __future__ import annotations

import sys

from streamer.signals import hold_daemon_signals

__all__ = ["main"]


def main() -> None:
    """Run the command line (:func:`streamer.cli.main`)."""
    if sys.argv[1:2] == ["run"]:
        hold_daemon_signals()
    from streamer.cli import main as command_line

    command_line()

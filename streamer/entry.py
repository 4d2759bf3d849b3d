"""The ``streamer`` command's entry point (also ``python -m streamer``): for ``streamer run``
it holds the daemon's signals before anything else is imported (:mod:`streamer.signals`);
for the other commands a Ctrl-C while the command line is still being imported (pydantic,
the config) ends it as click ends an interrupted command, with ``Aborted!`` and exit code 1,
not a traceback from inside an import. The heavy libraries (onnxruntime, OpenCV, ZeroMQ)
are imported by the commands that use them (:mod:`streamer.cli`), under click."""

from __future__ import annotations

import sys

from streamer.signals import hold_daemon_signals

__all__ = ["main"]


def main() -> None:
    """Run the command line (:func:`streamer.cli.main`)."""
    if sys.argv[1:2] == ["run"]:
        hold_daemon_signals()
    try:
        from streamer.cli import main as command_line
    except KeyboardInterrupt:
        sys.stderr.write("Aborted!\n")
        sys.exit(1)
    command_line()

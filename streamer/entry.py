"""The ``streamer`` command's entry point (also ``python -m streamer``): for ``streamer run``
it holds the daemon's signals before anything else is imported (:mod:`streamer.signals`);
for the other commands a Ctrl-C while the command line is still being imported (pydantic,
the config) ends it as click ends an interrupted command, with ``Aborted!`` and exit code 1,
not a traceback from inside an import. The heavy libraries (onnxruntime, OpenCV, ZeroMQ)
are imported by the commands that use them (:mod:`streamer.cli`), under click."""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator

from streamer.signals import hold_daemon_signals

__all__ = ["ctrl_c_aborts", "main"]


@contextlib.contextmanager
def ctrl_c_aborts() -> Iterator[None]:
    """End the process as click ends an interrupted command when a Ctrl-C comes in the body
    (the imports of a command line): ``Aborted!`` on stderr and exit code 1, not a
    traceback from inside an import."""
    try:
        yield
    except KeyboardInterrupt:
        sys.stderr.write("Aborted!\n")
        sys.exit(1)


def main() -> None:
    """Run the command line (:func:`streamer.cli.main`)."""
    if sys.argv[1:2] == ["run"]:
        hold_daemon_signals()
    with ctrl_c_aborts():
        from streamer.cli import main as command_line
    command_line()

"""What native libraries write to the process's standard error, as budgeted log events.

libpng, inside OpenCV's PNG decoder, writes ``libpng error: …`` straight to file descriptor 2
for every corrupt PNG it is given, past Python and past OpenCV's log level. A producer sending
corrupt PNGs at full rate would put one raw line per frame among the daemon's JSON lines, and
once journald's rate limit for the unit is reached (``RateLimitBurst``, 10000 messages per
30 s by default) journald drops the daemon's own messages too.

While the daemon runs, descriptor 2 is therefore a pipe. A thread reads it and logs each line
as a ``native_output`` warning, at most 10 per 10 s (:class:`~streamer.log_budget.LogBudget`,
with ``suppressed`` counts). Python's ``sys.stderr`` and faulthandler's tracebacks on a fatal
signal (when enabled: ``PYTHONFAULTHANDLER=1``, as the systemd units set) keep writing to the
original standard error, so a crash's traceback never waits in the pipe of a process that is
dying.
"""

from __future__ import annotations

import contextlib
import faulthandler
import os
import sys
import threading
from collections.abc import Iterator

import structlog

from streamer.log_budget import LogBudget

__all__ = ["native_output_logged"]

_MAX_LINE_CHARS = 1000
_JOIN_TIMEOUT_S = 2.0
_log = structlog.get_logger(__name__)


@contextlib.contextmanager
def native_output_logged() -> Iterator[None]:
    """Within the block, lines written to descriptor 2 by native code are logged as
    ``native_output`` (budgeted); on leaving it, descriptor 2 is the original standard error
    again and what the pipe still held is logged.

    Main thread only, before the threads that may write (decode workers, model runtimes)
    start. ``sys.stderr`` is rebound to the original standard error meanwhile.

    Raises:
        OSError: the pipe or the duplicate descriptors could not be made (nothing changed,
            except that a descriptor 2 found closed is ``/dev/null`` now).
    """
    if sys.stderr is not None:
        sys.stderr.flush()
    original = _duplicate_stderr()
    try:
        read_fd, write_fd = os.pipe()
    except OSError:
        os.close(original)
        raise
    os.dup2(write_fd, 2)
    os.close(write_fd)
    python_stderr = sys.stderr
    sys.stderr = open(original, "w", buffering=1, closefd=False, errors="backslashreplace")  # noqa: SIM115
    dumps_tracebacks = faulthandler.is_enabled()  # PYTHONFAULTHANDLER=1, as in the units
    if dumps_tracebacks:
        faulthandler.enable(file=sys.stderr)
    reader = threading.Thread(target=_forward, args=(read_fd,), name="native-output", daemon=True)
    reader.start()
    try:
        yield
    finally:
        sys.stderr.flush()
        os.dup2(original, 2)  # the pipe's last write end closes: the reader reads to its end
        reader.join(_JOIN_TIMEOUT_S)
        if dumps_tracebacks and python_stderr is not None:
            faulthandler.enable(file=python_stderr)
        sys.stderr = python_stderr
        os.close(original)


def _duplicate_stderr() -> int:
    """A duplicate of descriptor 2; a process started with it closed gets ``/dev/null`` there
    first, so that no pipe or socket opened later takes descriptor 2 and receives what
    native code writes to standard error."""
    try:
        return os.dup(2)
    except OSError:
        null = os.open(os.devnull, os.O_WRONLY)
        if null != 2:
            os.dup2(null, 2)
            os.close(null)
        return os.dup(2)


def _forward(read_fd: int) -> None:
    """Log each line of the pipe until its write end closes. A line that cannot be logged
    is skipped: the reader must never stop, or native writers would block on a full pipe."""
    budget = LogBudget("native_output")
    with open(read_fd, "rb") as pipe:
        for raw in pipe:
            line = raw.decode(errors="replace").rstrip()
            if not line:
                continue
            suppressed = budget.take()
            if suppressed is None:
                continue
            try:
                _log.warning("native_output", line=line[:_MAX_LINE_CHARS], suppressed=suppressed)
            except Exception:  # noqa: S112 - see the docstring
                continue

"""The thread that writes the log to standard output.

A thread that logs hands its line to :data:`LOG_WRITER` and goes on. A reader that stops
reading standard output (a stalled journal, a paused pager, a stuck ``tee``) fills the pipe,
and a write then blocks: it must block this thread only, never a pipeline thread nor the
control loop that acts on SIGTERM. Up to :data:`QUEUED_LINES_MAX` lines wait; beyond, lines
are dropped and counted (``streamer_log_lines_dropped_total``, and a ``log_lines_dropped``
line where the log resumes). A write that fails because the file it goes to has no room
(a full disk or quota: ENOSPC, EDQUOT; a file-size limit: EFBIG) drops those lines, counted
the same way, and the next lines try again: the log comes back once there is room. Any other
failed write (the reader went away: EPIPE) points descriptor 1 at ``/dev/null``, and the
daemon goes on without a log; ``/metrics`` still tells how it is doing. At exit, the lines
still queued get :data:`EXIT_FLUSH_S` to leave.
"""

from __future__ import annotations

import atexit
import collections
import errno
import os
import select
import sys
import threading

import structlog

__all__ = ["EXIT_FLUSH_S", "LOG_WRITER", "QUEUED_LINES_MAX", "LogWriter"]

QUEUED_LINES_MAX = 10_000
EXIT_FLUSH_S = 2.0
NO_ROOM_ERRORS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EFBIG})
"""Failed writes after which the log tries again: the file may get room later."""
_log = structlog.get_logger(__name__)


class LogWriter:
    """Lines for standard output, written in order by one thread of their own; thread-safe.

    Args:
        capacity: lines waiting at most; more are dropped (:attr:`dropped`).

    Attributes:
        dropped: lines dropped because ``capacity`` lines were waiting or because the file
            had no room for them (:data:`NO_ROOM_ERRORS`).
    """

    def __init__(self, capacity: int = QUEUED_LINES_MAX) -> None:
        self._capacity = capacity
        self._ready = threading.Condition()
        self._lines: collections.deque[str] = collections.deque()
        self._writing = False
        self._thread: threading.Thread | None = None
        self._cut_line = False
        self.dropped = 0

    def write(self, line: str) -> None:
        """Queue ``line`` (without its newline); never blocks on standard output."""
        with self._ready:
            if len(self._lines) >= self._capacity:
                self.dropped += 1
                return
            self._lines.append(line)
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="log-writer", daemon=True)
                self._thread.start()
            self._ready.notify_all()

    def flush(self, timeout_s: float) -> bool:
        """Wait until every queued line is written, at most ``timeout_s``; whether they were."""
        with self._ready:
            return self._ready.wait_for(lambda: not self._lines and not self._writing, timeout_s)

    def _run(self) -> None:
        reported = 0
        while True:
            with self._ready:
                self._ready.wait_for(lambda: bool(self._lines))
                text = "".join(line + "\n" for line in self._lines)
                self._lines.clear()
                self._writing = True
                dropped = self.dropped
            try:
                lost = self._write(text)
            finally:
                with self._ready:
                    self._writing = False
                    self.dropped += lost
                    self._ready.notify_all()
            if not lost and dropped > reported:  # where the gap is, once the log writes again
                _log.warning("log_lines_dropped", dropped=dropped - reported, total=dropped)
                reported = dropped

    def _write(self, text: str) -> int:
        """Write ``text`` (whole lines) with :func:`_write`; the lines lost because the file
        had no room. A line cut short by such a failure is ended before the next text."""
        ending = b"\n" if self._cut_line else b""
        data = ending + _encoded(text)
        written = _write(data)
        if written == len(data):
            self._cut_line = False
            return 0
        if written:
            self._cut_line = data[written - 1 : written] != b"\n"
        return data.count(b"\n", max(written, len(ending)))

    def _forget_in_child(self) -> None:
        """After a fork: the child has no writer thread; it starts its own at its first
        line, without the parent's queue."""
        self._ready = threading.Condition()
        self._lines.clear()
        self._writing = False
        self._cut_line = False
        self._thread = None


def _encoded(text: str) -> bytes:
    """``text`` in standard output's encoding, what it cannot hold escaped."""
    encoding = getattr(sys.stdout, "encoding", None) or "utf-8"
    return text.encode(encoding, errors="backslashreplace")


def _write(data: bytes) -> int:
    """Write ``data`` to descriptor 1, waiting while it is full, also when it is non-blocking
    (a supervisor may hand one over); the bytes written: all of them, or fewer after a failure
    for want of room (:data:`NO_ROOM_ERRORS`). After any other failed write, the log goes to
    ``/dev/null`` from then on (and the bytes count as written).

    ``os.write``, not ``sys.stdout``: a write blocked on a full pipe then holds no lock of
    Python's, so the interpreter can still exit (it flushes ``sys.stdout`` at exit, and would
    abort waiting for a lock held by this daemon thread)."""
    view = memoryview(data)
    written = 0
    try:
        while written < len(data):
            try:
                written += os.write(1, view[written:])
            except BlockingIOError:
                select.select([], [1], [])
    except OSError as exc:
        if exc.errno in NO_ROOM_ERRORS:
            return written
        _discard_stdout()
    return len(data)


def _discard_stdout() -> None:
    """Point descriptor 1 at ``/dev/null``: later lines, and anything else that writes to
    standard output, succeed and are dropped."""
    null = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(null, 1)
    finally:
        os.close(null)


LOG_WRITER = LogWriter()
"""The process's writer of log lines (structlog's logger hands it every line)."""
atexit.register(LOG_WRITER.flush, EXIT_FLUSH_S)
os.register_at_fork(after_in_child=LOG_WRITER._forget_in_child)

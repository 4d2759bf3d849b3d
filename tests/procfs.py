"""What a process is doing, read from Linux's ``/proc`` (imported by tests in any folder:
pytest puts this folder on ``sys.path`` for the root conftest)."""

from __future__ import annotations

import contextlib
import time
from pathlib import Path

__all__ = ["wait_opening_a_fifo"]


def wait_opening_a_fifo(pid: int, timeout_s: float = 60.0) -> None:
    """Wait until a thread of process ``pid`` waits in ``open`` for a FIFO's writer (the
    kernel function it sleeps in, fs/pipe.c).

    Raises:
        AssertionError: none did within ``timeout_s``, or the process ended.
    """
    deadline = time.monotonic() + timeout_s
    while not _opening_a_fifo(pid):
        assert time.monotonic() < deadline, f"process {pid} opened no FIFO"
        time.sleep(0.01)


def _opening_a_fifo(pid: int) -> bool:
    for wchan in Path(f"/proc/{pid}/task").glob("*/wchan"):
        with contextlib.suppress(OSError):  # a thread that ended since it was listed
            if wchan.read_text() == "wait_for_partner":
                return True
    return False

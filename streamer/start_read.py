"""``streamer run``'s first read of its config file, which a stop can cut short.

The daemon's signals are held while it starts (:mod:`streamer.signals`), and the file is read
before any handler exists: a read that blocks (a hung network mount, a FIFO nobody writes)
would block them too, for good, and only SIGKILL would end the process. So the read runs on
a :class:`~streamer.config_read.ConfigRead` thread while the main thread takes a held SIGINT
or SIGTERM itself (``sigtimedwait``); a SIGHUP stays held, for the daemon to act on once
started. The read is given up after ``timeout_s``: the file's own ``reload_timeout_s`` is not
known before it is read, so the caller passes its default.
"""

from __future__ import annotations

import signal
import time
from pathlib import Path

from streamer.config import Config
from streamer.config_read import ConfigRead
from streamer.errors import ConfigError, StreamerError
from streamer.signals import POLL_S

__all__ = ["STOP_SIGNALS", "ReadStopped", "read_at_start"]

STOP_SIGNALS = frozenset({signal.SIGINT, signal.SIGTERM})
"""The held signals that end the read."""


class ReadStopped(Exception):
    """A stop signal came before the config file was read.

    Args:
        signum: the signal's number.
    """

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


def read_at_start(path: Path, timeout_s: float) -> Config:
    """Read and validate ``path`` on a thread while taking held SIGINT and SIGTERM.

    Call with :data:`STOP_SIGNALS` held (blocked) in every thread, as ``streamer run``
    starts; otherwise ``sigtimedwait`` does not see them.

    Raises:
        ConfigError: the file is unreadable or invalid.
        ReadStopped: SIGINT or SIGTERM came first (taken: it is not delivered again).
        StreamerError: the read did not end within ``timeout_s`` (its thread is left
            blocked; it is a daemon thread).
    """
    read = ConfigRead(path)
    deadline = read.started_s + timeout_s
    while not read.wait(POLL_S):
        if (taken := signal.sigtimedwait(STOP_SIGNALS, 0)) is not None:
            raise ReadStopped(taken.si_signo)
        if time.monotonic() >= deadline:
            raise StreamerError(f"{path}: not read in {timeout_s:g} s (a hung mount?)")
    result = read.result()
    if isinstance(result, str):
        raise ConfigError(result)
    return result

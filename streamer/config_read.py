"""A reload's read of the config file, on a thread of its own.

The daemon reads its config file again on SIGHUP. A read that blocks (a hung network mount,
a FIFO that nobody writes) must block only the read: the control loop goes on ticking,
pinging the watchdog and acting on SIGTERM, and gives the read up after
``daemon.reload_timeout_s``. A read given up on leaves its thread blocked in the kernel; it is
a daemon thread, so it never holds up the exit.
"""

from __future__ import annotations

from functools import partial
from pathlib import Path

from streamer.background_call import BackgroundCall
from streamer.config import Config, load_config
from streamer.errors import ConfigError

__all__ = ["ConfigRead"]


class ConfigRead:
    """One read of ``path`` with :func:`~streamer.config.load_config`, started at once on a
    :class:`~streamer.background_call.BackgroundCall`.

    Args:
        path: the config file.

    Attributes:
        started_s: when the read started, s (monotonic clock).
    """

    def __init__(self, path: Path) -> None:
        self._read = BackgroundCall(partial(_read, path), "config-read")
        self.started_s = self._read.started_s

    def wait(self, timeout_s: float) -> bool:
        """Wait at most ``timeout_s`` for the read to end; whether it has."""
        return self._read.wait(timeout_s)

    def result(self) -> Config | str:
        """The config read, or why it could not be (the error's text); only once it ended.

        Raises:
            RuntimeError: the read has not ended.
        """
        if not self._read.wait(0):
            raise RuntimeError("the config file is still being read")
        return self._read.result()


def _read(path: Path) -> Config | str:
    try:
        return load_config(path)
    except ConfigError as exc:
        return str(exc)
    except Exception as exc:  # noqa: BLE001 - a bad file must not stop a serving daemon
        return f"{type(exc).__name__}: {exc}"

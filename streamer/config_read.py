"""A reload's read of the config file, on a thread of its own.

The daemon reads its config file again on SIGHUP. A read that blocks (a hung network mount,
a FIFO that nobody writes) must block only the read: the control loop goes on ticking,
pinging the watchdog and acting on SIGTERM, and gives the read up after
``daemon.reload_timeout_s``. A read given up on leaves its thread blocked in the kernel; it is
a daemon thread, so it never holds up the exit.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

from streamer.config import Config, load_config
from streamer.errors import ConfigError

__all__ = ["ConfigRead"]


class ConfigRead:
    """One read of ``path`` with :func:`~streamer.config.load_config`, started at once.

    Args:
        path: the config file.

    Attributes:
        started_s: when the read started, s (monotonic clock).
    """

    def __init__(self, path: Path) -> None:
        self.started_s = time.monotonic()
        self._path = path
        self._done = threading.Event()
        self._config: Config | None = None
        self._error = ""
        threading.Thread(target=self._read, name="config-read", daemon=True).start()

    def wait(self, timeout_s: float) -> bool:
        """Wait at most ``timeout_s`` for the read to end; whether it has."""
        return self._done.wait(timeout_s)

    def result(self) -> Config | str:
        """The config read, or why it could not be (the error's text); only once it ended.

        Raises:
            RuntimeError: the read has not ended.
        """
        if not self._done.is_set():
            raise RuntimeError("the config file is still being read")
        return self._config if self._config is not None else self._error

    def _read(self) -> None:
        try:
            self._config = load_config(self._path)
        except ConfigError as exc:
            self._error = str(exc)
        except Exception as exc:  # noqa: BLE001 - a bad file must not stop a serving daemon
            self._error = f"{type(exc).__name__}: {exc}"
        finally:
            self._done.set()

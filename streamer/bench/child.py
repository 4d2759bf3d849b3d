"""A subprocess of the benchmark whose stdout lines are read on a thread and kept.

Used for the daemon (its JSON log lines) and the ``naive`` receiver (a ``ready`` line), so
the benchmark can wait for a line with a timeout and keep every line for the log file.
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any, Protocol

from streamer.bench.deferred_signals import hurry_requested, signals_deferred
from streamer.errors import StreamerError

__all__ = ["Child", "Stoppable", "python_module", "stop_all"]

_STOP_TIMEOUT_S = 30.0
_HURRY_POLL_S = 0.1


def python_module(module: str, *args: str) -> list[str]:
    """The command line that runs ``python -m module args…`` with this interpreter."""
    return [sys.executable, "-m", module, *args]


class Child:
    """A running subprocess; stdout and stderr together, one JSON object (or text) per line.

    Args:
        command: the command line.
        log_path: every line is written here when the child is stopped.
    """

    def __init__(self, command: Sequence[str], log_path: Path) -> None:
        self.lines: list[dict[str, Any]] = []
        self._log_path = log_path
        self._queue: queue.SimpleQueue[dict[str, Any] | None] = queue.SimpleQueue()
        self.process = subprocess.Popen(
            list(command),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
        self._reader = threading.Thread(target=self._read, name="bench-child-reader", daemon=True)
        self._reader.start()

    @property
    def pid(self) -> int:
        return self.process.pid

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            try:
                entry = json.loads(line)
            except json.JSONDecodeError:
                entry = {"event": "text", "line": line.rstrip()}
            if not isinstance(entry, dict):
                entry = {"event": "text", "line": line.rstrip()}
            self.lines.append(entry)
            self._queue.put(entry)
        self._queue.put(None)

    def wait_event(self, event: str, timeout_s: float) -> dict[str, Any]:
        """The first line whose ``event`` is ``event`` (lines before it are skipped).

        Raises:
            StreamerError: the child exited, or no such line came within ``timeout_s``.
        """
        deadline = time.monotonic() + timeout_s
        while (left := deadline - time.monotonic()) > 0:
            try:
                entry = self._queue.get(timeout=left)
            except queue.Empty:
                break
            if entry is None:
                raise StreamerError(f"{self._name()} exited: {self._tail()}")
            if entry.get("event") == event:
                return entry
        raise StreamerError(f"{self._name()}: no {event!r} line in {timeout_s} s: {self._tail()}")

    def stop(self) -> int:
        """SIGTERM, wait (kill after 30 s, or at once when :func:`hurry_requested`), write
        the log; returns the exit code.

        Raises:
            StreamerError: the log cannot be written (the child is stopped all the same).
        """
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + _STOP_TIMEOUT_S
        while (code := self.process.poll()) is None:
            if hurry_requested() or time.monotonic() >= deadline:
                self.process.kill()
                code = self.process.wait()
                break
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.process.wait(_HURRY_POLL_S)
        self._reader.join(5)
        assert self.process.stdout is not None
        self.process.stdout.close()
        try:
            self._log_path.write_text("".join(json.dumps(line) + "\n" for line in self.lines))
        except OSError as exc:
            raise StreamerError(f"cannot write {self._log_path}: {exc.strerror or exc}") from exc
        return code

    def _name(self) -> str:
        return " ".join(str(a) for a in self.process.args[1:4])  # type: ignore[index]

    def _tail(self) -> str:
        return "; ".join(json.dumps(line) for line in self.lines[-5:]) or "no output"


class Stoppable(Protocol):
    """Something the benchmark started and must stop (a :class:`Child` or its owner)."""

    def stop(self) -> object:
        """Stop it; may raise."""


def stop_all(children: Iterable[Stoppable]) -> None:
    """Stop each of ``children`` in turn, every one even when a stop fails, with Ctrl-C and
    SIGTERM deferred until all are stopped (:func:`signals_deferred`; a second one makes
    the stops kill at once).

    Raises:
        Exception: the first error a stop raised, once every stop was tried.
    """
    errors: list[Exception] = []
    with signals_deferred():
        for child in children:
            try:
                child.stop()
            except Exception as exc:  # the others are stopped all the same
                errors.append(exc)
    if errors:
        raise errors[0]

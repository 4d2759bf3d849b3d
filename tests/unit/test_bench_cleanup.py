"""The benchmark's cleanup: every child stopped, whatever fails or arrives meanwhile."""

from __future__ import annotations

import os
import signal
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from streamer.bench.child import Child, stop_all
from streamer.bench.deferred_signals import hurry_requested, signals_deferred
from streamer.errors import StreamerError

SLEEPER = [sys.executable, "-c", "import time; time.sleep(60)"]


class Terminated(Exception):
    pass


@pytest.fixture
def sigterm_raises() -> Iterator[None]:
    def handler(signum: int, frame: object) -> None:
        raise Terminated

    previous = signal.signal(signal.SIGTERM, handler)
    yield
    signal.signal(signal.SIGTERM, previous)


@pytest.mark.usefixtures("sigterm_raises")
def test_a_signal_during_the_cleanup_takes_effect_once_it_is_done() -> None:
    done = []
    with pytest.raises(Terminated), signals_deferred():
        os.kill(os.getpid(), signal.SIGTERM)
        os.kill(os.getpid(), signal.SIGINT)  # the first one noted is the one raised
        done.append("the rest of the cleanup")
    assert done == ["the rest of the cleanup"]
    with pytest.raises(Terminated):  # the handler is back
        os.kill(os.getpid(), signal.SIGTERM)


def test_an_ignored_signal_stays_ignored() -> None:
    previous = signal.signal(signal.SIGTERM, signal.SIG_IGN)
    try:
        with signals_deferred():
            os.kill(os.getpid(), signal.SIGTERM)
        assert signal.getsignal(signal.SIGTERM) == signal.SIG_IGN
    finally:
        signal.signal(signal.SIGTERM, previous)


def test_every_child_is_stopped_when_a_stop_fails_and_the_first_error_is_raised(
    tmp_path: Path,
) -> None:
    unwritable = Child(SLEEPER, tmp_path / "missing-folder" / "a.log")
    other = Child(SLEEPER, tmp_path / "b.log")
    with pytest.raises(StreamerError, match="cannot write .*a.log"):
        stop_all([unwritable, other])
    assert unwritable.process.poll() is not None
    assert other.process.poll() is not None
    assert (tmp_path / "b.log").exists()


class _InterruptedStop:
    """A stop during which Ctrl-C comes (the user presses it again)."""

    def __init__(self, child: Child) -> None:
        self.child = child

    def stop(self) -> int:
        os.kill(os.getpid(), signal.SIGINT)
        return self.child.stop()


def test_ctrl_c_while_children_are_stopped_stops_them_all_first(tmp_path: Path) -> None:
    first, second = Child(SLEEPER, tmp_path / "a.log"), Child(SLEEPER, tmp_path / "b.log")
    with pytest.raises(KeyboardInterrupt):
        stop_all([_InterruptedStop(first), second])
    assert first.process.poll() is not None
    assert second.process.poll() is not None


DEAF = [
    sys.executable,
    "-c",
    "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN);"
    ' print(\'{"event": "ready"}\', flush=True); time.sleep(60)',
]


class _InterruptedTwice:
    """A stop during which Ctrl-C is pressed twice, of a child that ignores SIGTERM."""

    def __init__(self, child: Child) -> None:
        self.child = child

    def stop(self) -> int:
        os.kill(os.getpid(), signal.SIGINT)
        os.kill(os.getpid(), signal.SIGINT)
        return self.child.stop()


def test_a_second_ctrl_c_kills_what_is_still_stopping(tmp_path: Path) -> None:
    """Each stop waited up to 30 s for its child to exit, however often Ctrl-C came."""
    deaf = Child(DEAF, tmp_path / "a.log")
    deaf.wait_event("ready", 30)  # its SIGTERM handler is set
    started = time.monotonic()
    with pytest.raises(KeyboardInterrupt):
        stop_all([_InterruptedTwice(deaf)])
    assert deaf.process.returncode == -signal.SIGKILL
    assert time.monotonic() - started < 20  # not the 30 s a child that ignores SIGTERM gets
    with pytest.raises(KeyboardInterrupt), signals_deferred():  # the hurry ended with it
        os.kill(os.getpid(), signal.SIGINT)
        assert not hurry_requested()

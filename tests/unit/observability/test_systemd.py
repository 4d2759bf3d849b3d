"""sd_notify messages on a real unix datagram socket, as systemd receives them."""

from __future__ import annotations

import contextlib
import os
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from structlog.testing import capture_logs

from streamer.observability.systemd import SEND_TIMEOUT_S, Notifier, watchdog_interval_s


def test_watchdog_interval_follows_sd_watchdog_enabled() -> None:
    assert watchdog_interval_s({"WATCHDOG_USEC": "30000000"}, 42) == 15.0
    assert watchdog_interval_s({"WATCHDOG_USEC": "400000", "WATCHDOG_PID": "42"}, 42) == 0.2
    assert watchdog_interval_s({"WATCHDOG_USEC": "400000", "WATCHDOG_PID": "7"}, 42) is None
    assert watchdog_interval_s({"WATCHDOG_USEC": "0"}, 42) is None
    assert watchdog_interval_s({"WATCHDOG_USEC": "soon"}, 42) is None
    assert watchdog_interval_s({}, 42) is None


@pytest.fixture
def notify_path(tmp_path: Path) -> Path:
    return tmp_path / "notify"


@pytest.fixture
def receiver(notify_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[socket.socket]:
    """A datagram socket in the place of systemd's, named by NOTIFY_SOCKET."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    sock.bind(str(notify_path))
    sock.settimeout(5)
    monkeypatch.setenv("NOTIFY_SOCKET", str(notify_path))
    monkeypatch.setenv("WATCHDOG_USEC", "400000")
    monkeypatch.delenv("WATCHDOG_PID", raising=False)
    yield sock
    sock.close()


def test_every_message_reaches_the_socket(receiver: socket.socket) -> None:
    notifier = Notifier()
    assert notifier.enabled and notifier.watchdog_interval_s == 0.2
    before_us = time.monotonic_ns() // 1000
    notifier.ready()
    notifier.status("running: 1.0 frames/s")
    notifier.watchdog()
    notifier.reloading()
    notifier.stopping()
    notifier.close()
    notifier.ready()  # closed: sends nothing
    messages = [receiver.recv(4096).decode() for _ in range(5)]
    assert messages[:3] == ["READY=1", "STATUS=running: 1.0 frames/s", "WATCHDOG=1"]
    reloading, stamp = messages[3].split("\n")
    assert reloading == "RELOADING=1"
    assert before_us <= int(stamp.removeprefix("MONOTONIC_USEC=")) <= time.monotonic_ns() // 1000
    assert messages[4] == "STOPPING=1"


def test_an_abstract_socket_name_is_understood(monkeypatch: pytest.MonkeyPatch) -> None:
    name = f"streamer-test-{os.getpid()}-{time.monotonic_ns()}"
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
        sock.bind("\0" + name)
        sock.settimeout(5)
        monkeypatch.setenv("NOTIFY_SOCKET", "@" + name)
        notifier = Notifier()
        notifier.ready()
        notifier.close()
        assert sock.recv(64) == b"READY=1"


def test_without_systemd_every_call_is_a_no_op(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("NOTIFY_SOCKET", raising=False)
    monkeypatch.delenv("WATCHDOG_USEC", raising=False)
    notifier = Notifier()
    assert not notifier.enabled and notifier.watchdog_interval_s is None
    with capture_logs() as logs:
        notifier.ready()
        notifier.watchdog()
        notifier.stopping()
    assert logs == []


# sdnotify drops its unconnected socket without closing it (see streamer.observability.systemd).
@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
def test_a_missing_socket_disables_notifications(
    notify_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("NOTIFY_SOCKET", str(notify_path))
    with capture_logs() as logs:
        notifier = Notifier()
        notifier.ready()
    assert not notifier.enabled
    assert [e["event"] for e in logs] == ["systemd_notify_unavailable"]


def test_a_vanished_service_manager_is_logged_once_and_never_raises(
    receiver: socket.socket, notify_path: Path
) -> None:
    notifier = Notifier()
    receiver.close()
    notify_path.unlink()
    with capture_logs() as logs:
        for _ in range(3):
            notifier.watchdog()
    notifier.close()
    assert [e["event"] for e in logs] == ["systemd_notify_failed"]


def test_a_service_manager_that_stops_reading_never_blocks_the_daemon(
    receiver: socket.socket,
) -> None:
    """Once the socket's queue is full, each send gives up after SEND_TIMEOUT_S (logged once)
    instead of blocking the control loop; sends resume once the manager reads again."""
    notifier = Notifier()
    queue_length = int(Path("/proc/sys/net/unix/max_dgram_qlen").read_text())
    try:
        with capture_logs() as logs:
            for _ in range(queue_length + 1):  # fills the queue (small datagrams)
                notifier.watchdog()
            started = time.monotonic()
            notifier.watchdog()
            notifier.stopping()
            waited_s = time.monotonic() - started
            queued = drain(receiver)
            notifier.ready()
        assert receiver.recv(4096) == b"READY=1"
    finally:
        notifier.close()
    assert waited_s < 4 * SEND_TIMEOUT_S + 1
    assert set(queued) == {b"WATCHDOG=1"}  # the two sent on a full queue were given up
    assert [e["event"] for e in logs] == ["systemd_notify_failed", "systemd_notify_restored"]


def drain(receiver: socket.socket) -> list[bytes]:
    """Every datagram queued on ``receiver``."""
    receiver.settimeout(0.2)
    queued = []
    with contextlib.suppress(TimeoutError):
        while True:
            queued.append(receiver.recv(4096))
    receiver.settimeout(5)
    return queued

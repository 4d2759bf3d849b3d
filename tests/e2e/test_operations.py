"""Operating the daemon: systemd notifications, the watchdog on a wedged pipeline, the probes
and /metrics, on the real daemon subprocess.

systemd's end of sd_notify is played by a real unix datagram socket handed to the daemon as
``NOTIFY_SOCKET``. The wedged pipeline runs a real ONNX model built here whose ``Loop`` runs
2**62 times: its first batch never finishes, the way a hung device or driver call behaves.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import queue
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import cv2
import numpy as np
import pytest
import zmq
from procfs import wait_opening_a_fifo
from prometheus_client.parser import text_string_to_metric_families

from streamer.errors import Reason
from streamer.transport.protocol import encode_frame

from .conftest import ROOT, Client, Daemon, shipped_config, wedge_model


class NotifySocket:
    """systemd's side of sd_notify: a datagram socket whose messages a thread collects.

    Attributes:
        messages: ``(time.monotonic() s when received, message)``, in arrival order.
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        self.messages: list[tuple[float, str]] = []
        self._new: queue.SimpleQueue[str] = queue.SimpleQueue()
        self._socket = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self._socket.bind(str(path))
        self._socket.settimeout(0.05)
        self._closed = threading.Event()
        self._reader = threading.Thread(target=self._read, name="notify-reader")
        self._reader.start()

    def env(self, watchdog_usec: int) -> dict[str, str]:
        """The environment systemd gives a ``Type=notify`` service with ``WatchdogSec=``."""
        return {"NOTIFY_SOCKET": str(self.path), "WATCHDOG_USEC": str(watchdog_usec)}

    def _read(self) -> None:
        while not self._closed.is_set():
            try:
                message = self._socket.recv(4096).decode()
            except TimeoutError:
                continue
            self.messages.append((time.monotonic(), message))
            self._new.put(message)

    def wait(self, prefix: str, timeout_s: float = 30.0) -> str:
        """The next message starting with ``prefix``; those before it are skipped."""
        deadline = time.monotonic() + timeout_s
        while (left := deadline - time.monotonic()) > 0:
            try:
                message = self._new.get(timeout=left)
            except queue.Empty:
                break
            if message.startswith(prefix):
                return message
        raise AssertionError(f"no {prefix!r} in {timeout_s} s; got {self.texts()[-10:]}")

    def texts(self, since_s: float = 0.0) -> list[str]:
        """Messages received after ``since_s`` (``time.monotonic()``)."""
        return [m for t, m in list(self.messages) if t > since_s]

    def close(self) -> None:
        self._closed.set()
        self._reader.join()
        self._socket.close()


@pytest.fixture
def notify(tmp_path: Path) -> Iterator[NotifySocket]:
    listener = NotifySocket(tmp_path / "notify")
    yield listener
    listener.close()


def get(url: str) -> tuple[int, Any] | None:
    """Status and body (JSON when it is) of a GET; None when nothing listens."""
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            status, body, kind = response.status, response.read(), response.headers
    except urllib.error.HTTPError as error:
        with error:
            status, body, kind = error.code, error.read(), error.headers
    except urllib.error.URLError:
        return None
    if kind["Content-Type"] == "application/json":
        return status, json.loads(body)
    return status, body.decode()


def test_notify_sequence_ready_watchdog_status_reload_stopping(
    start_daemon: Any, connect: Any, notify: NotifySocket, astronaut: np.ndarray
) -> None:
    watchdog_s = 1.0
    daemon: Daemon = start_daemon(
        daemon_extra="status_interval_s = 0.3",
        env=notify.env(watchdog_usec=int(watchdog_s * 1e6)),
    )
    notify.wait("READY=1")
    notify.wait("WATCHDOG=1")
    client: Client = connect(daemon)
    jpeg = cv2.imencode(".jpg", cv2.resize(astronaut, (256, 256)))[1].tobytes()
    for seq in range(10):
        client.send_parts(encode_frame("cam", seq, jpeg, encoding="jpeg"))
    assert len(client.collect(10)) == 10
    status = notify.wait("STATUS=running: ")
    assert "frames/s" in status and "in flight; received " in status
    daemon.process.send_signal(signal.SIGHUP)
    notify.wait("RELOADING=1\nMONOTONIC_USEC=")
    notify.wait("READY=1")
    for _ in range(3):
        notify.wait("WATCHDOG=1")  # pings go on after the reload
    assert daemon.stop() == 0
    texts = notify.texts()
    stopping = texts.index("STOPPING=1")
    assert texts[0] == "READY=1"
    assert "WATCHDOG=1" not in texts[stopping:]
    assert texts[-1].startswith(
        f"STATUS=stopped: 0.0 frames/s, 0 in flight; received {10 + client.probes},"
    )
    pings = [t for t, m in notify.messages if m == "WATCHDOG=1"]
    gaps = np.diff(pings)
    assert gaps.max() < watchdog_s  # systemd's watchdog never fired


def test_a_wedged_pipeline_stops_the_watchdog_and_fails_readiness(
    start_daemon: Any, notify: NotifySocket, tmp_path: Path, astronaut: np.ndarray
) -> None:
    daemon: Daemon = start_daemon(
        model_path=wedge_model(tmp_path / "wedge.onnx"),
        drain_timeout_s=1.0,
        daemon_extra="stall_timeout_s = 1.0\nstatus_interval_s = 0.2",
        env=notify.env(watchdog_usec=400_000),
    )
    notify.wait("WATCHDOG=1")
    notify.wait("WATCHDOG=1")  # idle is healthy
    assert get(daemon.http + "/readyz") == (
        200,
        {"ready": True, "status": "running", "reasons": []},
    )
    with zmq.Context() as context, context.socket(zmq.PUSH) as push:
        push.setsockopt(zmq.LINGER, 1000)
        push.connect(daemon.ingress)
        jpeg = cv2.imencode(".jpg", astronaut)[1].tobytes()
        push.send_multipart(encode_frame("cam", 0, jpeg, encoding="jpeg"))
        daemon.wait_event("pipeline_stalled", 10)
    stalled_at = time.monotonic()
    time.sleep(1.2)  # six ping intervals
    after = notify.texts(since_s=stalled_at + 0.2)
    assert "WATCHDOG=1" not in after
    assert any(m.startswith("STATUS=stalled ") for m in after)
    status, body = get(daemon.http + "/readyz") or (0, {})
    assert status == 503 and body["reasons"][0].startswith("stalled: no frame completed for ")
    assert get(daemon.http + "/healthz") == (
        200,
        {"alive": True, "status": "running", "reasons": []},
    )

    daemon.process.send_signal(signal.SIGTERM)
    notify.wait("STOPPING=1")
    status, body = get(daemon.http + "/readyz") or (0, {})
    assert status == 503 and body["status"] in ("stopping", "stopped")
    assert get(daemon.http + "/healthz") is not None
    final = daemon.wait_event("stopped", 30)  # after the model close gave up (10 s)
    assert final["received"] == final["published"] + final["failed"] + final["dropped"] == 1
    # The wedged run is abandoned after the model's close timeout and the process ends at once
    # rather than hang, or abort should the run return while the interpreter finalises: exit 1,
    # so systemd's Restart=on-failure brings a fresh daemon up.
    assert daemon.stop(timeout_s=30) == 1
    assert any(e.get("event") == "model_close_timeout" for e in daemon.logs)
    forced = next(e for e in daemon.logs if e.get("event") == "exit_forced")
    assert forced["abandoned"][0].startswith("model 'face': onnx-face/")


def scrape(daemon: Daemon) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample of /metrics as {(name, sorted labels): value}."""
    result = get(daemon.http + "/metrics")
    assert result is not None and result[0] == 200
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(result[1])
        for s in family.samples
    }


def by_reason(
    values: dict[tuple[str, tuple[tuple[str, str], ...]], float], name: str
) -> dict[str, float]:
    """The samples of counter ``name`` in a :func:`scrape`, by their ``reason`` label."""
    return {dict(labels)["reason"]: v for (n, labels), v in values.items() if n == name}


def test_probes_and_metrics_across_start_run_and_stop(
    start_daemon: Any, connect: Any, astronaut: np.ndarray
) -> None:
    daemon: Daemon = start_daemon(wait_ready=False)
    answers = []
    deadline = time.monotonic() + 60
    while (answer := get(daemon.http + "/readyz")) is None or answer[0] != 200:
        assert time.monotonic() < deadline and daemon.process.poll() is None, daemon.logs[-10:]
        if answer is not None:
            answers.append(answer)
        time.sleep(0.005)
    for status, body in answers:  # before ready: 503 while loading models or binding sockets
        assert status == 503 and body["status"] in ("initializing", "starting"), body
    daemon.wait_event("ready")
    assert get(daemon.http + "/healthz") == (
        200,
        {"alive": True, "status": "running", "reasons": []},
    )

    client: Client = connect(daemon)
    jpeg = cv2.imencode(".jpg", cv2.resize(astronaut, (256, 256)))[1].tobytes()
    for seq in range(20):
        client.send_parts(encode_frame("cam", seq, jpeg, encoding="jpeg"))
    for seq in range(20, 23):
        client.send_parts(encode_frame("cam", seq, b"not a jpeg", encoding="jpeg"))
    assert len(client.collect(23)) == 23
    deadline = time.monotonic() + 10
    while (values := scrape(daemon))[("streamer_frames_in_flight", ())] != 0:
        assert time.monotonic() < deadline
        time.sleep(0.05)
    good = 20 + client.probes
    face = (("model", "face"),)
    assert values[("streamer_frames_received_total", ())] == good + 3
    assert values[("streamer_frames_published_total", ())] == good
    failed = by_reason(values, "streamer_frames_failed_total")
    assert failed == {**dict.fromkeys(Reason.FAILURES, 0), "decode_failed": 3}
    assert by_reason(values, "streamer_frames_dropped_total") == dict.fromkeys(Reason.DROPS, 0)
    flushes = by_reason(values, "streamer_batch_flushes_total")
    assert set(flushes) == {"full", "deadline", "marker"} and flushes["marker"] == 0
    assert values[("streamer_batch_size_sum", face)] == good
    for latency in ("queue", "inference", "end_to_end"):
        assert values[(f"streamer_{latency}_duration_seconds_count", face)] == good
    assert values[("streamer_queue_depth", (("queue", "batcher"),))] == 0
    assert values[("process_resident_memory_bytes", ())] > 0

    assert daemon.stop() == 0
    final = daemon.final_counts()
    assert final["received"] == good + 3 and final["published"] == good
    assert get(daemon.http + "/healthz") is None


def test_reload_outcomes_show_in_metrics_while_the_old_config_serves(
    start_daemon: Any, connect: Any, notify: NotifySocket, astronaut: np.ndarray
) -> None:
    """``streamer_config_last_reload_successful`` is 1 at start and after a reload whose
    whole file is in force, 0 after one rejected or waiting for a restart; the timestamp
    moves only with a 1. systemd's ``READY=1`` ends each reload, whatever its outcome."""
    daemon: Daemon = start_daemon(env=notify.env(watchdog_usec=60_000_000))
    notify.wait("READY=1")
    text = daemon.config_path.read_text()
    started = reload_gauges(daemon)
    assert started[0] == 1 and started[1] > 0

    applied = reload_with(daemon, notify, text.replace("max_delay_ms = 5.0", "max_delay_ms = 6.0"))
    assert applied[0] == 1 and applied[1] > started[1]
    wrong_type = text.replace("max_delay_ms = 5.0", 'max_delay_ms = "soon"')
    assert reload_with(daemon, notify, wrong_type) == (0, applied[1])
    assert "reload_rejected" in [e.get("event") for e in daemon.logs]
    client: Client = connect(daemon)
    jpeg = cv2.imencode(".jpg", cv2.resize(astronaut, (256, 256)))[1].tobytes()
    for seq in range(5):
        client.send_parts(encode_frame("cam", seq, jpeg, encoding="jpeg"))
    assert [r["error"] for r in client.collect(5)] == [None] * 5
    restart = text.replace("max_delay_ms = 5.0", "max_delay_ms = 6.0").replace(
        "drain_timeout_s = 10.0", "drain_timeout_s = 9.0"
    )
    assert reload_with(daemon, notify, restart) == (0, applied[1])
    assert "reload_needs_restart" in [e.get("event") for e in daemon.logs]

    again = reload_with(daemon, notify, text.replace("max_delay_ms = 5.0", "max_delay_ms = 7.0"))
    assert again[0] == 1 and again[1] > applied[1]
    assert scrape(daemon)[("streamer_config_reloads_total", ())] == 4  # whatever the outcome
    assert daemon.stop() == 0


def reload_gauges(daemon: Daemon) -> tuple[float, float]:
    """``streamer_config_last_reload_successful`` and ``…_success_timestamp_seconds``."""
    values = scrape(daemon)
    return (
        values[("streamer_config_last_reload_successful", ())],
        values[("streamer_config_last_reload_success_timestamp_seconds", ())],
    )


def reload_with(daemon: Daemon, notify: NotifySocket, text: str) -> tuple[float, float]:
    """Write ``text`` as the daemon's config, SIGHUP, wait for the reload's end (``READY=1``):
    the reload gauges then."""
    daemon.config_path.write_text(text)
    daemon.process.send_signal(signal.SIGHUP)
    notify.wait("RELOADING=1")
    notify.wait("READY=1")
    return reload_gauges(daemon)


def test_a_reload_cut_short_by_a_stop_is_logged(start_daemon: Any) -> None:
    """SIGHUP right before SIGTERM: the reload is either done or reported skipped, never
    dropped without a word."""
    daemon: Daemon = start_daemon()
    daemon.process.send_signal(signal.SIGHUP)
    daemon.process.send_signal(signal.SIGTERM)
    assert daemon.process.wait(30) == 0
    daemon.close()
    events = [e.get("event") for e in daemon.logs]
    assert ("reload_skipped" in events) != ("reload_unchanged" in events)


def block_config_reads(daemon: Daemon) -> None:
    """Replace the daemon's config file by a FIFO nobody writes: opening it blocks, as a read
    on a hung network mount does."""
    daemon.config_path.unlink()
    os.mkfifo(daemon.config_path)


def test_a_config_read_that_blocks_holds_up_neither_the_watchdog_nor_the_frames(
    start_daemon: Any, connect: Any, notify: NotifySocket, astronaut: np.ndarray
) -> None:
    """The reload gives the read up after ``reload_timeout_s`` and keeps the running config;
    meanwhile the watchdog is pinged and frames are served. The next SIGHUP reads the file
    again, while the first read is still blocked (on the FIFO, now deleted)."""
    daemon: Daemon = start_daemon(
        env=notify.env(watchdog_usec=2_000_000), daemon_extra="reload_timeout_s = 2.0"
    )
    notify.wait("READY=1")
    text = daemon.config_path.read_text()
    block_config_reads(daemon)
    daemon.process.send_signal(signal.SIGHUP)
    notify.wait("RELOADING=1")
    notify.wait("WATCHDOG=1")  # the control loop is not blocked in the read
    client: Client = connect(daemon)
    jpeg = cv2.imencode(".jpg", cv2.resize(astronaut, (256, 256)))[1].tobytes()
    client.send_parts(encode_frame("cam", 0, jpeg, encoding="jpeg"))
    assert client.collect(1)[0]["error"] is None
    notify.wait("READY=1")
    first = daemon.wait_event("reload_rejected", 30)
    assert "not read and validated in 2 s" in first["error"]
    assert reload_gauges(daemon)[0] == 0

    daemon.config_path.unlink()
    assert reload_with(daemon, notify, text.replace("max_delay_ms = 5.0", "max_delay_ms = 6.0"))[0]
    assert daemon.stop() == 0
    final = daemon.final_counts()
    assert final["published"] == final["received"] > 0


def test_reads_that_stay_blocked_are_bounded_and_a_reload_reads_again_once_they_end(
    start_daemon: Any, notify: NotifySocket
) -> None:
    """Each read given up on leaves a thread blocked in the kernel: after three, a SIGHUP is
    rejected at once rather than leave one more; once they end (a writer opens the FIFO and
    closes it), the next SIGHUP reads the file."""
    daemon: Daemon = start_daemon(
        env=notify.env(watchdog_usec=60_000_000), daemon_extra="reload_timeout_s = 0.5"
    )
    notify.wait("READY=1")
    text = daemon.config_path.read_text()
    block_config_reads(daemon)
    for _ in range(3):
        daemon.process.send_signal(signal.SIGHUP)
        notify.wait("READY=1")
        assert "not read and validated" in daemon.wait_event("reload_rejected", 30)["error"]
    daemon.process.send_signal(signal.SIGHUP)
    notify.wait("READY=1")
    assert "its last 3 reads are still blocked" in daemon.wait_event("reload_rejected")["error"]
    os.close(os.open(daemon.config_path, os.O_WRONLY | os.O_NONBLOCK))  # their reads end: EOF
    daemon.config_path.unlink()
    changed = text.replace("max_delay_ms = 5.0", "max_delay_ms = 6.0")
    # The released reads end within moments; a SIGHUP that comes before is rejected.
    assert any(reload_with(daemon, notify, changed)[0] for _ in range(5))
    assert daemon.stop() == 0


def test_the_first_status_comes_right_after_ready(start_daemon: Any, notify: NotifySocket) -> None:
    """``systemctl status`` had no Status line for the first ``status_interval_s``."""
    daemon: Daemon = start_daemon(
        daemon_extra="status_interval_s = 3600.0", env=notify.env(watchdog_usec=60_000_000)
    )
    notify.wait("READY=1")
    assert "in flight; received 0," in notify.wait("STATUS=running: ", timeout_s=10)
    assert daemon.stop() == 0


def test_a_stop_during_a_blocked_config_read_is_a_normal_stop(
    start_daemon: Any, notify: NotifySocket
) -> None:
    """SIGTERM while a reload waits for its read: the daemon drains and exits 0; the reload
    is reported skipped."""
    daemon: Daemon = start_daemon(env=notify.env(watchdog_usec=60_000_000))
    notify.wait("READY=1")
    block_config_reads(daemon)
    daemon.process.send_signal(signal.SIGHUP)
    notify.wait("RELOADING=1")
    daemon.process.send_signal(signal.SIGTERM)
    assert daemon.process.wait(30) == 0
    daemon.close()
    events = [e.get("event") for e in daemon.logs]
    assert "reload_skipped" in events and events[-1] == "stopped"


def test_a_stop_while_the_first_config_read_blocks_exits_at_once(tmp_path: Path) -> None:
    """The config file is a FIFO nobody writes (a hung mount): the start's read blocks. The
    daemon's signals are held while it starts, so SIGTERM went unseen and only SIGKILL ended
    the process; now it exits 0 at once, saying why, and a SIGHUP meanwhile stays held."""
    fifo = tmp_path / "streamer.toml"
    os.mkfifo(fifo)
    command = [sys.executable, "-m", "streamer", "run", "--config", str(fifo)]
    with subprocess.Popen(command, stdout=subprocess.PIPE, text=True) as daemon:
        # Not a fixed sleep: on a loaded machine the interpreter may not have started by
        # then, and the SIGHUP would end it by its default action. Once the signals are
        # held, the stop is taken whenever it comes.
        wait_signals_held(daemon.pid, signal.SIGHUP, signal.SIGTERM)
        daemon.send_signal(signal.SIGHUP)
        daemon.send_signal(signal.SIGTERM)
        out, _ = daemon.communicate(timeout=30)
    assert daemon.returncode == 0
    (line,) = [json.loads(text) for text in out.splitlines()]
    assert line["event"] == "stopped" and line["config"] == str(fifo)
    assert line["reason"] == "SIGTERM came before the config file was read"


def start_loading_a_fifo(folder: Path) -> tuple[subprocess.Popen[str], Path]:
    """``streamer run`` on the default config, its model a FIFO nobody writes (a model file
    on a hung mount), once its start's load waits to open the FIFO: the daemon (its log in
    ``folder/log``) and the FIFO."""
    fifo = folder / "face.onnx"
    os.mkfifo(fifo)
    source = re.compile('^(asset|path) = ".*"$', re.MULTILINE)  # the model's

    def edit(text: str) -> str:
        text = source.sub(f'path = "{fifo}"', text)
        return text.replace("drain_timeout_s = 10.0", "drain_timeout_s = 1.0")

    config, *_ = shipped_config("default.toml", folder, edit)
    command = [sys.executable, "-m", "streamer", "run", "--config", str(config)]
    with (folder / "log").open("w") as log:
        daemon = subprocess.Popen(command, stdout=log, text=True)
    try:
        wait_opening_a_fifo(daemon.pid)
    except AssertionError:
        daemon.kill()
        raise
    return daemon, fifo


def test_a_stop_while_the_start_s_model_load_blocks_ends_the_daemon(tmp_path: Path) -> None:
    """The model is a FIFO nobody writes: the start's load never ends. It ran on the main
    thread, where Python runs signal handlers, so SIGTERM went unseen and only SIGKILL ended
    the process; now the load gets ``drain_timeout_s``, is abandoned, and the daemon exits 0."""
    daemon, _ = start_loading_a_fifo(tmp_path)
    try:
        daemon.send_signal(signal.SIGTERM)
        assert daemon.wait(30) == 0
    finally:
        daemon.kill()
    lines = [json.loads(text) for text in (tmp_path / "log").read_text().splitlines()]
    abandoned, stopped = [line for line in lines if line["event"] != "cpu_scheduling_policy"][-2:]
    assert abandoned["event"] == "load_abandoned" and abandoned["running_s"] >= 1.0
    assert stopped["event"] == "stopped" == lines[-1]["event"]
    assert stopped["reason"] == "a stop came while the models loaded"


def test_a_stop_during_the_start_s_model_load_releases_what_it_loaded(
    tmp_path: Path, assets: dict[str, Path]
) -> None:
    """SIGTERM while the start's model load blocks, which then ends within
    ``drain_timeout_s``: the model it loaded is released, and the daemon exits 0 without
    serving (no ``ready``)."""
    daemon, fifo = start_loading_a_fifo(tmp_path)
    log, deadline = tmp_path / "log", time.monotonic() + 30
    try:
        daemon.send_signal(signal.SIGTERM)
        while '"signal_received"' not in log.read_text():  # the stop was taken: the load
            assert time.monotonic() < deadline, "the stop was not taken"  # may end now
            time.sleep(0.01)
        unblock_the_load(fifo, assets["blazeface_short_range"])
        assert daemon.wait(30) == 0
    finally:
        daemon.kill()
    lines = [json.loads(text) for text in log.read_text().splitlines()]
    events = [line["event"] for line in lines]
    assert events[-1] == "stopped" and "load_abandoned" not in events and "ready" not in events
    assert [line for line in lines if line["level"] != "info"] == []


def reload_onto_a_fifo(daemon: Daemon, folder: Path) -> Path:
    """Point the daemon's model at a FIFO nobody writes, and SIGHUP: the reload's load
    blocks opening it, as a read on a hung network mount does. Returns the FIFO."""
    fifo = folder / "loading.onnx"
    os.mkfifo(fifo)
    source = re.compile('^(asset|path) = ".*"$', re.MULTILINE)  # the model's
    daemon.config_path.write_text(source.sub(f'path = "{fifo}"', daemon.config_path.read_text()))
    daemon.process.send_signal(signal.SIGHUP)
    return fifo


def unblock_the_load(fifo: Path, model: Path) -> None:
    """Put a copy of ``model`` where ``fifo`` was, then let the open waiting on the FIFO
    return (end of file): the load opens the path again and reads the model."""
    held = fifo.rename(fifo.with_name("held"))
    shutil.copyfile(model, fifo)
    os.close(os.open(held, os.O_WRONLY | os.O_NONBLOCK))


def test_a_model_load_that_blocks_holds_up_neither_the_watchdog_nor_a_stop(
    start_daemon: Any, connect: Any, notify: NotifySocket, tmp_path: Path, astronaut: np.ndarray
) -> None:
    """A reload whose new model never loads: the control loop goes on pinging the watchdog
    while the old chain serves, says the reload still runs, and a SIGTERM drains, skips the
    reload a later SIGHUP waits for, abandons the one under way and exits 0 within
    ``drain_timeout_s``. The reload ran on the control thread: no ping came after
    ``RELOADING=1`` (systemd killed the daemon), and the SIGTERM was never acted on."""
    daemon: Daemon = start_daemon(
        env=notify.env(watchdog_usec=1_000_000),
        drain_timeout_s=1.0,
        daemon_extra="reload_timeout_s = 0.5",
    )
    notify.wait("READY=1")
    reload_onto_a_fifo(daemon, tmp_path)
    notify.wait("RELOADING=1")
    for _ in range(2):
        notify.wait("WATCHDOG=1")
    daemon.wait_event("reload_loading")
    notify.wait("WATCHDOG=1")  # the load blocks for good once it began
    assert daemon.wait_event("reload_in_progress")["stage"] == "loading"
    daemon.process.send_signal(signal.SIGHUP)
    daemon.wait_event("reload_deferred")
    client: Client = connect(daemon)
    jpeg = cv2.imencode(".jpg", cv2.resize(astronaut, (256, 256)))[1].tobytes()
    for seq in range(5):
        client.send_parts(encode_frame("cam", seq, jpeg, encoding="jpeg"))
    assert [r["error"] for r in client.collect(5)] == [None] * 5
    daemon.process.send_signal(signal.SIGTERM)
    assert daemon.process.wait(30) == 0
    daemon.close()
    events = [e.get("event") for e in daemon.logs]
    order = ["reload_skipped", "draining", "reload_abandoned", "stopped"]
    assert [events.index(event) for event in order] == sorted(events.index(e) for e in order)
    (abandoned,) = [e for e in daemon.logs if e.get("event") == "reload_abandoned"]
    assert abandoned["stage"] == "loading" and abandoned["running_s"] > 0
    states = [text.split("\n")[0] for text in notify.texts()]  # RELOADING=1 has a stamp
    assert "READY=1" not in states[states.index("RELOADING=1") :]  # it never ended
    assert states.count("RELOADING=1") == 1  # the deferred one never began
    final = daemon.final_counts()
    assert final["received"] == final["published"] == 5 + client.probes


def test_a_chain_loaded_once_the_stop_began_is_released_not_swapped_in(
    start_daemon: Any, notify: NotifySocket, tmp_path: Path, assets: dict[str, Path]
) -> None:
    """SIGTERM while the new model loads, which it ends during the drain: the stop waits for
    the reload, which releases the chain it loaded instead of swapping it in."""
    daemon: Daemon = start_daemon(env=notify.env(watchdog_usec=60_000_000))
    notify.wait("READY=1")
    fifo = reload_onto_a_fifo(daemon, tmp_path)
    daemon.wait_event("reload_loading")
    daemon.process.send_signal(signal.SIGTERM)
    daemon.wait_event("draining")
    unblock_the_load(fifo, assets["blazeface_short_range"])
    assert daemon.process.wait(30) == 0
    daemon.close()
    events = [e.get("event") for e in daemon.logs]
    assert events.index("draining") < events.index("reload_skipped") < events.index("stopped")
    assert "reloaded" not in events  # and its models were released without a word:
    assert [e["event"] for e in daemon.logs if e.get("level") != "info"] == ["reload_skipped"]


def test_a_sighup_during_a_reload_reloads_once_it_has_ended(
    start_daemon: Any, notify: NotifySocket, tmp_path: Path, assets: dict[str, Path]
) -> None:
    """One reload at a time: SIGHUPs while the new model loads (its file a FIFO, until the
    test moves the model there and lets the waiting open go on) are each logged as deferred,
    and one reload follows once that reload has ended with ``READY=1`` and its gauges. A
    load that does not end is said every ``reload_timeout_s``, in ``STATUS=`` and in
    ``/metrics``, while the probes stay ready: the running config serves."""
    daemon: Daemon = start_daemon(
        env=notify.env(watchdog_usec=60_000_000),
        daemon_extra="reload_timeout_s = 0.5\nstatus_interval_s = 0.2",
    )
    notify.wait("READY=1")
    fifo = reload_onto_a_fifo(daemon, tmp_path)
    notify.wait("RELOADING=1")
    daemon.wait_event("reload_loading")
    first, second = (daemon.wait_event("reload_in_progress") for _ in range(2))
    assert first["stage"] == second["stage"] == "loading"
    assert 0.5 <= first["running_s"] < second["running_s"] and not second["deferred"]
    notify.wait("STATUS=running, reload loading for ")
    running = ("streamer_reload_in_progress_seconds", ())
    assert scrape(daemon)[running] >= 2 * 0.5  # it began before the second line was due
    assert get(daemon.http + "/readyz") == (
        200,
        {"ready": True, "status": "running", "reasons": []},
    )
    for _ in range(3):
        daemon.process.send_signal(signal.SIGHUP)
        deferred = daemon.wait_event("reload_deferred")
        assert deferred["stage"] == "loading" and deferred["running_s"] >= second["running_s"]
    assert daemon.wait_event("reload_in_progress")["deferred"]
    unblock_the_load(fifo, assets["blazeface_short_range"])
    daemon.wait_event("reloaded")
    notify.wait("READY=1")
    assert reload_gauges(daemon)[0] == 1
    assert scrape(daemon)[running] == 0
    # The deferred SIGHUPs' reload: the model's file changed after the load began (the FIFO
    # became the model), so it is loaded again rather than taken as the one in service.
    daemon.wait_event("reload_loading")
    daemon.wait_event("reloaded")
    notify.wait("READY=1")
    states = [text.split("\n")[0] for text in notify.texts()]  # RELOADING=1 has a stamp
    reloads = [state for state in states if state in ("RELOADING=1", "READY=1")]
    assert reloads == ["READY=1", *["RELOADING=1", "READY=1"] * 2]
    assert daemon.stop() == 0


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_a_stop_signal_while_the_daemon_starts_is_a_normal_stop(
    start_daemon: Any, notify: NotifySocket, signum: int
) -> None:
    """Sent at once, the signal comes while the libraries load, before the handlers are in
    place: it was a traceback (SIGINT), an exit by the signal (SIGTERM) or an onnxruntime
    that failed to initialise. It is held until the handlers are in place, then drains,
    without telling systemd it was ready first (it said READY=1, then STOPPING=1)."""
    daemon: Daemon = start_daemon(wait_ready=False, env=notify.env(watchdog_usec=60_000_000))
    wait_signals_held(daemon.process.pid, signum)
    daemon.process.send_signal(signum)
    assert daemon.stop(timeout_s=60) == 0
    final = daemon.final_counts()
    assert final["received"] == 0 and final["drained"] is True
    assert not [e for e in daemon.logs if "Traceback" in str(e)]
    notify.wait("STOPPING=1")
    assert "READY=1" not in [text.split("\n")[0] for text in notify.texts()]
    assert "ready" not in [e.get("event") for e in daemon.logs]


@pytest.mark.parametrize("delay_s", [0.05, 0.15, 0.3, 0.6])
def test_a_sigterm_at_any_moment_of_the_start_is_a_normal_stop(
    start_daemon: Any, delay_s: float
) -> None:
    """Once held, a SIGTERM is a clean stop whichever step of the start it comes in: the
    first read of the config, the libraries that ``run`` imports (onnxruntime, OpenCV,
    ZeroMQ), the models' load. (Before the hold, in the interpreter's own start, nothing the
    daemon does can catch it.)"""
    daemon: Daemon = start_daemon(wait_ready=False)
    wait_signals_held(daemon.process.pid, signal.SIGTERM)
    time.sleep(delay_s)
    daemon.process.send_signal(signal.SIGTERM)
    assert daemon.stop(timeout_s=60) == 0, daemon.logs[-20:]
    assert "stopped" in [e.get("event") for e in daemon.logs]
    assert not [e for e in daemon.logs if "Traceback" in str(e)]


def _field(status: Path, name: str) -> str:
    """A field of a /proc/PID/status file."""
    line = next(x for x in status.read_text().splitlines() if x.startswith(f"{name}:"))
    return line.split()[1]


def wait_signals_held(pid: int, *signums: int) -> None:
    """Wait until ``streamer run`` (process ``pid``) holds ``signums``: :mod:`streamer.entry`
    ran (Linux: read from ``/proc``)."""
    status, deadline = Path(f"/proc/{pid}/status"), time.monotonic() + 60
    wanted = sum(1 << (signum - 1) for signum in signums)
    while int(_field(status, "SigBlk"), 16) & wanted != wanted:
        assert time.monotonic() < deadline, "the daemon never held its signals"
        time.sleep(0.001)


def test_a_sighup_as_the_daemon_exits_does_not_end_it(start_daemon: Any) -> None:
    """After its last line, once the daemon no longer catches SIGHUP, SIGHUPs until it has
    ended: it exits 0. The interpreter, as it ended, put back the default action of the
    signals it had handlers for, and such a SIGHUP ended the daemon with "Hangup"."""
    daemon: Daemon = start_daemon()
    daemon.process.send_signal(signal.SIGTERM)
    daemon.wait_event("stopped")
    status, hangup = Path(f"/proc/{daemon.process.pid}/status"), 1 << (signal.SIGHUP - 1)
    while daemon.process.poll() is None:  # a zombie's status is there until it is reaped
        if not int(_field(status, "SigCgt"), 16) & hangup:  # its handler is gone
            daemon.process.send_signal(signal.SIGHUP)
    assert daemon.process.wait() == 0
    daemon.close()


def test_a_ctrl_c_while_a_command_imports_is_aborted_not_a_traceback() -> None:
    """``streamer check`` interrupted once its entry point runs, while it imports numpy,
    OpenCV and the rest (about a second): ``Aborted!`` and exit 1, as click ends an
    interrupted command, where a KeyboardInterrupt traceback from inside an import came.
    ``-X importtime`` says when the command line's import has begun."""
    config = str(ROOT / "configs" / "default.toml")
    process = subprocess.Popen(
        [sys.executable, "-X", "importtime", "-m", "streamer", "check", "--config", config],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    assert process.stderr is not None
    lines = iter(process.stderr)
    next(line for line in lines if line.rstrip().endswith(b"| streamer.entry"))
    next(lines)  # a module the command line imports: its import has begun
    process.send_signal(signal.SIGINT)
    err = process.stderr.read()
    process.stderr.close()
    assert process.wait(timeout=60) == 1, err.decode()[-2000:]
    assert b"Aborted!" in err and b"Traceback" not in err


@contextlib.contextmanager
def daemon_on_a_pipe(
    folder: Path, pipe_bytes: int | None = None
) -> Iterator[tuple[subprocess.Popen[bytes], Daemon]]:
    """``streamer run`` on the default config, its log on a pipe (of ``pipe_bytes``) that the
    test reads as it likes, once ready: the process, and its endpoints for a :class:`Client`."""
    path, in_port, out_port, _ = shipped_config("default.toml", folder)
    process = subprocess.Popen(
        [sys.executable, "-m", "streamer", "run", "--config", str(path)],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    assert process.stdout is not None
    try:
        if pipe_bytes is not None:
            fcntl.fcntl(process.stdout, fcntl.F_SETPIPE_SZ, pipe_bytes)
        while json.loads(process.stdout.readline())["event"] != "ready":
            pass
        endpoints = SimpleNamespace(
            ingress=f"tcp://127.0.0.1:{in_port}", egress=f"tcp://127.0.0.1:{out_port}"
        )
        yield process, cast(Daemon, endpoints)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
        process.stdout.close()


def test_a_log_reader_that_goes_away_does_not_stop_the_daemon(
    tmp_path: Path, assets: dict[str, Path], astronaut: np.ndarray
) -> None:
    """Standard output closed by its reader (a journal restart, `| head`): the daemon keeps
    serving without a log, and a SIGTERM still drains and exits 0."""
    with daemon_on_a_pipe(tmp_path) as (process, endpoints):
        assert process.stdout is not None
        process.stdout.close()  # the reader goes away; the next log line meets EPIPE
        Client(endpoints, astronaut).close()  # its probes' results: it serves
        process.send_signal(signal.SIGHUP)  # logs reload lines into the closed pipe
        Client(endpoints, astronaut).close()
        process.send_signal(signal.SIGTERM)
        assert process.wait(30) == 0


def test_a_log_reader_that_stops_reading_holds_no_thread_of_the_daemon(
    tmp_path: Path, assets: dict[str, Path], astronaut: np.ndarray
) -> None:
    """Standard output full (a stalled journal, a paused pager): reloads, serving and a
    SIGTERM's drain go on; only log lines wait, or are dropped."""
    with daemon_on_a_pipe(tmp_path, pipe_bytes=4096) as (process, endpoints):
        for _ in range(20):  # each logs lines that nobody reads: the pipe fills
            process.send_signal(signal.SIGHUP)
        Client(endpoints, astronaut).close()  # its probes' results: it serves
        process.send_signal(signal.SIGTERM)
        assert process.wait(30) == 0


def thread_policies(pid: int) -> list[int]:
    """The scheduling policy (sched(7) numbers) of each thread of ``pid``: field 41 of
    ``/proc/<pid>/task/<tid>/stat`` (proc(5))."""
    policies = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        fields = (task / "stat").read_text().rpartition(")")[2].split()
        policies.append(int(fields[41 - 3]))  # the fields after the name start at 3
    return policies


def started_under(start_daemon: Any, policy: int, setting: str) -> Daemon:
    """A daemon started from a thread under ``policy``, as ``chrt`` or a unit's
    ``CPUSchedulingPolicy=`` start it (a child takes its forking thread's policy)."""
    started: list[Daemon] = []

    def launch() -> None:
        os.sched_setscheduler(0, policy, os.sched_param(0))
        started.append(start_daemon(daemon_extra=setting, wait_ready=False))

    thread = threading.Thread(target=launch)
    thread.start()
    thread.join()
    started[0].wait_event("ready")
    return started[0]


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux policies")
@pytest.mark.parametrize(
    ("started", "setting", "policy", "log"),
    [
        ("other", "", os.SCHED_BATCH, ("info", "batch", "other")),
        ("other", 'cpu_scheduling_policy = "other"', 0, ("info", "other", "other")),
        ("batch", 'cpu_scheduling_policy = "inherit"', os.SCHED_BATCH, ("info", "batch", "batch")),
        ("batch", 'cpu_scheduling_policy = "other"', 0, ("warning", "other", "batch")),
    ],
)
def test_every_thread_of_the_daemon_runs_under_its_cpu_scheduling_policy(
    start_daemon: Any,
    connect: Any,
    astronaut: np.ndarray,
    started: str,
    setting: str,
    policy: int,
    log: tuple[str, str, str],
) -> None:
    under = os.SCHED_BATCH if started == "batch" else os.SCHED_OTHER
    daemon = started_under(start_daemon, under, setting)
    client: Client = connect(daemon)  # its JPEG probes start the worker pool's threads
    raw = np.ascontiguousarray(astronaut[:64, :64])
    client.send_parts(encode_frame("cam", 0, raw, encoding="raw"))
    assert len(client.collect(1)) == 1
    policies = thread_policies(daemon.process.pid)
    assert len(policies) > 10 and set(policies) == {policy}
    (said,) = [e for e in daemon.logs if e.get("event") == "cpu_scheduling_policy"]
    assert (said["level"], said["policy"], said["was"]) == log
    assert daemon.stop() == 0

"""The probes' answers, and the HTTP server that gives them, on a real loopback socket."""

from __future__ import annotations

import json
import socket
import struct
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest
from prometheus_client import CollectorRegistry, Counter
from structlog.testing import capture_logs

from streamer.errors import StreamerError
from streamer.lifecycle import Status
from streamer.observability.health import LOOP_STALE_S, HealthServer, HealthState
from streamer.observability.metrics import PipelineMetrics


def test_ready_only_while_running_unstalled_and_not_failed() -> None:
    health = HealthState()
    assert health.readiness(0.0) == (
        503,
        {"ready": False, "status": "initializing", "reasons": ["initializing: loading models"]},
    )
    health.set_status(Status.STARTING)
    assert health.readiness(0.0)[1]["reasons"] == ["starting: binding sockets"]
    health.set_status(Status.RUNNING)
    health.tick(1.0, stalled_for_s=0.0)
    assert health.readiness(1.0) == (200, {"ready": True, "status": "running", "reasons": []})
    health.tick(2.0, stalled_for_s=31.04)
    assert health.readiness(2.0)[1]["reasons"] == ["stalled: no frame completed for 31.0 s"]
    health.tick(3.0, stalled_for_s=0.0)
    health.set_failure("BackendError: 10 executions failed in a row")
    assert health.readiness(3.0)[1]["reasons"] == [
        "failed: BackendError: 10 executions failed in a row"
    ]
    health.set_status(Status.STOPPING)
    code, body = health.readiness(3.0)
    assert code == 503 and "stopping: draining frames in flight" in body["reasons"]


def test_alive_unless_the_running_control_loop_stopped_ticking() -> None:
    health = HealthState()
    assert health.liveness(1000.0)[0] == 200  # loading: no tick expected yet
    health.set_status(Status.RUNNING)
    health.tick(0.0, stalled_for_s=0.0)
    assert health.liveness(LOOP_STALE_S - 1) == (
        200,
        {"alive": True, "status": "running", "reasons": []},
    )
    code, body = health.liveness(LOOP_STALE_S + 1)
    assert code == 503 and body["reasons"] == [f"control loop has not run for {LOOP_STALE_S + 1} s"]
    assert health.readiness(LOOP_STALE_S + 1)[0] == 503
    health.set_status(Status.STOPPING)  # draining: the loop has ended
    assert health.liveness(LOOP_STALE_S + 1)[0] == 200


def get(url: str) -> tuple[int, str, str]:
    """Status, content type and body of a GET, error statuses included."""
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return response.status, response.headers["Content-Type"], response.read().decode()
    except urllib.error.HTTPError as error:
        with error:
            return error.code, error.headers["Content-Type"], error.read().decode()


@pytest.fixture
def server() -> Iterator[tuple[HealthServer, HealthState]]:
    registry = CollectorRegistry()
    Counter("demo_things", "Things.", registry=registry).inc(3)
    health = HealthState()
    server = HealthServer("127.0.0.1", 0, health, registry)
    server.launch(5)
    yield server, health
    server.stop()
    server.stop()  # idempotent


def test_the_endpoints(server: tuple[HealthServer, HealthState]) -> None:
    http, health = server
    base = f"http://127.0.0.1:{http.port}"
    code, kind, body = get(base + "/readyz")
    assert (code, kind) == (503, "application/json")
    assert json.loads(body)["status"] == "initializing"
    health.set_status(Status.RUNNING)
    health.tick(time.monotonic(), 0.0)
    assert json.loads(get(base + "/readyz?verbose=1")[2]) == {
        "ready": True,
        "status": "running",
        "reasons": [],
    }
    assert get(base + "/healthz")[0] == 200
    code, kind, body = get(base + "/metrics")
    assert code == 200 and kind.startswith("text/plain")
    assert "demo_things_total 3.0" in body
    code, _, body = get(base + "/nothing")
    assert code == 404 and json.loads(body)["paths"] == ["/healthz", "/readyz", "/metrics"]


def head(url: str) -> tuple[int, str, str, bytes]:
    """Status, content type, content length and body of a HEAD, error statuses included."""
    request = urllib.request.Request(url, method="HEAD")
    try:
        with urllib.request.urlopen(request, timeout=5) as response:
            headers, body = response.headers, response.read()
            return response.status, headers["Content-Type"], headers["Content-Length"], body
    except urllib.error.HTTPError as error:
        with error:
            headers, body = error.headers, error.read()
            return error.code, headers["Content-Type"], headers["Content-Length"], body


def test_head_answers_as_get_without_the_body(server: tuple[HealthServer, HealthState]) -> None:
    """A load balancer's health check may send HEAD: it got 501 (read as down)."""
    http, health = server
    base = f"http://127.0.0.1:{http.port}"
    assert head(base + "/readyz")[:2] == (503, "application/json")
    health.set_status(Status.RUNNING)
    health.tick(time.monotonic(), 0.0)
    for path in ("/healthz", "/readyz"):
        code, kind, length, body = head(base + path)
        assert (code, kind, body) == (200, "application/json", b"")
        assert int(length) == len(get(base + path)[2])
    code, kind, _, body = head(base + "/metrics")
    assert code == 200 and kind.startswith("text/plain") and body == b""
    assert head(base + "/nothing")[0] == 404
    assert "demo_things_total 3.0" in get(base + "/metrics")[2]  # GET still has its body


def test_a_name_filtered_scrape_has_the_process_series() -> None:
    """``name[]`` filters reach collectors that cannot name their series up front."""
    metrics = PipelineMetrics()
    server = HealthServer("127.0.0.1", 0, HealthState(), metrics.registry)
    server.launch(5)
    try:
        url = f"http://127.0.0.1:{server.port}/metrics?name[]=process_cpu_seconds_total"
        _, _, body = get(url)
    finally:
        server.stop()
    series = [line for line in body.splitlines() if not line.startswith("#")]
    assert len(series) == 1 and series[0].startswith("process_cpu_seconds_total ")


def test_a_client_trickling_its_request_does_not_hold_the_stop(
    server: tuple[HealthServer, HealthState],
) -> None:
    """Each header line within the request timeout kept a request thread alive, and the
    stop waited for it: up to 100 lines, minutes past systemd's TimeoutStopSec."""
    http, _ = server
    stopped = threading.Event()
    with socket.create_connection(("127.0.0.1", http.port)) as slow:
        slow.sendall(b"GET /metrics HTTP/1.1\r\n")
        deadline = time.monotonic() + 10
        while not any("process_request" in t.name for t in threading.enumerate()):
            assert time.monotonic() < deadline, "no request thread"  # reading the headers
            time.sleep(0.01)
        stopper = threading.Thread(target=lambda: (http.stop(), stopped.set()))
        stopper.start()
        for line in range(100):  # a line well within the 5 s timeout, until the stop ends
            if stopped.wait(1.0):
                break
            slow.sendall(f"X-Slow-{line}: 1\r\n".encode())
        assert stopped.is_set()
    stopper.join()


def test_an_address_in_use_fails_the_launch(server: tuple[HealthServer, HealthState]) -> None:
    http, health = server
    clash = HealthServer("127.0.0.1", http.port, health, CollectorRegistry())
    with pytest.raises(StreamerError) as info:
        clash.launch(5)
    clash.stop()
    assert f"cannot serve HTTP on 127.0.0.1:{http.port} (daemon.http_address)" in str(info.value)
    assert "Address already in use" in str(info.value)


def ipv6_loopback() -> bool:
    try:
        with socket.socket(socket.AF_INET6) as probe:
            probe.bind(("::1", 0))
    except OSError:
        return False
    return True


@pytest.mark.skipif(not ipv6_loopback(), reason="no IPv6 loopback here")
def test_an_ipv6_address() -> None:
    server = HealthServer("::1", 0, HealthState(), CollectorRegistry())
    server.launch(5)
    try:
        result: Any = get(f"http://[::1]:{server.port}/healthz")
    finally:
        server.stop()
    assert result[0] == 200


class _Broken:
    """A collector that fails every scrape."""

    def collect(self) -> Iterator[Any]:
        raise ValueError("collector broke")


def _request_threads_done() -> None:
    deadline = time.monotonic() + 10
    while any("process_request" in t.name for t in threading.enumerate()):
        assert time.monotonic() < deadline, "a request thread still runs"
        time.sleep(0.01)


def test_a_client_that_resets_or_a_failed_request_writes_no_traceback(
    server: tuple[HealthServer, HealthState], capsys: pytest.CaptureFixture[str]
) -> None:
    """A scrape whose client hung up (reset) put a 25-line traceback on standard error, past
    every log budget; a request that fails otherwise is a budgeted warning instead."""
    http, _ = server
    for _ in range(10):
        client = socket.create_connection(("127.0.0.1", http.port))
        client.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
        client.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        client.close()  # a reset, before the answer is written
    _request_threads_done()
    registry = CollectorRegistry()
    registry.register(_Broken())  # type: ignore[arg-type]
    broken = HealthServer("127.0.0.1", 0, HealthState(), registry)
    broken.launch(5)
    try:
        with capture_logs() as logs:
            for _ in range(12):
                with pytest.raises((urllib.error.URLError, ConnectionError)):
                    get(f"http://127.0.0.1:{broken.port}/metrics")
            _request_threads_done()
    finally:
        broken.stop()
    assert capsys.readouterr().err == ""
    failed = [e for e in logs if e["event"] == "http_request_failed"]
    assert 1 <= len(failed) <= 10
    assert failed[0]["error"] == "ValueError: collector broke"

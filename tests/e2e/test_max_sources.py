"""``daemon.max_sources`` through the real daemon: a new source beyond the cap fails as
``too_many_sources`` (its REQ producer hears so in its reply, its error result is published
and counted in ``/metrics``) while the tracked sources go on, and it is admitted once they
are forgotten."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import cv2
import numpy as np
import pytest
import zmq

from streamer.transport.protocol import encode_frame

from .conftest import Client, Daemon, free_port, metric_by_label

_TIMEOUT_MS = 10_000


@pytest.fixture
def req_socket() -> Iterator[Any]:
    """Makes a REQ socket connected to an address, with timeouts; closed at teardown."""
    context: zmq.Context[Any] = zmq.Context()
    made: list[zmq.Socket[Any]] = []

    def make(address: str) -> zmq.Socket[Any]:
        socket = context.socket(zmq.REQ)
        made.append(socket)
        socket.setsockopt(zmq.LINGER, 0)
        socket.setsockopt(zmq.RCVTIMEO, _TIMEOUT_MS)
        socket.setsockopt(zmq.SNDTIMEO, _TIMEOUT_MS)
        socket.connect(address)
        return socket

    yield make
    for socket in made:
        socket.close()
    context.term()


def wait_evicted(daemon: Daemon, sources: set[str]) -> None:
    """Wait for the ``source_evicted`` lines of ``sources``."""
    left = set(sources)
    while left:
        left.discard(daemon.wait_event("source_evicted")["source"])


def test_a_source_beyond_max_sources_fails_until_the_tracked_ones_are_forgotten(
    start_daemon: Any, connect: Any, req_socket: Any, astronaut: np.ndarray
) -> None:
    rep = free_port()
    daemon = start_daemon(
        daemon_extra="max_sources = 2\nsource_idle_s = 1.0",
        ingress_extra=f'\n[[ingress]]\nname = "rep"\nuri = "rep+bind:tcp://127.0.0.1:{rep}"\n',
    )
    client: Client = connect(daemon)
    wait_evicted(daemon, {"probe"})  # the harness's own source frees its place
    jpeg = cv2.imencode(".jpg", astronaut)[1].tobytes()
    # One REQ socket for the three: each frame is admitted or refused before its reply.
    req = req_socket(f"tcp://127.0.0.1:{rep}")
    replies: dict[str, list[dict[str, Any]]] = {"a": [], "b": [], "c": []}
    for seq in range(3):
        for source, got in replies.items():
            req.send_multipart(encode_frame(source, seq, jpeg, encoding="jpeg"))
            got.append(json.loads(req.recv()))
    assert all(r["ok"] for r in replies["a"] + replies["b"])
    assert [(r["ok"], r["seq"], r["reason"]) for r in replies["c"]] == [
        (False, seq, "too_many_sources") for seq in range(3)
    ]
    results = client.collect(9)
    assert sorted((r["source"], r["seq"]) for r in results if r["error"] is None) == [
        (source, seq) for source in ("a", "b") for seq in range(3)
    ]
    assert [(r["source"], r["seq"], r["error"]["reason"]) for r in results if r["error"]] == [
        ("c", seq, "too_many_sources") for seq in range(3)
    ]
    failed = metric_by_label(daemon, "streamer_frames_failed_total", "reason")
    assert failed["too_many_sources"] == 3
    wait_evicted(daemon, {"a", "b"})
    req.send_multipart(encode_frame("c", 3, jpeg, encoding="jpeg"))
    assert json.loads(req.recv()) == {"ok": True, "source": "c", "seq": 3}
    [admitted] = client.collect(1)
    assert (admitted["source"], admitted["seq"], admitted["error"]) == ("c", 3, None)
    assert len(admitted["detections"]) == 1
    assert daemon.stop() == 0
    final = daemon.final_counts()
    assert final["failed_by_reason"] == {"too_many_sources": 3}
    warnings = [e for e in daemon.logs if e.get("event") == "too_many_sources"]
    assert [(e["level"], e["source"], e["max_sources"]) for e in warnings] == [
        ("warning", "c", 2)
    ] * 3
    assert final["received"] == final["published"] + final["failed"] + final["dropped"]

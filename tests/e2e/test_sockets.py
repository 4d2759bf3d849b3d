"""Every producer a camera fleet has, through the real daemon: socket types, transports,
imagezmq senders (the imagezmq package itself), and CURVE-locked sockets.

Each daemon keeps the harness's plain PULL ingress and PUB egress (the synchronised
:class:`Client` uses them); the sockets under test are extra ``[[ingress]]`` (and
``[[egress]]``) tables appended to its config.
"""

from __future__ import annotations

import json
import socket as socket_module
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import cv2
import imagezmq
import numpy as np
import pytest
import zmq
import zmq.auth

from streamer.transport.protocol import DROPPED_DETAIL, encode_frame
from streamer.transport.security import write_key_pair

from .conftest import Client, Daemon, free_port

_TIMEOUT_MS = 10_000


def table(kind: str, **settings: Any) -> str:
    """A TOML ``[[kind]]`` table (values written as JSON, which TOML reads for these types)."""
    lines = [f"[[{kind}]]"] + [f"{key} = {json.dumps(value)}" for key, value in settings.items()]
    return "\n" + "\n".join(lines) + "\n"


def tcp(port: int) -> str:
    return f"tcp://127.0.0.1:{port}"


@pytest.fixture
def sockets() -> Iterator[Callable[..., zmq.Socket[Any]]]:
    """Test-side sockets on their own context, with timeouts; all closed at teardown."""
    context: zmq.Context[Any] = zmq.Context()
    made: list[zmq.Socket[Any]] = []

    def make(kind: int, connect: str | None = None, bind: str | None = None) -> zmq.Socket[Any]:
        socket = context.socket(kind)
        made.append(socket)
        socket.setsockopt(zmq.LINGER, 0)
        socket.setsockopt(zmq.RCVTIMEO, _TIMEOUT_MS)
        socket.setsockopt(zmq.SNDTIMEO, _TIMEOUT_MS)
        if bind is not None:
            socket.bind(bind)
        if connect is not None:
            socket.connect(connect)
        return socket

    yield make
    for socket in made:
        socket.close()
    context.term()


@pytest.fixture(scope="module")
def jpeg(astronaut: np.ndarray) -> bytes:
    """skimage's astronaut (512x512, one face) as JPEG."""
    return cv2.imencode(".jpg", astronaut)[1].tobytes()


def by_source(results: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    grouped: dict[str, list[dict[str, Any]]] = {}
    for result in results:
        grouped.setdefault(result["source"], []).append(result)
    return grouped


def assert_accounted(daemon: Daemon) -> dict[str, Any]:
    assert daemon.stop() == 0
    final = daemon.final_counts()
    assert final["received"] == final["published"] + final["failed"] + final["dropped"]
    return final


def test_rep_router_and_ipc(
    start_daemon: Any, connect: Any, sockets: Any, jpeg: bytes, tmp_path: Path
) -> None:
    rep, router, ipc = free_port(), free_port(), f"ipc://{tmp_path}/frames.ipc"
    daemon = start_daemon(
        ingress_extra=table("ingress", name="rep", uri=f"rep+bind:{tcp(rep)}")
        + table("ingress", name="router", uri=f"router+bind:{tcp(router)}")
        + table("ingress", name="ipc", uri=f"pull+bind:{ipc}")
    )
    client: Client = connect(daemon)
    req = sockets(zmq.REQ, connect=tcp(rep))
    req.send_multipart(encode_frame("via-rep", 0, jpeg, encoding="jpeg"))
    assert json.loads(req.recv()) == {"ok": True, "source": "via-rep", "seq": 0}
    req.send_multipart([b'{"v": 1, "source": "via-rep", "seq": 1}', jpeg])
    refused = json.loads(req.recv())
    assert (refused["ok"], refused["reason"], refused["seq"]) == (False, "bad_header", 1)
    req.send_multipart(encode_frame("via-rep", 1, jpeg, encoding="jpeg"))  # behind: no result
    assert json.loads(req.recv()) == {
        "ok": False,
        "source": "via-rep",
        "seq": 1,
        "reason": "stale_seq",
        "detail": DROPPED_DETAIL,
        "dropped": True,
    }
    dealer = sockets(zmq.DEALER, connect=tcp(router))
    dealer.send_multipart(encode_frame("via-router", 0, jpeg, encoding="jpeg"))
    assert json.loads(dealer.recv())["source"] == "via-router"
    sockets(zmq.PUSH, connect=ipc).send_multipart(encode_frame("via-ipc", 0, jpeg, encoding="jpeg"))
    results = by_source(client.collect(4))
    assert [r["error"]["reason"] for r in results["via-rep"] if r["error"]] == ["bad_header"]
    good = [results["via-router"][0], results["via-ipc"][0]]
    good += [r for r in results["via-rep"] if not r["error"]]
    assert len(good) == 3 and all(len(r["detections"]) == 1 for r in good)
    final = assert_accounted(daemon)
    assert final["received"] == 5 + client.probes
    assert final["dropped_by_reason"] == {"stale_seq": 1}


def test_ipc_socket_files_are_removed_at_a_clean_stop(
    start_daemon: Any, connect: Any, sockets: Any, jpeg: bytes, tmp_path: Path
) -> None:
    """libzmq leaves a bound ipc path's file behind when the socket closes: after a clean
    stop it read as a daemon still there. A stale one (a crash) still does not stop a start."""
    frames, results = tmp_path / "frames.ipc", tmp_path / "results.ipc"
    with socket_module.socket(socket_module.AF_UNIX, socket_module.SOCK_STREAM) as crashed:
        crashed.bind(str(frames))  # a file nothing listens on, as a killed daemon leaves
    daemon = start_daemon(
        ingress_extra=table("ingress", name="ipc", uri=f"pull+bind:ipc://{frames}")
        + table("egress", name="ipc", uri=f"pub+bind:ipc://{results}")
    )
    client: Client = connect(daemon)
    sub = sockets(zmq.SUB, connect=f"ipc://{results}")
    sub.setsockopt(zmq.SUBSCRIBE, b"via-ipc")
    time.sleep(0.5)  # the subscription reaches the daemon's PUB
    sockets(zmq.PUSH, connect=f"ipc://{frames}").send_multipart(
        encode_frame("via-ipc", 0, jpeg, encoding="jpeg")
    )
    assert client.collect(1)[0]["source"] == "via-ipc"
    assert json.loads(sub.recv_multipart()[1])["source"] == "via-ipc"
    assert frames.is_socket() and results.is_socket()
    assert_accounted(daemon)
    assert not frames.exists() and not results.exists()


def test_sub_connects_out_and_takes_only_its_topics(
    start_daemon: Any, connect: Any, sockets: Any, jpeg: bytes
) -> None:
    port = free_port()
    pub = sockets(zmq.PUB, bind=tcp(port))
    daemon = start_daemon(
        ingress_extra=table("ingress", name="cams", uri=f"sub+connect:{tcp(port)}", topics=["cam1"])
    )
    client: Client = connect(daemon)
    seq = 0
    while not client.collect(1, timeout_s=0.2):  # until the subscription reached the PUB
        pub.send_multipart([b"cam1", *encode_frame("cam1", seq, jpeg, encoding="jpeg")])
        seq += 1
    client.collect(seq, timeout_s=1.0)
    pub.send_multipart([b"cam10", *encode_frame("cam10", 0, jpeg, encoding="jpeg")])
    pub.send_multipart([b"cam1", *encode_frame("cam1", seq, jpeg, encoding="jpeg")])
    results = client.collect(2, timeout_s=1.5)
    assert [(r["source"], r["seq"]) for r in results] == [("cam1", seq)]
    final = assert_accounted(daemon)
    assert final["received"] == seq + 1 + client.probes  # cam10 was not counted


def _sender(address: str, **options: Any) -> imagezmq.ImageSender:
    sender = imagezmq.ImageSender(connect_to=address, **options)
    sender.zmq_socket.setsockopt(zmq.LINGER, 0)
    sender.zmq_socket.setsockopt(zmq.RCVTIMEO, _TIMEOUT_MS)  # a safety net, not a change
    return sender


def test_imagezmq_senders_unchanged(
    start_daemon: Any, connect: Any, astronaut: np.ndarray, jpeg: bytes
) -> None:
    rep, porch, pubs = free_port(), free_port(), [free_port(), free_port()]
    senders = [_sender(tcp(port), REQ_REP=False) for port in pubs]  # PUB senders bind
    try:
        daemon = start_daemon(
            ingress_extra=table(
                "ingress", name="hub", uri=f"rep+bind:{tcp(rep)}", protocol="imagezmq"
            )
            + table(
                "ingress",
                name="porch",
                uri=f"rep+bind:{tcp(porch)}",
                protocol="imagezmq",
                source="porch",
            )
            + table(
                "ingress",
                name="pubs",
                uri=[f"sub+connect:{tcp(port)}" for port in pubs],
                protocol="imagezmq",
            )
        )
        client: Client = connect(daemon)
        _req_rep(client, rep, porch, astronaut, jpeg)
        _pub_sub(client, senders, jpeg)
    finally:
        for sender in senders:
            sender.close()
    assert_accounted(daemon)


def _req_rep(client: Client, rep: int, porch: int, astronaut: np.ndarray, jpeg: bytes) -> None:
    sender, fixed = _sender(tcp(rep)), _sender(tcp(porch))
    try:
        assert sender.send_image("rpi-1", astronaut) == b"OK"
        assert sender.send_jpg("rpi-1", jpeg) == b"OK"
        reply = sender.send_image("rpi-1", astronaut.astype(np.float32))
        assert reply.startswith(b"ERROR unsupported_dtype: raw dtype 'float32'")
        assert fixed.send_jpg("front door 12:00", jpeg) == b"OK"
    finally:
        sender.close()
        fixed.close()
    results = by_source(client.collect(4))
    # A frame refused at the ingress keeps its place in its source's order.
    first, second, third = results["rpi-1"]
    assert [r["seq"] for r in (first, second, third)] == [0, 1, 2]
    assert all(len(r["detections"]) == 1 and r["width"] == 512 for r in (first, second))
    assert third["error"]["reason"] == "unsupported_dtype"
    assert results["porch"][0]["meta"] == {"msg": "front door 12:00"}
    assert len(results["porch"][0]["detections"]) == 1


def _pub_sub(client: Client, senders: list[imagezmq.ImageSender], jpeg: bytes) -> None:
    seen: dict[str, list[int]] = {"cam-a": [], "cam-b": []}
    deadline = time.monotonic() + 20
    while not all(seen.values()) and time.monotonic() < deadline:
        for sender, name in zip(senders, seen, strict=True):
            sender.send_jpg(name, jpeg)
        for result in client.collect(2, timeout_s=0.2):
            assert result["error"] is None and len(result["detections"]) == 1
            seen[result["source"]].append(result["seq"])
    assert all(seen.values()), seen
    assert all(seqs == list(range(seqs[0], seqs[0] + len(seqs))) for seqs in seen.values())


def test_an_imagezmq_message_without_metadata_keeps_the_fixed_source(
    start_daemon: Any, connect: Any, sockets: Any, jpeg: bytes
) -> None:
    """With ``source`` fixed, the error result of a message whose metadata is not JSON is
    that source's, numbered in arrival order: its subscribers see it where they look."""
    porch = free_port()
    daemon = start_daemon(
        ingress_extra=table(
            "ingress",
            name="porch",
            uri=f"rep+bind:{tcp(porch)}",
            protocol="imagezmq",
            source="porch",
        )
    )
    client: Client = connect(daemon)
    sender = sockets(zmq.REQ, connect=tcp(porch))
    for parts in ([b"not json", jpeg], [b'{"msg": "front door"}', jpeg]):
        sender.send_multipart(parts)
        sender.recv()
    first, second = client.collect(2)
    assert (first["source"], first["seq"], first["error"]["reason"]) == ("porch", 0, "bad_header")
    assert (second["source"], second["seq"], second["error"]) == ("porch", 1, None)
    assert_accounted(daemon)


@pytest.fixture
def keys(tmp_path: Path) -> dict[str, Path]:
    """Server pair; ``camera`` and ``viewer`` allowed; ``stranger`` not."""
    for folder, name in [("server", "server"), ("clients", "camera"), ("clients", "viewer")]:
        write_key_pair(tmp_path / folder, name)
    write_key_pair(tmp_path / "strangers", "stranger")
    return {
        "server": tmp_path / "server" / "server.key_secret",
        "clients": tmp_path / "clients",
        "camera": tmp_path / "clients" / "camera.key_secret",
        "viewer": tmp_path / "clients" / "viewer.key_secret",
        "stranger": tmp_path / "strangers" / "stranger.key_secret",
    }


def _curve_client(
    make: Any, kind: int, address: str, pair: Path | None, server: Path
) -> zmq.Socket[Any]:
    """A client socket with the key ``pair`` (None: no CURVE) for the daemon's ``server``."""
    socket = make(kind)
    if kind == zmq.SUB:
        socket.setsockopt(zmq.SUBSCRIBE, b"")
    if pair is not None:
        socket.curve_publickey, socket.curve_secretkey = zmq.auth.load_certificate(pair)
        socket.curve_serverkey = zmq.auth.load_certificate(server)[0]
    socket.connect(address)
    return socket


def _refusals_logged(daemon: Daemon) -> bool:
    """The stranger's key was denied, and a handshake failed on each CURVE socket."""
    events = [entry.get("event") for entry in list(daemon.logs)]
    failed = {e["socket"] for e in list(daemon.logs) if e.get("event") == "curve_handshake_failed"}
    return "curve_client_denied" in events and failed == {"ingress locked", "egress locked"}


def test_curve_lets_in_only_allowed_clients(
    start_daemon: Any, connect: Any, sockets: Any, keys: dict[str, Path], jpeg: bytes
) -> None:
    ingress, egress = free_port(), free_port()
    curve = {
        "curve_secret_key_file": str(keys["server"]),
        "curve_clients_dir": str(keys["clients"]),
    }
    daemon = start_daemon(
        ingress_extra=table("ingress", name="locked", uri=f"pull+bind:{tcp(ingress)}", **curve)
        + table("egress", name="locked", uri=f"pub+bind:{tcp(egress)}", **curve)
    )
    client: Client = connect(daemon)
    server = keys["server"]
    viewer = _curve_client(sockets, zmq.SUB, tcp(egress), keys["viewer"], server)
    peeker = _curve_client(sockets, zmq.SUB, tcp(egress), None, server)
    camera = _curve_client(sockets, zmq.PUSH, tcp(ingress), keys["camera"], server)
    intruders = [
        _curve_client(sockets, zmq.PUSH, tcp(ingress), keys["stranger"], server),
        _curve_client(sockets, zmq.PUSH, tcp(ingress), None, server),
    ]
    for index, intruder in enumerate(intruders):
        intruder.send_multipart(encode_frame(f"intruder{index}", 0, jpeg, encoding="jpeg"))
    seq = 0
    while not viewer.poll(200):  # until the viewer's subscription reached the daemon
        camera.send_multipart(encode_frame("camera", seq, jpeg, encoding="jpeg"))
        seq += 1
    deadline = time.monotonic() + 30
    while not _refusals_logged(daemon):  # not a fixed sleep: a loaded machine outlasts it
        assert time.monotonic() < deadline, daemon.logs[-20:]
        time.sleep(0.05)
    time.sleep(0.5)  # the refused intruders retry their handshakes meanwhile
    sources = {json.loads(part[1])["source"] for part in _all(viewer)}
    plain = {r["source"] for r in client.collect(seq + 2, timeout_s=1.0)}
    assert sources == plain == {"camera"}
    assert not peeker.poll(100)
    final = assert_accounted(daemon)
    assert final["received"] == seq + client.probes
    events = [entry["event"] for entry in daemon.logs]
    assert events.count("curve_client_denied") == 1
    failed = [
        (e["socket"], e["error"]) for e in daemon.logs if e["event"] == "curve_handshake_failed"
    ]
    assert len(failed) == len(set(failed))  # once per kind of failure
    assert {socket for socket, _ in failed} == {"ingress locked", "egress locked"}


def test_the_client_tools_speak_curve(
    start_daemon: Any, keys: dict[str, Path], tmp_path: Path
) -> None:
    """produce.py and subscribe.py had no CURVE options: against a locked daemon the producer
    said no daemon was connected, and the subscriber received nothing. A producer the daemon
    refuses (a key not allowed, or no CURVE) was told no daemon was connected as well."""
    ingress, egress = free_port(), free_port()
    curve = {
        "curve_secret_key_file": str(keys["server"]),
        "curve_clients_dir": str(keys["clients"]),
    }
    start_daemon(
        ingress_extra=table("ingress", name="locked", uri=f"pull+bind:{tcp(ingress)}", **curve)
        + table("egress", name="locked", uri=f"pub+bind:{tcp(egress)}", **curve)
    )
    server_key = keys["server"].with_suffix(".key")  # the public file a client is given
    tools = Path(__file__).resolve().parents[2] / "tools"

    def keys_of(name: str) -> list[str]:
        return ["--curve-server-key", str(server_key), "--curve-secret-key", str(keys[name])]

    log = tmp_path / "subscribe.log"
    with log.open("wb") as stderr:
        subscriber = subprocess.Popen(
            [sys.executable, str(tools / "subscribe.py"), "--endpoint", tcp(egress), "--quiet"]
            + ["--expect-eos", "door", "--idle-timeout", "60", *keys_of("viewer")],
            stdout=subprocess.PIPE,
            stderr=stderr,
        )
        deadline = time.monotonic() + 60
        while b"subscribed to" not in log.read_bytes():
            assert time.monotonic() < deadline and subscriber.poll() is None, log.read_text()
            time.sleep(0.05)
        produce = [sys.executable, str(tools / "produce.py"), "astronaut.png", "--no-progress"]
        produce += ["--endpoint", tcp(ingress), "--source", "door", "--loop", "3"]
        sent = subprocess.run([*produce, *keys_of("camera")], capture_output=True, timeout=120)
        assert sent.returncode == 0, sent.stderr
        out, _ = subscriber.communicate(timeout=60)
    assert subscriber.returncode == 0, log.read_text()
    assert json.loads(out)["per_source"] == {"door": 3}
    refused = subprocess.run(
        [*produce, "--send-timeout", "1", *keys_of("stranger")], capture_output=True, timeout=120
    )
    assert refused.returncode == 1 and b"refused the connection's security handshake" in (
        refused.stderr
    )
    plain = subprocess.run([*produce, "--send-timeout", "1"], capture_output=True, timeout=120)
    assert plain.returncode == 1 and b"handshake (HANDSHAKE_FAILED_" in plain.stderr
    half = subprocess.run(
        [*produce, "--curve-server-key", str(server_key)], capture_output=True, timeout=120
    )
    assert half.returncode == 2 and b"go together" in half.stderr


def _all(socket: zmq.Socket[Any]) -> list[list[bytes]]:
    messages = []
    while socket.poll(300):
        messages.append(socket.recv_multipart())
    return messages


def test_a_port_zeromq_chooses_is_logged(
    start_daemon: Any, connect: Any, sockets: Any, jpeg: bytes
) -> None:
    """`ingress_ready` and `egress_ready` said `tcp://127.0.0.1:*`: the port a `*` bind got
    was nowhere to be found, so no producer or subscriber could be pointed at it."""
    daemon = start_daemon(
        ingress_extra=table("ingress", name="any", uri="pull+bind:tcp://127.0.0.1:*")
        + table("egress", name="anyout", uri="push+bind:tcp://127.0.0.1:*")
    )
    ready = {
        e.get("ingress", e.get("egress")): e["endpoint"] for e in daemon.logs if "endpoint" in e
    }
    pull_uri, push_uri = ready["any"], ready["anyout"]
    assert pull_uri.startswith("pull+bind:tcp://127.0.0.1:") and not pull_uri.endswith("*")
    assert push_uri.startswith("push+bind:tcp://127.0.0.1:") and not push_uri.endswith("*")
    reader = sockets(zmq.PULL, connect=push_uri.partition(":")[2])
    client: Client = connect(daemon)
    sockets(zmq.PUSH, connect=pull_uri.partition(":")[2]).send_multipart(
        encode_frame("via-any", 0, jpeg, encoding="jpeg")
    )
    assert [r["source"] for r in client.collect(1)] == ["via-any"]
    pushed = [json.loads(reader.recv_multipart()[-1])["source"] for _ in range(client.probes + 1)]
    assert "via-any" in pushed  # after the probes that reached it, if any
    assert_accounted(daemon)

"""CURVE on real loopback sockets: key files, the authenticator, denial logs, fail-closed."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import zmq
import zmq.auth
from click.testing import CliRunner
from structlog.testing import capture_logs

from streamer.cli import main
from streamer.config import EgressConfig, IngressConfig
from streamer.errors import ClientError, ConfigError
from streamer.transport.security import (
    CurveClient,
    CurveServer,
    HandshakeMonitor,
    check_curve_keys,
    start_authenticator,
    write_key_pair,
)


@pytest.fixture
def keys(tmp_path: Path) -> dict[str, Path]:
    """A server pair; clients ``ok`` (allowed) and ``stranger`` (not)."""
    write_key_pair(tmp_path / "server", "server")
    write_key_pair(tmp_path / "clients", "ok")
    write_key_pair(tmp_path / "others", "stranger")
    return {
        "secret": tmp_path / "server" / "server.key_secret",
        "public": tmp_path / "server" / "server.key",
        "clients": tmp_path / "clients",
        "ok": tmp_path / "clients" / "ok.key_secret",
        "stranger": tmp_path / "others" / "stranger.key_secret",
    }


@pytest.fixture
def context() -> Iterator[zmq.Context[Any]]:
    ctx: zmq.Context[Any] = zmq.Context()
    yield ctx
    ctx.term()


def _address() -> str:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return f"tcp://127.0.0.1:{probe.getsockname()[1]}"


def _config(keys: dict[str, Path]) -> IngressConfig:
    return IngressConfig(
        uri="pull+bind:tcp://127.0.0.1:1",
        curve_secret_key_file=keys["secret"],
        curve_clients_dir=keys["clients"],
    )


def _client(context: zmq.Context[Any], address: str, pair: Path | None, server: Path) -> Any:
    push = context.socket(zmq.PUSH)
    push.setsockopt(zmq.LINGER, 0)
    if pair is not None:
        CurveClient.from_files(server, pair).apply(push)
    push.connect(address)
    return push


def _messages(pull: zmq.Socket[Any], first_wait_ms: int) -> list[bytes]:
    """Everything ``pull`` receives until it has been idle for 100 ms (first: longer)."""
    received: list[bytes] = []
    while pull.poll(first_wait_ms if not received else 100):
        received.append(pull.recv())
    return received


def test_key_pair_files(keys: dict[str, Path]) -> None:
    assert keys["secret"].stat().st_mode & 0o777 == 0o600
    with pytest.raises(FileExistsError):
        write_key_pair(keys["secret"].parent, "server")
    server = CurveServer.from_config(_config(keys), "ingress x")
    assert server is not None and len(server.public_key) == len(server.secret_key) == 40
    assert CurveServer.from_config(IngressConfig(uri="pull+bind:tcp://x:1"), "x") is None


def test_a_public_key_file_is_no_server_key(keys: dict[str, Path]) -> None:
    config = _config(keys).model_copy(update={"curve_secret_key_file": keys["public"]})
    with pytest.raises(ConfigError, match="ingress x: .*no secret key"):
        CurveServer.from_config(config, "ingress x")


@pytest.mark.parametrize("config_class", [IngressConfig, EgressConfig])
def test_curve_settings_come_in_pairs(config_class: Any, keys: dict[str, Path]) -> None:
    with pytest.raises(ValueError, match="curve_clients_dir"):
        config_class(uri="pub+bind:tcp://x:1", curve_secret_key_file=keys["secret"])


def test_only_allowed_clients_get_through_and_others_are_logged_once(
    context: zmq.Context[Any], keys: dict[str, Path]
) -> None:
    address = _address()
    authenticator = start_authenticator(context, [_config(keys)])
    assert authenticator is not None
    server = CurveServer.from_config(_config(keys), "ingress x")
    assert server is not None
    pull = context.socket(zmq.PULL)
    pull.setsockopt(zmq.LINGER, 0)
    server.apply(pull)
    monitor = HandshakeMonitor(pull, "ingress x")
    pull.bind(address)
    clients: list[zmq.Socket[Any]] = []
    try:
        with capture_logs() as logs:  # before connecting: handshakes start on connect
            for name in ("stranger", "stranger", "ok", None):  # None: no CURVE at all
                pair = keys[name] if name else None
                clients.append(_client(context, address, pair, keys["public"]))
            for index, client in enumerate(clients):
                client.send(str(index).encode())
            received = _messages(pull, first_wait_ms=5000)
            time.sleep(0.5)  # refused clients retry their handshakes meanwhile
            received += _messages(pull, first_wait_ms=100)
            monitor.drain()
    finally:
        for client in clients:
            client.close()
        monitor.close()
        pull.close()
        authenticator.stop()
    assert received == [b"2"]
    events = [e["event"] for e in logs]
    assert events.count("curve_client_denied") == 1
    # The plain client retried; each kind of failure (a mechanism mismatch, or the socket
    # error the server sees when the client noticed the mismatch first) is logged once.
    failed = [e["error"] for e in logs if e["event"] == "curve_handshake_failed"]
    assert failed and len(failed) == len(set(failed))
    mismatch = ("PROTOCOL_ERROR_ZMTP_MECHANISM_MISMATCH", "the peer hung up mid-handshake")
    assert all(any(cause in error for cause in mismatch) for error in failed), failed


def test_without_an_authenticator_a_curve_socket_admits_nobody(
    context: zmq.Context[Any], keys: dict[str, Path]
) -> None:
    address = _address()
    server = CurveServer.from_config(_config(keys), "ingress x")
    assert server is not None
    pull = context.socket(zmq.PULL)
    pull.setsockopt(zmq.LINGER, 0)
    server.apply(pull)
    pull.bind(address)
    client = _client(context, address, keys["ok"], keys["public"])
    try:
        client.send(b"x")
        assert not pull.poll(500)
    finally:
        client.close()
        pull.close()


def test_a_client_needs_its_secret_key_and_well_formed_key_files(
    keys: dict[str, Path], tmp_path: Path
) -> None:
    client = CurveClient.from_files(keys["public"], keys["ok"])
    assert len(client.public_key) == len(client.secret_key) == len(client.server_key) == 40
    assert CurveClient.from_files(keys["secret"], keys["ok"]).server_key == client.server_key
    public_only = keys["ok"].with_suffix(".key")
    with pytest.raises(ClientError, match=f"{public_only} holds no secret key"):
        CurveClient.from_files(keys["public"], public_only)
    garbage = tmp_path / "garbage.key"
    garbage.write_text('curve\n    public-key = "not a key"\n')
    missing = tmp_path / "missing.key"
    for bad in (garbage, missing):
        with pytest.raises(ClientError, match=f"CURVE key file {bad}"):
            CurveClient.from_files(bad, keys["ok"])


def test_no_curve_socket_no_authenticator(context: zmq.Context[Any]) -> None:
    assert start_authenticator(context, [IngressConfig(uri="pull+bind:tcp://x:1")]) is None


def test_malformed_key_files_are_config_errors(
    context: zmq.Context[Any], keys: dict[str, Path], tmp_path: Path
) -> None:
    bad = tmp_path / "bad.key_secret"
    bad.write_text("not a key\n")
    config = _config(keys).model_copy(update={"curve_secret_key_file": bad})
    with pytest.raises(ConfigError, match="ingress x: .*No public key"):
        CurveServer.from_config(config, "ingress x")
    (keys["clients"] / "broken.key").write_text("not a key\n")
    with pytest.raises(ConfigError, match="curve_clients_dir"):
        start_authenticator(context, [_config(keys)])


SHORT_KEYS = 'public-key = "short"\nsecret-key = "short"\n'
NOT_Z85 = f'public-key = "{"~" * 40}"\nsecret-key = "{"~" * 40}"\n'


@pytest.mark.parametrize("content", ["", "not a key\n", "public", SHORT_KEYS, NOT_Z85])
def test_streamer_check_refuses_a_bad_server_key_file(
    keys: dict[str, Path], tmp_path: Path, content: str
) -> None:
    """Found by ``check`` (exit 2, the unit's RestartPreventExitStatus), not at start (exit
    1: systemd restarted the daemon every 5 s, forever)."""
    bad = keys["public"] if content == "public" else tmp_path / "bad.key_secret"
    if content != "public":
        bad.write_text(content)
    config = tmp_path / "c.toml"
    config.write_text(
        f'[[ingress]]\nuri = "pull+bind:tcp://127.0.0.1:5555"\n'
        f'curve_secret_key_file = "{bad}"\ncurve_clients_dir = "{keys["clients"]}"\n'
        '[[egress]]\nuri = "pub+bind:tcp://127.0.0.1:5556"\n'
        '[[models]]\nname = "face"\npath = "missing.onnx"\n'
        'preprocess = { kind = "letterbox" }\npostprocess = { kind = "blazeface" }\n'
    )
    result = CliRunner().invoke(main, ["check", "--config", str(config)])
    assert result.exit_code == 2, result.output
    assert f"ingress ingress: curve_secret_key_file {bad}" in result.output


def test_check_curve_keys_reads_the_clients_dir_of_each_socket(keys: dict[str, Path]) -> None:
    check_curve_keys([_config(keys)], [])
    (keys["clients"] / "short.key").write_text('public-key = "short"\n')
    with pytest.raises(ConfigError, match=r"not a CURVE key .*\['short'\]"):
        check_curve_keys([_config(keys)], [])
    (keys["clients"] / "short.key").unlink()
    (keys["clients"] / "broken.key").write_text("not a key\n")
    egress = EgressConfig(
        name="out",
        uri="pub+bind:tcp://127.0.0.1:1",
        curve_secret_key_file=keys["secret"],
        curve_clients_dir=keys["clients"],
    )
    with pytest.raises(ConfigError, match="egress out: curve_clients_dir .*clients"):
        check_curve_keys([], [egress])


def test_a_clients_dir_key_that_is_no_regular_file_is_a_config_error(
    keys: dict[str, Path],
) -> None:
    """A FIFO named ``*.key`` in ``curve_clients_dir``: ``check`` and ``run`` blocked forever
    reading it (and a link to /dev/zero was read until the memory ran out)."""
    fifo = keys["clients"] / "pipe.key"
    os.mkfifo(fifo)
    outcome: list[BaseException | None] = []

    def read() -> None:
        try:
            check_curve_keys([_config(keys)], [])
            outcome.append(None)
        except Exception as exc:
            outcome.append(exc)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    reader.join(10)
    if reader.is_alive():  # blocked on the FIFO: an empty write end lets it go
        os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
        reader.join(10)
    assert outcome and isinstance(outcome[0], ConfigError), outcome
    assert "not regular files: ['pipe.key']" in str(outcome[0])


def test_keygen_tool(tmp_path: Path) -> None:
    tool = Path(__file__).resolve().parents[3] / "tools" / "keygen.py"
    run = [sys.executable, str(tool), str(tmp_path), "cam1", "viewer"]
    made = subprocess.run(run, capture_output=True, text=True, timeout=60)
    assert made.returncode == 0, made.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "cam1.key",
        "cam1.key_secret",
        "viewer.key",
        "viewer.key_secret",
    ]
    again = subprocess.run(run, capture_output=True, text=True, timeout=60)
    assert again.returncode == 1 and "--force" in again.stderr
    forced = subprocess.run([*run, "--force"], capture_output=True, text=True, timeout=60)
    assert forced.returncode == 0, forced.stderr


def test_a_flood_of_failed_handshakes_between_drains_stops_no_socket_of_the_context(
    context: zmq.Context[Any], keys: dict[str, Path]
) -> None:
    """libzmq sends a monitor's events from the context's I/O thread and waits while their
    queue is full (1000 messages by default). The daemon drains its monitors every 100 ms
    at most (the ingress thread, when a full queue does not hold it): a flood of failed
    handshakes in between stopped every socket of its context, ingress and egress alike."""
    address, plain_address = _address(), _address()
    server = CurveServer.from_config(_config(keys), "ingress x")
    assert server is not None
    pull, plain = context.socket(zmq.PULL), context.socket(zmq.PULL)
    server.apply(pull)
    monitor = HandshakeMonitor(pull, "ingress x")
    pull.bind(address)
    plain.bind(plain_address)
    flooding: zmq.Context[Any] = zmq.Context()
    flooding.setsockopt(zmq.RECONNECT_IVL, 1)
    client = flooding.socket(zmq.PUSH)  # another server key: refused, and retried
    CurveClient(*zmq.curve_keypair(), zmq.curve_keypair()[0]).apply(client)
    client_failures = client.get_monitor_socket(zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL)
    client.connect(address)
    sender = _client(flooding, plain_address, None, keys["public"])
    try:
        deadline = time.monotonic() + 60
        for seen in range(2100):  # more than the monitor's default queue holds, undrained
            wait_ms = max(0, int((deadline - time.monotonic()) * 1000))
            assert client_failures.poll(wait_ms), f"the client stopped retrying after {seen}"
            client_failures.recv_multipart()
        sender.send(b"still moving")
        assert plain.poll(5000), "the context's I/O thread waits on a full monitor"
        assert plain.recv() == b"still moving"
        with capture_logs() as logs:
            monitor.drain()
        monitor.close()
    finally:
        client.disable_monitor()
        for sock in (client_failures, client, sender):
            sock.close(linger=0)
        flooding.term()
        pull.close(linger=0)
        plain.close(linger=0)
    assert [e["event"] for e in logs] == ["curve_handshake_failed"] * len(logs) and logs

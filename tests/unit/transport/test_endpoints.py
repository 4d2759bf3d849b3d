import errno
import os
import re
import socket as sockets
from pathlib import Path

import pytest
import zmq

from streamer.config import EgressConfig, IngressConfig
from streamer.errors import ConfigError
from streamer.transport.endpoints import (
    EGRESS_TYPES,
    INGRESS_TYPES,
    IpcFile,
    check_binds_here,
    check_endpoints,
    parse_endpoint,
    parse_endpoints,
)


def test_parse_bind_and_connect() -> None:
    endpoint = parse_endpoint("pull+bind:tcp://127.0.0.1:5555", INGRESS_TYPES, "ingress[0].uri")
    assert (endpoint.kind, endpoint.bind, endpoint.address) == (
        "pull",
        True,
        "tcp://127.0.0.1:5555",
    )
    assert endpoint.socket_type == zmq.PULL
    assert str(endpoint) == "pull+bind:tcp://127.0.0.1:5555"
    endpoint = parse_endpoint("pub+connect:ipc:///tmp/results", EGRESS_TYPES, "egress[0].uri")
    assert not endpoint.bind and endpoint.socket_type == zmq.PUB


@pytest.mark.parametrize(
    "uri",
    ["tcp://127.0.0.1:5555", "pull:tcp://x:1", "pull+listen:tcp://x:1", "pull+bind:udp://x:1"],
)
def test_malformed(uri: str) -> None:
    with pytest.raises(ConfigError, match=r"ingress\[0\].uri"):
        parse_endpoint(uri, INGRESS_TYPES, "ingress[0].uri")


def test_type_not_allowed_here() -> None:
    with pytest.raises(ConfigError, match="not allowed"):
        parse_endpoint("pub+bind:tcp://127.0.0.1:1", INGRESS_TYPES, "ingress[0].uri")


@pytest.mark.parametrize(
    ("kind", "socket_type"),
    [("pull", zmq.PULL), ("sub", zmq.SUB), ("rep", zmq.REP), ("router", zmq.ROUTER)],
)
def test_every_ingress_type(kind: str, socket_type: int) -> None:
    endpoint = parse_endpoint(f"{kind}+connect:ipc:///tmp/x.ipc", INGRESS_TYPES, "ingress")
    assert endpoint.socket_type == socket_type and not endpoint.bind


def test_one_socket_may_have_several_uris() -> None:
    one = parse_endpoints("sub+connect:tcp://10.0.0.1:5555", INGRESS_TYPES, "ingress cams")
    assert [str(e) for e in one] == ["sub+connect:tcp://10.0.0.1:5555"]
    uris = ("sub+connect:tcp://10.0.0.1:5555", "sub+bind:ipc:///tmp/cams.ipc")
    many = parse_endpoints(uris, INGRESS_TYPES, "ingress cams")
    assert [(e.kind, e.bind) for e in many] == [("sub", False), ("sub", True)]


@pytest.mark.parametrize(
    ("uris", "message"),
    [((), "no endpoint"), (("sub+bind:tcp://x:1", "pull+bind:tcp://x:2"), "mix")],
)
def test_several_uris_must_share_a_type(uris: tuple[str, ...], message: str) -> None:
    with pytest.raises(ConfigError, match=f"ingress cams: .*{message}"):
        parse_endpoints(uris, INGRESS_TYPES, "ingress cams")


@pytest.mark.parametrize(
    "uri",
    [
        "pull+bind:tcp://127.0.0.1:99999",
        "pull+bind:tcp://127.0.0.1:0",
        "pull+bind:tcp://127.0.0.1:x",
    ],
)
def test_tcp_ports_out_of_range_are_config_errors(uri: str) -> None:
    """libzmq would bind 99999 modulo 65536, another port, without a word."""
    with pytest.raises(ConfigError, match="tcp port in 1..65535"):
        parse_endpoint(uri, INGRESS_TYPES, "ingress[0].uri")
    assert parse_endpoint("pull+bind:tcp://127.0.0.1:*", INGRESS_TYPES, "x").address.endswith("*")


def test_two_sockets_binding_one_address_are_a_config_error() -> None:
    ingress = [IngressConfig(name="in", uri="pull+bind:tcp://127.0.0.1:6555")]
    same = [EgressConfig(name="out", uri="pub+bind:tcp://127.0.0.1:6555")]
    with pytest.raises(ConfigError, match=r"egress out: tcp://127.0.0.1:6555 is also bound by"):
        check_endpoints(ingress, same)
    connect = [EgressConfig(name="out", uri="push+connect:tcp://127.0.0.1:6555")]
    check_endpoints(ingress, connect)  # connecting to it is another matter
    twice = [IngressConfig(name="in", uri=["pull+bind:tcp://127.0.0.1:6555"] * 2)]
    with pytest.raises(ConfigError, match=r"ingress in: tcp://127.0.0.1:6555 is listed twice"):
        check_endpoints(twice, [])
    any_port = [IngressConfig(name="in", uri=["pull+bind:tcp://127.0.0.1:*"] * 2)]
    check_endpoints(any_port, [EgressConfig(name="out", uri="pub+bind:tcp://127.0.0.1:*")])


@pytest.mark.parametrize(
    ("uri", "http", "clashes"),
    [
        ("pull+bind:tcp://127.0.0.1:6555", ("127.0.0.1", 6555), True),
        ("pull+bind:tcp://*:6555", ("127.0.0.1", 6555), True),
        ("pull+bind:tcp://127.0.0.1:6555", ("0.0.0.0", 6555), True),
        ("pull+bind:tcp://[::1]:6555", ("::1", 6555), True),
        ("pull+bind:tcp://127.0.0.1:6555", ("127.0.0.2", 6555), False),
        ("pull+bind:tcp://127.0.0.1:6555", ("127.0.0.1", 6556), False),
        ("pull+bind:tcp://127.0.0.1:*", ("127.0.0.1", 0), False),
        ("pull+connect:tcp://127.0.0.1:6555", ("127.0.0.1", 6555), False),
    ],
)
def test_the_http_port_clashes_with_a_socket_bound_on_it(
    uri: str, http: tuple[str, int], clashes: bool
) -> None:
    """The HTTP server binds first: the ingress then failed to start (exit 1, blaming the
    ingress) for a mistake in the config."""
    ingress = [IngressConfig(name="in", uri=uri)]
    if not clashes:
        check_endpoints(ingress, [], http)
        return
    with pytest.raises(ConfigError, match=f"daemon.http_address: port 6555 of {http[0]} is"):
        check_endpoints(ingress, [], http)


def test_an_ipc_path_another_process_listens_on_is_in_use(tmp_path: Path) -> None:
    """ZeroMQ would replace the listener's socket file: the second daemon took all the
    traffic while the first, still ready, got nothing."""
    address = f"ipc://{tmp_path}/frames.sock"
    endpoint = parse_endpoint(f"pull+bind:{address}", INGRESS_TYPES, "ingress")
    with zmq.Context() as context:
        first = context.socket(zmq.PULL)
        first.bind(address)
        second = context.socket(zmq.PULL)
        with pytest.raises(zmq.ZMQError, match="another process listens") as info:
            endpoint.attach(second)
        assert info.value.errno == errno.EADDRINUSE
        first.close(linger=0)
        stale_path = tmp_path / "stale.sock"
        with sockets.socket(sockets.AF_UNIX, sockets.SOCK_STREAM) as stale:
            stale.bind(str(stale_path))  # a socket file nothing listens on: taken over
        parse_endpoint(f"pull+bind:ipc://{stale_path}", INGRESS_TYPES, "ingress").attach(second)
        second.close(linger=0)


def test_binding_a_host_that_is_not_this_machine_says_so() -> None:
    """ZeroMQ's own text is "No such device"; the error names the address and what to bind
    (an address of another machine already says "Cannot assign requested address")."""
    host = "no-such-host.invalid"
    endpoint = parse_endpoint(f"pull+bind:tcp://{host}:6557", INGRESS_TYPES, "ingress[0].uri")
    context: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    socket = context.socket(zmq.PULL)
    try:
        with pytest.raises(zmq.ZMQError) as caught:
            endpoint.attach(socket)
    finally:
        socket.close(linger=0)
        context.term()
    assert caught.value.errno == errno.ENODEV
    assert str(caught.value).startswith(f"tcp://{host}:6557: cannot bind: the host is no address")


@pytest.mark.parametrize("what", ["file", "folder", "dangling link"])
def test_an_ipc_path_that_is_no_socket_file_is_never_replaced(tmp_path: Path, what: str) -> None:
    """ZeroMQ unlinks whatever is at an ipc path it binds: a URI naming the config itself by
    mistake turned it into a socket file."""
    path = tmp_path / "daemon.toml"
    if what == "file":
        path.write_text("[daemon]\n")
    elif what == "folder":
        path.mkdir()
    else:
        path.symlink_to(tmp_path / "gone")
    uri = f"pull+bind:ipc://{path}"
    with pytest.raises(ConfigError, match=f"ingress in: .*{path} exists and is no socket file"):
        check_endpoints([IngressConfig(name="in", uri=uri)], [])
    endpoint = parse_endpoint(uri, INGRESS_TYPES, "ingress")
    with zmq.Context() as context, context.socket(zmq.PULL) as socket:
        with pytest.raises(zmq.ZMQError, match="exists and is no socket file") as info:
            endpoint.attach(socket)
        socket.setsockopt(zmq.LINGER, 0)
    assert info.value.errno == errno.EEXIST
    assert path.is_symlink() if what == "dangling link" else path.exists()
    if what == "file":
        assert path.read_text() == "[daemon]\n"


def test_an_ipc_path_needs_its_folder_and_fits_a_socket_address(tmp_path: Path) -> None:
    """Both passed `streamer check` and failed the start (exit 1)."""
    missing = f"pull+bind:ipc://{tmp_path}/no/such/frames.sock"
    with pytest.raises(ConfigError, match=f"ingress in: .*no folder {tmp_path}/no/such"):
        check_endpoints([IngressConfig(name="in", uri=missing)], [])
    check_endpoints([IngressConfig(name="in", uri="pull+bind:ipc://@streamer-frames")], [])
    long = f"pull+connect:ipc:///tmp/{'x' * 103}"
    with pytest.raises(ConfigError, match="holds at most 107 bytes.*this one has 108"):
        parse_endpoint(long, INGRESS_TYPES, "ingress")
    parse_endpoint(long[:-1], INGRESS_TYPES, "ingress")


@pytest.mark.parametrize(
    "spelling", ["{d}/./frames.sock", "{d}//frames.sock", "{link}/frames.sock"]
)
def test_one_ipc_path_bound_under_two_spellings_is_a_config_error(
    tmp_path: Path, spelling: str
) -> None:
    """`streamer check` passed; the start then failed (exit 1) saying that "another process
    listens" on the socket file the daemon's own first socket had just bound."""
    (tmp_path / "link").symlink_to(tmp_path)
    ingress = [IngressConfig(name="in", uri=f"pull+bind:ipc://{tmp_path}/frames.sock")]
    other = spelling.format(d=tmp_path, link=tmp_path / "link")
    egress = [EgressConfig(name="out", uri=f"pub+bind:ipc://{other}")]
    with pytest.raises(ConfigError, match=f"egress out: ipc://{re.escape(other)} is also bound by"):
        check_endpoints(ingress, egress)
    check_endpoints(ingress, [EgressConfig(name="out", uri=f"pub+bind:ipc://{tmp_path}/r.sock")])


def test_an_ipc_wildcard_bind_says_the_path_zeromq_chose_and_touches_no_file_named_star(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``ipc://*`` was logged as such (no producer can connect to that), two of them were
    "bound twice", and a file named ``*`` in the working directory was refused as in the way
    and would have been removed at close as the bound socket's."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    (tmp_path / "*").write_text("mine")
    uris = [f"{kind}+bind:ipc://*" for kind in ("pull", "pub")]
    ingress, egress = IngressConfig(name="in", uri=uris[0]), EgressConfig(name="out", uri=uris[1])
    check_endpoints([ingress], [egress])
    endpoint = parse_endpoint(uris[0], INGRESS_TYPES, "ingress")
    with zmq.Context() as context:
        pull, push = context.socket(zmq.PULL), context.socket(zmq.PUSH)
        attached = endpoint.attach(pull)
        path = Path(attached.removeprefix("pull+bind:ipc://"))
        assert path.is_absolute() and path.parent.parent == tmp_path and path.is_socket()
        assert IpcFile.of(endpoint) is None
        push.connect(f"ipc://{path}")
        push.send(b"frame")
        assert pull.poll(5000) and pull.recv() == b"frame"
        push.close(linger=0)
        pull.close(linger=0)
    assert (tmp_path / "*").read_text() == "mine"


def test_an_ipv6_host_needs_brackets() -> None:
    with pytest.raises(ConfigError, match=r"an IPv6 host goes in brackets, e.g. \[::1\]"):
        parse_endpoint("pull+bind:tcp://::1:6555", INGRESS_TYPES, "ingress")
    assert parse_endpoint("pull+bind:tcp://[::1]:6555", INGRESS_TYPES, "ingress").ipv6


@pytest.mark.usefixtures("ipv6_loopback")
@pytest.mark.parametrize("host", ["[::1]", "[::]"])
def test_ipv6_endpoints_bind_and_connect(host: str) -> None:
    """Without ZeroMQ's IPV6 option a bind failed as "no address of this machine" and a
    connect never connected."""
    with zmq.Context() as context, context.socket(zmq.PULL) as pull:
        pull.setsockopt(zmq.LINGER, 0)
        parse_endpoint(f"pull+bind:tcp://{host}:*", INGRESS_TYPES, "i").attach(pull)
        port = pull.getsockopt(zmq.LAST_ENDPOINT).decode().rpartition(":")[2]
        with context.socket(zmq.PUSH) as push:
            push.setsockopt(zmq.LINGER, 0)
            parse_endpoint(f"push+connect:tcp://[::1]:{port}", EGRESS_TYPES, "e").attach(push)
            push.send(b"frame")
            assert pull.poll(5000) and pull.recv() == b"frame"


@pytest.mark.parametrize(
    ("first", "second", "clashes"),
    [
        ("tcp://127.0.0.1:6555", "tcp://0.0.0.0:6555", True),
        ("tcp://127.0.0.1:6555", "tcp://*:6555", True),
        ("tcp://127.0.0.1:6555", "tcp://localhost:6555", True),
        ("tcp://0.0.0.0:6555", "tcp://[::]:6555", True),
        ("tcp://127.0.0.1:6555", "tcp://127.0.0.2:6555", False),
        ("tcp://127.0.0.1:6555", "tcp://0.0.0.0:6556", False),
        ("tcp://127.0.0.1:6555", "tcp://lo:6555", True),
        ("tcp://lo:6555", "tcp://*:6555", True),
        ("tcp://lo:6555", "tcp://[::]:6555", True),
        ("tcp://127.0.0.2:6555", "tcp://lo:6555", False),
        ("tcp://127.0.0.1:*", "tcp://0.0.0.0:*", False),
    ],
)
def test_one_port_bound_twice_under_two_spellings_is_a_config_error(
    first: str, second: str, clashes: bool
) -> None:
    """`streamer check` said ok, and the second socket failed the start: address in use."""
    ingress = [IngressConfig(name="in", uri=f"pull+bind:{first}")]
    egress = [EgressConfig(name="out", uri=f"pub+bind:{second}")]
    if not clashes:
        check_endpoints(ingress, egress)
        return
    with pytest.raises(ConfigError, match=f"egress out: {re.escape(second)} takes the port"):
        check_endpoints(ingress, egress)
    with pytest.raises(ConfigError, match="daemon.http_address: port 6555 of "):
        check_endpoints([], egress, ("localhost", 6555))


@pytest.mark.parametrize("host", ["999.1.1.1", " 127.0.0.1", "no-such-host.invalid"])
def test_hosts_that_do_not_resolve_are_config_errors(host: str) -> None:
    """The HTTP server or the socket failed the start (exit 1) on a mistake `streamer check`
    passed."""
    with pytest.raises(ConfigError, match=f"daemon.http_address: cannot resolve {host!r}"):
        check_endpoints([], [], (host, 6555))
    ingress = [IngressConfig(name="in", uri=f"pull+bind:tcp://{host}:6555")]
    with pytest.raises(ConfigError, match="is no host name, address or interface"):
        check_endpoints(ingress, [])
    connect = [IngressConfig(name="in", uri=f"pull+connect:tcp://{host}:6555")]
    check_endpoints(connect, [])  # the peer's name is ZeroMQ's to resolve, again and again


@pytest.mark.parametrize("host", ["10.255.255.1", "203.0.113.77"])
def test_check_refuses_an_ip_address_of_another_machine(host: str) -> None:
    """`streamer check` said ok, and `streamer run` failed at start: "Cannot assign requested
    address"."""
    ingress = [IngressConfig(name="in", uri=f"pull+bind:tcp://{host}:6555")]
    check_endpoints(ingress, [])  # `run`'s check: the address may come with the network
    with pytest.raises(ConfigError, match=f"ingress in: tcp://{host}:6555: cannot bind: the host"):
        check_binds_here(ingress, [])
    egress = [EgressConfig(name="out", uri=f"pub+bind:tcp://{host}:6556")]
    with pytest.raises(ConfigError, match=f"egress out: tcp://{host}:6556: cannot bind"):
        check_binds_here([], egress)
    several = ("sub+connect:tcp://127.0.0.1:6557", f"sub+bind:tcp://{host}:6558")
    with pytest.raises(ConfigError, match=f"ingress in: tcp://{host}:6558"):
        check_binds_here([IngressConfig(name="in", uri=several)], [])
    check_binds_here([IngressConfig(name="in", uri=f"pull+connect:tcp://{host}:6555")], [])


@pytest.mark.parametrize(
    "address",
    [
        "tcp://127.0.0.1:{port}",
        "tcp://0.0.0.0:{port}",
        "tcp://*:{port}",
        "tcp://[::]:{port}",
        "tcp://[::1]:{port}",
        "tcp://localhost:{port}",
        "tcp://lo:{port}",
        "tcp://127.0.0.1:*",
        "ipc://{tmp}/frames.sock",
        "ipc://@streamer-check-frames",
    ],
)
def test_check_passes_this_machines_binds_even_when_a_daemon_holds_them(
    tmp_path: Path, address: str
) -> None:
    """The check binds port 0, never the configured port, which a running daemon holds."""
    with sockets.socket(sockets.AF_INET, sockets.SOCK_STREAM) as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        text = address.format(port=held.getsockname()[1], tmp=tmp_path)
        ingress = [IngressConfig(name="in", uri=f"pull+bind:{text}")]
        check_binds_here(ingress, [EgressConfig(name="out", uri=f"pub+bind:{text}")])


def test_an_ipc_file_is_removed_only_while_it_is_the_one_bound(tmp_path: Path) -> None:
    """libzmq leaves the file on close; a file another socket has bound at the path since
    (libzmq unlinks ours when it binds) is that socket's."""
    path = tmp_path / "frames.sock"
    endpoint = parse_endpoint(f"pull+bind:ipc://{path}", INGRESS_TYPES, "ingress")
    with zmq.Context() as context:
        for replaced in (False, True):
            socket = context.socket(zmq.PULL)
            endpoint.attach(socket)
            file = IpcFile.of(endpoint)
            socket.close(linger=0)
            assert file is not None and path.is_socket()
            if replaced:  # the link keeps the inode from being given to the new file
                os.link(path, tmp_path / "held")
                path.unlink()
                with sockets.socket(sockets.AF_UNIX, sockets.SOCK_STREAM) as other:
                    other.bind(str(path))
            file.remove()
            assert path.exists() is replaced
    for uri in ("pull+connect:ipc:///tmp/x.sock", "pull+bind:ipc://@x", "pull+bind:tcp://*:1"):
        assert IpcFile.of(parse_endpoint(uri, INGRESS_TYPES, "ingress")) is None


@pytest.mark.parametrize("host", ["fe80::1", "fe80::2:3"])
def test_check_refuses_a_link_local_ipv6_address_without_its_interface(host: str) -> None:
    """`streamer check` said ok, and `streamer run` failed at start: "Invalid argument" (a
    link-local address binds only with its interface, whichever machine has it)."""
    ingress = [IngressConfig(name="in", uri=f"pull+bind:tcp://[{host}]:6555")]
    with pytest.raises(ConfigError, match=rf"ingress in: tcp://\[{host}\]:6555: .*%eth0"):
        check_binds_here(ingress, [])
    with zmq.Context() as context, context.socket(zmq.PULL) as socket:
        socket.setsockopt(zmq.IPV6, 1)
        with pytest.raises(zmq.ZMQError) as failed:  # what `run` would do
            socket.bind(f"tcp://[{host}]:0")
        assert failed.value.errno == errno.EINVAL


@pytest.mark.parametrize(
    ("host", "shown"),
    [("10.255.255.1", "10.255.255.1:9555"), ("2001:db8::1", "[2001:db8::1]:9555")],
)
def test_check_refuses_an_http_address_of_another_machine(host: str, shown: str) -> None:
    """`streamer check` said ok, and `streamer run` failed at start: "cannot serve HTTP on
    10.255.255.1:9555 (daemon.http_address): Cannot assign requested address"."""
    check_endpoints([], [], (host, 9555))  # `run`'s check: the address may come with the network
    with pytest.raises(ConfigError, match=re.escape(f"daemon.http_address: {shown}: cannot bind")):
        check_binds_here([], [], (host, 9555))
    with sockets.socket(sockets.AF_INET, sockets.SOCK_STREAM) as held:  # a daemon's
        held.bind(("127.0.0.1", 0))
        held.listen()
        check_binds_here([], [], ("127.0.0.1", held.getsockname()[1]))
    check_binds_here([], [], ("0.0.0.0", 9555))
    check_binds_here([], [], ("localhost", 9555))

"""Endpoint URIs: ``<type>+<bind|connect>:<transport>://<address>``.

The convention Savant uses (``pub+bind:tcp://0.0.0.0:3332``, ``sub+connect:ipc:///tmp/x``),
so one string says which socket type to create and whether it binds or connects. One socket
may be given several URIs of the same type (a SUB that connects to every imagezmq sender).
"""

from __future__ import annotations

import errno
import os
import re
import socket as sockets  # `socket` names the ZeroMQ socket in this module
import stat
import struct
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import zmq

from streamer.errors import ConfigError

__all__ = [
    "EGRESS_TYPES",
    "INGRESS_TYPES",
    "Endpoint",
    "IpcFile",
    "check_binds_here",
    "check_endpoints",
    "ipv6_host",
    "parse_endpoint",
    "parse_endpoints",
]

INGRESS_TYPES = ("pull", "sub", "rep", "router")
EGRESS_TYPES = ("pub", "push")
_SOCKET_TYPES = {
    "pull": zmq.PULL,
    "sub": zmq.SUB,
    "rep": zmq.REP,
    "router": zmq.ROUTER,
    "pub": zmq.PUB,
    "push": zmq.PUSH,
}
_URI = re.compile(r"^(?P<type>[a-z]+)\+(?P<mode>bind|connect):(?P<address>(tcp|ipc)://.+)$")
_IPC_ANY = "ipc://*"
"""An ipc bind to a path ZeroMQ makes: ``<folder>/socket`` in a new folder under
``$TMPDIR`` (else the working directory), both removed when the socket closes."""


@dataclass(frozen=True)
class Endpoint:
    """A parsed endpoint URI.

    Attributes:
        kind: socket type name (``pull``, ``sub``, ``rep``, ``router``, ``pub``, ``push``).
        bind: True to bind, False to connect.
        address: the ZeroMQ address, e.g. ``tcp://127.0.0.1:5555``.
    """

    kind: str
    bind: bool
    address: str

    @property
    def socket_type(self) -> int:
        return _SOCKET_TYPES[self.kind]

    @property
    def ipv6(self) -> bool:
        """Whether the address has an IPv6 host (:func:`ipv6_host`)."""
        return ipv6_host(self.address)

    def attach(self, socket: zmq.Socket[bytes]) -> str:
        """Bind or connect ``socket``; set socket options before calling this (``IPV6`` is
        set here for an IPv6 host).

        Returns:
            The URI as attached, for the log: with the port ZeroMQ chose for a
            ``tcp://host:*`` bind, or the path (made absolute) it chose for ``ipc://*``,
            which producers and subscribers have to be told.

        Raises:
            zmq.ZMQError: the address is in use or invalid. ZeroMQ binds an ``ipc://`` path
                by unlinking whatever is there: a path something accepts connections on is
                refused as in use (EADDRINUSE), as a bound TCP port is (that process would
                get nothing, unaware), and one that is no socket file (a typo naming the
                config, say) as existing (EEXIST). A TCP host that is no address or
                interface of this machine (ENODEV) says so, where ZeroMQ says only "No such
                device".
        """
        if self.ipv6:
            socket.setsockopt(zmq.IPV6, 1)
        if self.bind:
            if self.address.startswith("ipc://") and self.address != _IPC_ANY:
                _check_ipc_free(self.address)
            try:
                socket.bind(self.address)
            except zmq.ZMQError as exc:
                if exc.errno != errno.ENODEV:
                    raise
                raise zmq.ZMQError(errno.ENODEV, _NOT_LOCAL.format(self.address)) from exc
            if self.address.endswith(":*"):
                return f"{self.kind}+bind:{socket.getsockopt_string(zmq.LAST_ENDPOINT)}"
            if self.address == _IPC_ANY:
                path = socket.getsockopt_string(zmq.LAST_ENDPOINT)[len("ipc://") :]
                return f"{self.kind}+bind:ipc://{os.path.abspath(path)}"
        else:
            socket.connect(self.address)
        return str(self)

    def __str__(self) -> str:
        return f"{self.kind}+{'bind' if self.bind else 'connect'}:{self.address}"


@dataclass(frozen=True)
class IpcFile:
    """The socket file an ``ipc://`` bind made, to remove when the socket is closed: libzmq
    (4.3.5, as pyzmq bundles it) unlinks a stale file before it binds a path but leaves its
    own on close, and a file left there reads as a running daemon to ``ls`` and scripts.

    Attributes:
        path: the file's path, as bound.
        identity: which file it was (device, inode, and its modification time, as a file
            system may give a new file a freed inode), so that one another process has bound
            at the path since (by unlinking this one) is left to it.
    """

    path: str
    identity: tuple[int, int, int]

    @classmethod
    def of(cls, endpoint: Endpoint) -> IpcFile | None:
        """The file ``endpoint`` has just bound; None for a tcp endpoint, a connect, an
        abstract (``@``) name, ``ipc://*`` (ZeroMQ removes the file and folder it made), or a
        file that cannot be read."""
        path = endpoint.address[len("ipc://") :]
        if not (endpoint.bind and endpoint.address.startswith("ipc://")) or path.startswith("@"):
            return None
        if endpoint.address == _IPC_ANY:
            return None
        try:
            found = os.stat(path)
        except OSError:
            return None
        return cls(path, _identity(found))

    def remove(self) -> None:
        """Unlink the file, if the one there is still the one bound. Call after closing the
        socket that bound it; errors are ignored (the next bind replaces a stale file)."""
        try:
            found = os.stat(self.path)
            if _identity(found) == self.identity:
                os.unlink(self.path)
        except OSError:
            pass


def _identity(found: os.stat_result) -> tuple[int, int, int]:
    return found.st_dev, found.st_ino, found.st_mtime_ns


def ipv6_host(address: str) -> bool:
    """Whether a ZeroMQ address has a bracketed IPv6 host (``tcp://[::1]:5555``), which ZeroMQ
    binds or connects only on a socket with its ``IPV6`` option set."""
    return address.startswith("tcp://[")


_NOT_LOCAL = (
    "{}: cannot bind: the host is no address or interface of this machine (bind to one of its "
    "addresses, 0.0.0.0 or [::] for all, or an interface name such as eth0; producers "
    "connect to the machine's name)"
)


def _check_ipc_free(address: str) -> None:
    """Refuse to bind an ``ipc://`` path that ZeroMQ would take from someone.

    Raises:
        zmq.ZMQError: EEXIST for a path that is there and no socket file, EADDRINUSE for a
            socket file a process listens on.
    """
    path = address[len("ipc://") :]
    if _not_a_socket(path):
        raise zmq.ZMQError(errno.EEXIST, f"{address}: {path} exists and is no socket file")
    if _ipc_listened(path):
        raise zmq.ZMQError(errno.EADDRINUSE, f"{address}: another process listens")


def _not_a_socket(path: str) -> bool:
    """Whether something other than a socket file (or a link to one) is at ``path``: a
    file, a folder, a dangling link."""
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        return os.path.lexists(path)
    except OSError:  # no access: still something there
        return True
    return not stat.S_ISSOCK(mode)


def _ipc_listened(path: str) -> bool:
    """Whether a process accepts connections on the Unix socket ``path``."""
    if not os.path.exists(path):
        return False
    with sockets.socket(sockets.AF_UNIX, sockets.SOCK_STREAM) as probe:
        try:
            probe.connect(path)
        except OSError:  # a stale socket file (refused) or not a socket
            return False
    return True


def parse_endpoint(uri: str, allowed: tuple[str, ...], where: str) -> Endpoint:
    """Parse ``uri`` and check that its socket type is one of ``allowed``.

    Raises:
        ConfigError: malformed URI or a socket type not allowed here; the message names
            ``where`` (e.g. ``ingress[0].uri``).
    """
    match = _URI.match(uri)
    if match is None:
        raise ConfigError(f"{where}: {uri!r} is not '<type>+<bind|connect>:<tcp|ipc>://<address>'")
    kind = match["type"]
    if kind not in allowed:
        raise ConfigError(f"{where}: socket type {kind!r} not allowed here; use {list(allowed)}")
    address = match["address"]
    if address.startswith("tcp://"):
        _check_tcp(address, where)
    else:
        _check_ipc_length(address, where)
    return Endpoint(kind, match["mode"] == "bind", address)


def _check_tcp(address: str, where: str) -> None:
    """A tcp address needs a port in 1..65535 (or ``*`` to bind any): libzmq would take
    99999 modulo 65536 and bind another port without a word; and an IPv6 host needs
    brackets (``tcp://[::1]:5555``), as in a URL.

    Raises:
        ConfigError: a tcp address without a valid port, or an unbracketed IPv6 host.
    """
    host, _, port = address[len("tcp://") :].rpartition(":")
    if not (port == "*" or (port.isascii() and port.isdigit() and 1 <= int(port) <= 65535)):
        raise ConfigError(f"{where}: {address!r} needs a tcp port in 1..65535 (or *)")
    if ":" in host and not (host.startswith("[") and host.endswith("]")):
        raise ConfigError(f"{where}: {address!r}: an IPv6 host goes in brackets, e.g. [::1]")


_IPC_PATH_MAX = 107
"""Bytes of a Unix socket path (``sun_path`` holds 108 with its final NUL, on Linux)."""


def _check_ipc_length(address: str, where: str) -> None:
    """Raises ConfigError: an ``ipc://`` path longer than a Unix socket address holds."""
    path = address[len("ipc://") :]
    if len(os.fsencode(path)) > _IPC_PATH_MAX:
        raise ConfigError(
            f"{where}: {address!r}: an ipc path holds at most {_IPC_PATH_MAX} bytes "
            f"(a Unix socket address), this one has {len(os.fsencode(path))}"
        )


def check_endpoints(
    ingress: Sequence[Any], egress: Sequence[Any], http: tuple[str, int] | None = None
) -> None:
    """Parse every configured URI, so a bad one is a config error before anything starts.

    Args:
        ingress, egress: the ``[[ingress]]`` and ``[[egress]]`` configs (``uri``, ``name``).
        http: ``daemon.http_address`` as ``(host, port)``, or None when it is off.

    Raises:
        ConfigError: a malformed URI, a socket type not allowed there, a bad tcp port, an
            address bound twice (by two sockets, or listed twice for one), a tcp port
            the HTTP server binds too (the second to bind would fail to start), or an ipc
            path to bind in a folder that does not exist or where a file other than a socket
            is (binding would replace it).
    """
    sockets = [
        (f"ingress {c.name}", parse_endpoints(c.uri, INGRESS_TYPES, f"ingress {c.name}"))
        for c in ingress
    ]
    sockets += [
        (f"egress {c.name}", (parse_endpoint(c.uri, EGRESS_TYPES, f"egress {c.name}"),))
        for c in egress
    ]
    bound: dict[str, str] = {}
    tcp: list[_TcpBind] = [] if http is None else [_http_bind(*http)]
    for where, endpoints in sockets:
        for endpoint in (e for e in endpoints if e.bind):
            key = _bound_key(endpoint.address)
            # A `*` port or ipc path is a new one each time: two such binds never clash.
            if not key.endswith(("://*", ":*")) and (other := bound.get(key)) is not None:
                also = "listed twice" if other == where else f"also bound by {other}"
                raise ConfigError(f"{where}: {endpoint.address} is {also}")
            bound[key] = where
            _check_ipc_place(endpoint.address, where)
            if (bind := _zmq_tcp_bind(endpoint.address, where)) is not None:
                _check_port_free(bind, tcp)
                tcp.append(bind)


def check_binds_here(
    ingress: Sequence[Any], egress: Sequence[Any], http: tuple[str, int] | None = None
) -> None:
    """``streamer check``'s check that every tcp bind to an IP address (``http_address``
    included) binds one of this machine's, by binding a plain socket to the address and
    port 0 (never the configured port, which a running daemon holds). Host names,
    interface names, wildcards and ipc paths pass. ``run`` does not refuse such an
    address: its bind fails (exit 1, retried), as the address may only be missing until
    the network is up.

    Args:
        ingress, egress: the ``[[ingress]]`` and ``[[egress]]`` configs (``uri``, ``name``),
            whose URIs :func:`check_endpoints` has parsed.
        http: ``daemon.http_address`` as ``(host, port)``, or None when it is off.

    Raises:
        ConfigError: an IP address not assigned to this machine (EADDRNOTAVAIL), or a
            link-local IPv6 address without its interface (EINVAL).
    """
    if http is not None:
        host, port = http
        shown = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
        _check_ip_here(host, shown, "daemon.http_address", _NOT_LOCAL_HTTP)
    tables: list[tuple[str, Any, tuple[str, ...]]]
    tables = [(f"ingress {c.name}", c.uri, INGRESS_TYPES) for c in ingress]
    tables += [(f"egress {c.name}", c.uri, EGRESS_TYPES) for c in egress]
    for where, uris, allowed in tables:
        for endpoint in parse_endpoints(uris, allowed, where):
            if endpoint.bind and endpoint.address.startswith("tcp://"):
                host, _ = _tcp_host_port(endpoint.address)
                _check_ip_here(host, endpoint.address, where, _NOT_LOCAL)


def _check_ip_here(host: str, address: str, where: str, not_local: str) -> None:
    """Raises ConfigError: ``host`` (of ``address``, as the config writes it) is an IP
    address this machine does not have (``not_local``, formatted with ``address``), or a
    link-local IPv6 address without its interface (``[fe80::1]``: no machine binds one,
    EINVAL); any other host, or a bind failing otherwise, is left to the start."""
    try:
        infos = sockets.getaddrinfo(host, 0, type=sockets.SOCK_STREAM, flags=sockets.AI_NUMERICHOST)
    except (OSError, UnicodeError):  # a host or interface name, or `*`
        return
    for family, kind, proto, _, address_here in infos:
        try:
            with sockets.socket(family, kind, proto) as probe:
                probe.bind(address_here)
        except OSError as exc:
            if exc.errno == errno.EADDRNOTAVAIL:
                raise ConfigError(f"{where}: {not_local.format(address)}") from exc
            if exc.errno == errno.EINVAL and len(address_here) == 4 and not address_here[3]:
                raise ConfigError(f"{where}: {_NO_SCOPE.format(address)}") from exc


_NOT_LOCAL_HTTP = (
    "{}: cannot bind: the host is no address of this machine (bind to one of its addresses, "
    "or 0.0.0.0 or [::] for all)"
)
_NO_SCOPE = (
    "{}: cannot bind: a link-local IPv6 address binds only with its interface (e.g. [fe80::1%eth0])"
)


def _tcp_host_port(address: str) -> tuple[str, str]:
    """A ``tcp://host:port`` address's host, without an IPv6 host's brackets, and port."""
    host, _, port = address[len("tcp://") :].rpartition(":")
    return (host[1:-1] if host.startswith("[") else host), port


def _bound_key(address: str) -> str:
    """What a bind takes, for finding two binds of one place: an ``ipc://`` path resolved
    (``./``, ``//``, a relative path, a symlinked folder: one socket file under several
    spellings, which the second bind would take from the first), other addresses as written.
    """
    path = address[len("ipc://") :]
    if not address.startswith("ipc://") or path.startswith("@") or address == _IPC_ANY:
        return address
    return f"ipc://{os.path.realpath(path)}"


@dataclass(frozen=True)
class _TcpBind:
    """A TCP port a socket binds.

    Attributes:
        where: who binds it, for messages (``ingress frames``, ``daemon.http_address``).
        text: the address as configured.
        port: 1..65535, or 0 for any free port (which never clashes).
        addresses: ``(address family, IP)`` pairs it binds, :data:`_ANY` for every address
            of the family; ``(0, name)`` for a host that does not resolve (an interface).
    """

    where: str
    text: str
    port: int
    addresses: frozenset[tuple[int, str]]


_ANY = ""
"""The IP of a wildcard bind: every address of its family."""


def _http_bind(host: str, port: int) -> _TcpBind:
    """The HTTP server's bind.

    Raises:
        ConfigError: its host does not resolve (the server would fail to start).
    """
    try:
        addresses = _bound_addresses(host)
    except OSError as exc:
        raise ConfigError(f"daemon.http_address: cannot resolve {host!r}: {exc}") from exc
    return _TcpBind("daemon.http_address", f"{host}:{port}", port, addresses)


def _zmq_tcp_bind(address: str, where: str) -> _TcpBind | None:
    """A ZeroMQ ``tcp://`` bind with a port; None for ipc or ``*`` (any free port).

    Raises:
        ConfigError: its host neither resolves (a host name or address) nor names an
            interface of this machine (ZeroMQ binds an interface by its name, e.g.
            ``eth0``). An address that resolves but is not this machine's passes: the
            bind fails at start (exit 1, retried), as the network may not be up yet.
    """
    if not address.startswith("tcp://"):
        return None
    host, port = _tcp_host_port(address)
    if port == "*":
        return None
    try:
        addresses = _bound_addresses(host)
    except OSError as exc:
        if host not in {name for _, name in sockets.if_nameindex()}:
            raise ConfigError(
                f"{where}: {address!r}: {host!r} is no host name, address or interface "
                f"of this machine ({exc.strerror})"
            ) from exc
        addresses = _interface_addresses(host)
    return _TcpBind(where, address, int(port), addresses)


_SIOCGIFADDR = 0x8915
"""Linux's ioctl that reads an interface's IPv4 address."""


def _interface_addresses(name: str) -> frozenset[tuple[int, str]]:
    """What binding the interface ``name`` takes: its IPv4 address, the one ZeroMQ binds
    (``tcp://lo:5555`` is ``tcp://127.0.0.1:5555``); ``(0, name)`` where it cannot be read
    (another OS, no IPv4 address), which still clashes with a wildcard or the same name."""
    try:
        import fcntl  # POSIX only: imported for an interface's bind alone

        with sockets.socket(sockets.AF_INET, sockets.SOCK_DGRAM) as probe:
            request = struct.pack("256s", os.fsencode(name)[:15])
            answer = fcntl.ioctl(probe.fileno(), _SIOCGIFADDR, request)
    except (ImportError, OSError):
        return frozenset({(0, name)})
    return frozenset({(sockets.AF_INET, sockets.inet_ntoa(answer[20:24]))})


def _bound_addresses(host: str) -> frozenset[tuple[int, str]]:
    """What binding ``host`` takes: a wildcard (``*`` and ``0.0.0.0`` every IPv4 address,
    ``::`` every address: Linux's IPv6 sockets take IPv4 too), else every address it
    resolves to.

    Raises:
        OSError: it does not resolve.
    """
    if host in ("*", "0.0.0.0"):
        return frozenset({(sockets.AF_INET, _ANY)})
    if host == "::":
        return frozenset({(sockets.AF_INET, _ANY), (sockets.AF_INET6, _ANY)})
    infos = sockets.getaddrinfo(host, None, type=sockets.SOCK_STREAM)
    families = (sockets.AF_INET, sockets.AF_INET6)
    return frozenset((info[0], str(info[4][0])) for info in infos if info[0] in families)


def _check_port_free(bind: _TcpBind, earlier: Sequence[_TcpBind]) -> None:
    """Raises ConfigError: an earlier bind takes ``bind``'s port on one of its addresses
    (the second to bind would fail to start: address in use)."""
    for other in earlier:
        if bind.port and bind.port == other.port and _overlap(bind.addresses, other.addresses):
            if other.where == "daemon.http_address":
                raise ConfigError(
                    f"daemon.http_address: port {other.port} of {other.text.rpartition(':')[0]} "
                    f"is also bound by {bind.where} ({bind.text})"
                )
            raise ConfigError(
                f"{bind.where}: {bind.text} takes the port {other.where} binds ({other.text})"
            )


def _overlap(one: frozenset[tuple[int, str]], other: frozenset[tuple[int, str]]) -> bool:
    """Whether two binds of one port share an address (a wildcard shares its family's)."""
    return any(
        (family == other_family or 0 in (family, other_family))
        and _ANY in (ip, other_ip)
        or (family, ip) == (other_family, other_ip)
        for family, ip in one
        for other_family, other_ip in other
    )


def _check_ipc_place(address: str, where: str) -> None:
    """Raises ConfigError: an ``ipc://`` path to bind whose folder is missing, or where
    something other than a socket file is."""
    if not address.startswith("ipc://"):
        return
    path = address[len("ipc://") :]
    if path.startswith("@") or address == _IPC_ANY:  # an abstract name; a path ZeroMQ makes
        return
    if _not_a_socket(path):
        raise ConfigError(f"{where}: {address!r}: {path} exists and is no socket file")
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder):
        raise ConfigError(f"{where}: {address!r}: no folder {folder}")


def parse_endpoints(
    uris: str | tuple[str, ...], allowed: tuple[str, ...], where: str
) -> tuple[Endpoint, ...]:
    """Parse the URI, or the URIs, of one socket: all must name the same socket type.

    Raises:
        ConfigError: no URI, a malformed one, a type not allowed here, or mixed types; the
            message names ``where``.
    """
    endpoints = tuple(
        parse_endpoint(uri, allowed, where) for uri in ((uris,) if isinstance(uris, str) else uris)
    )
    if not endpoints:
        raise ConfigError(f"{where}: no endpoint URI")
    kinds = sorted({e.kind for e in endpoints})
    if len(kinds) > 1:
        raise ConfigError(f"{where}: one socket has one type; the URIs mix {kinds}")
    return endpoints

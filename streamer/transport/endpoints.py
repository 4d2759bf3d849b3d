"""Endpoint URIs: ``<type>+<bind|connect>:<transport>://<address>``.

The convention Savant uses (``pub+bind:tcp://0.0.0.0:3332``, ``sub+connect:ipc:///tmp/x``),
so one string says which socket type to create and whether it binds or connects. One socket
may be given several URIs of the same type (a SUB that connects to every imagezmq sender).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import zmq

from streamer.errors import ConfigError

__all__ = ["EGRESS_TYPES", "INGRESS_TYPES", "Endpoint", "parse_endpoint", "parse_endpoints"]

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

    def attach(self, socket: zmq.Socket[bytes]) -> None:
        """Bind or connect ``socket``; set socket options before calling this.

        Raises:
            zmq.ZMQError: the address is in use or invalid.
        """
        if self.bind:
            socket.bind(self.address)
        else:
            socket.connect(self.address)

    def __str__(self) -> str:
        return f"{self.kind}+{'bind' if self.bind else 'connect'}:{self.address}"


def parse_endpoint(uri: str, allowed: tuple[str, ...], where: str) -> Endpoint:
    """Parse ``uri`` and check that its socket type is one of ``allowed``.

    Raises:
        ConfigError: malformed URI or a socket type not allowed here; the message names
            ``where`` (e.g. ``ingress[0].uri``).
    """
    match = _URI.match(uri)
    if match is None:
        raise ConfigError(
            f"{where}: {uri!r} is not '<type>+<bind|connect>:<tcp|ipc>://<address>'"
        )
    kind = match["type"]
    if kind not in allowed:
        raise ConfigError(f"{where}: socket type {kind!r} not allowed here; use {list(allowed)}")
    return Endpoint(kind, match["mode"] == "bind", match["address"])


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

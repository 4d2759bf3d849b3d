"""Endpoint URIs: ``<type>+<bind|connect>:<transport>://<address>``.

The convention Savant uses (``pub+bind:tcp://0.0.0.0:3332``, ``sub+connect:ipc:///tmp/x``),
so one string says which socket type to create and whether it binds or connects.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import zmq

from streamer.errors import ConfigError

__all__ = ["EGRESS_TYPES", "INGRESS_TYPES", "Endpoint", "parse_endpoint"]

INGRESS_TYPES = ("pull", "sub")
EGRESS_TYPES = ("pub", "push")
_SOCKET_TYPES = {"pull": zmq.PULL, "sub": zmq.SUB, "pub": zmq.PUB, "push": zmq.PUSH}
_URI = re.compile(r"^(?P<type>[a-z]+)\+(?P<mode>bind|connect):(?P<address>(tcp|ipc)://.+)$")


@dataclass(frozen=True)
class Endpoint:
    """A parsed endpoint URI.

    Attributes:
        kind: socket type name (``pull``, ``sub``, ``pub``, ``push``).
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

"""CURVE encryption and authentication of the daemon's sockets (optional, per socket).

A socket whose ``[[ingress]]`` or ``[[egress]]`` table sets ``curve_secret_key_file`` is a
CURVE *server*, whether it binds or connects (ZeroMQ keeps the CURVE role apart from the
direction of the connection, so a SUB connecting out to PUB senders is a server too): its
traffic is encrypted and only clients whose public key is in ``curve_clients_dir`` get
through. The key check is ZAP (ZeroMQ RFC 27), answered by pyzmq's
:class:`~zmq.auth.thread.ThreadAuthenticator`, one per context (:func:`start_authenticator`);
each clients directory is one ZAP domain. Key files are the ones ``zmq.auth`` writes
(``tools/keygen.py``): ``NAME.key`` (public) and ``NAME.key_secret`` (both keys).

A refused peer gets nothing through, and is logged once: ``curve_client_denied`` with its
public key, the first time a key is refused for a directory (at most 10 lines per 10 s, the
next one counting those left out: a client with a new key per connection cannot flood the
journal); ``curve_handshake_failed`` the
first time a socket sees a kind of failed handshake (a peer without CURVE, one using another
server key, or a socket error mid-handshake), from the socket's monitor
(:class:`HandshakeMonitor`). CURVE sockets fail closed (``ZAP_ENFORCE_DOMAIN``): without the
authenticator nobody gets in. The directory is read at start: restart the daemon after adding
or removing a key.
"""

from __future__ import annotations

import errno
import os
import struct
import tempfile
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import structlog
import zmq
import zmq.auth
from zmq.auth.thread import ThreadAuthenticator
from zmq.utils import z85
from zmq.utils.monitor import recv_monitor_message

from streamer.config import EgressConfig, IngressConfig
from streamer.errors import ClientError, ConfigError
from streamer.log_budget import LogBudget
from streamer.transport.monitor import stop_monitor, unbounded_monitor

__all__ = [
    "MAX_LOGGED_KEYS",
    "ClientKeys",
    "CurveClient",
    "CurveAuthenticator",
    "CurveServer",
    "HandshakeMonitor",
    "check_curve_keys",
    "start_authenticator",
    "write_key_pair",
    "zap_domain",
]

MAX_LOGGED_KEYS = 1024
"""Refused keys remembered per directory so that each is logged once; beyond this the record
starts over (a key may then be logged again)."""

# PROTOCOL: wrong or missing CURVE (mechanism mismatch, an undecryptable HELLO). NO_DETAIL: a
# socket error during the handshake; a peer without CURVE that notices the mismatch first
# hangs up, and the server sees only that. Not AUTH: ClientKeys logs those with the key.
_FAILED_HANDSHAKES = zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL | zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL
_log = structlog.get_logger(__name__)

SocketConfig = IngressConfig | EgressConfig


def write_key_pair(directory: Path, name: str, *, overwrite: bool = False) -> tuple[Path, Path]:
    """Create a CURVE key pair with ``zmq.auth.create_certificates``.

    Args:
        directory: where to write; created if missing.
        name: the file stem, e.g. ``server`` or ``camera-12``.
        overwrite: replace existing files of that name.

    Returns:
        (``NAME.key``: the public key, to hand out; ``NAME.key_secret``: both keys, readable
        by its owner only, mode 0600).

    Raises:
        FileExistsError: a file of that name exists and ``overwrite`` is False.
    """
    directory.mkdir(parents=True, exist_ok=True)
    public, secret = directory / f"{name}.key", directory / f"{name}.key_secret"
    if not overwrite and (public.exists() or secret.exists()):
        raise FileExistsError(f"{public} or {secret} exists; not replaced")
    # Written in a private (0700) staging folder, so the secret is never readable by others.
    with tempfile.TemporaryDirectory(dir=directory) as staging:
        made_public, made_secret = (Path(p) for p in zmq.auth.create_certificates(staging, name))
        made_secret.chmod(0o600)
        os.replace(made_secret, secret)
        os.replace(made_public, public)
    return public, secret


def zap_domain(clients_dir: Path) -> str:
    """The ZAP domain of the sockets that admit the clients of ``clients_dir``."""
    return str(clients_dir.resolve())


@dataclass(frozen=True)
class CurveServer:
    """The CURVE server settings of one socket.

    Attributes:
        public_key, secret_key: the server key pair, Z85-encoded (40 bytes each).
        domain: the ZAP domain (see :func:`zap_domain`).
    """

    public_key: bytes
    secret_key: bytes
    domain: str

    @classmethod
    def from_config(cls, config: SocketConfig, where: str) -> CurveServer | None:
        """Load the key pair of a socket; None when its CURVE is off.

        Raises:
            ConfigError: this libzmq has no CURVE, or the key file cannot be read, is
                malformed, or holds no secret key; the message names ``where``.
        """
        if config.curve_secret_key_file is None or config.curve_clients_dir is None:
            return None
        if not zmq.has("curve"):
            raise ConfigError(f"{where}: CURVE is set, but this libzmq was built without it")
        path = config.curve_secret_key_file
        try:
            public, secret = zmq.auth.load_certificate(path)
        except (OSError, ValueError) as exc:
            raise ConfigError(f"{where}: curve_secret_key_file {path}: {exc}") from exc
        if secret is None:
            raise ConfigError(
                f"{where}: curve_secret_key_file {path} holds no secret key; use the"
                " .key_secret file tools/keygen.py wrote"
            )
        for key, name in ((public, "public"), (secret, "secret")):
            if not _is_curve_key(key):
                raise ConfigError(f"{where}: curve_secret_key_file {path}: {_BAD_KEY} ({name})")
        return cls(public, secret, zap_domain(config.curve_clients_dir))

    def apply(self, socket: zmq.Socket[Any]) -> None:
        """Make ``socket`` a CURVE server; call before it binds or connects.

        ``ZAP_ENFORCE_DOMAIN`` makes it fail closed: without a running authenticator libzmq
        would admit every client key; with it, none.
        """
        socket.setsockopt(zmq.ZAP_ENFORCE_DOMAIN, 1)
        socket.setsockopt(zmq.CURVE_SERVER, 1)
        socket.setsockopt(zmq.CURVE_PUBLICKEY, self.public_key)
        socket.setsockopt(zmq.CURVE_SECRETKEY, self.secret_key)
        socket.setsockopt(zmq.ZAP_DOMAIN, self.domain.encode())


@dataclass(frozen=True)
class CurveClient:
    """A client's CURVE settings: its own key pair and the server's public key.

    Attributes:
        public_key, secret_key: the client's key pair, Z85-encoded (40 bytes each).
        server_key: the server's public key, Z85-encoded.
    """

    public_key: bytes
    secret_key: bytes
    server_key: bytes

    @classmethod
    def from_files(cls, server_key_file: Path, secret_key_file: Path) -> CurveClient:
        """Load the keys a client of a CURVE socket needs.

        Args:
            server_key_file: the server's ``.key`` (public) file, as ``tools/keygen.py``
                wrote it.
            secret_key_file: the client's own ``.key_secret`` file (its allowed ``.key``
                file is in the server's ``curve_clients_dir``).

        Raises:
            ClientError: this libzmq has no CURVE, or a file cannot be read, is malformed,
                or (the client's) holds no secret key; the message names the file.
        """
        if not zmq.has("curve"):
            raise ClientError("CURVE keys given, but this libzmq was built without CURVE")
        server_key, _ = _load_keys(server_key_file)
        public, secret = _load_keys(secret_key_file)
        if secret is None:
            raise ClientError(
                f"{secret_key_file} holds no secret key; give the client's .key_secret file"
            )
        return cls(public, secret, server_key)

    def apply(self, socket: zmq.Socket[Any]) -> None:
        """Make ``socket`` a CURVE client of the server; call before it connects."""
        socket.setsockopt(zmq.CURVE_SERVERKEY, self.server_key)
        socket.setsockopt(zmq.CURVE_PUBLICKEY, self.public_key)
        socket.setsockopt(zmq.CURVE_SECRETKEY, self.secret_key)


def _load_keys(path: Path) -> tuple[bytes, bytes | None]:
    """The Z85 (public, secret or None) keys of a ``zmq.auth`` key file.

    Raises:
        ClientError: it cannot be read or holds no well-formed CURVE key.
    """
    try:
        public, secret = zmq.auth.load_certificate(path)
    except (OSError, ValueError) as exc:
        raise ClientError(f"CURVE key file {path}: {exc}") from exc
    if not all(_is_curve_key(key) for key in (public, secret) if key is not None):
        raise ClientError(f"CURVE key file {path}: {_BAD_KEY}")
    return public, secret


class ClientKeys:
    """The allowed client keys of one directory: pyzmq's CURVE credentials provider.

    :meth:`callback` runs on the authenticator's thread only; it never raises.

    Args:
        directory: holds the allowed clients' public key files (``*.key``).

    Raises:
        ConfigError: the directory cannot be read or holds a malformed key file.
    """

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self._allowed = _client_keys(directory)
        self._budget = LogBudget("curve_client_denied")
        self._logged: set[bytes] = set()
        if not self._allowed:
            _log.warning("curve_no_clients", clients_dir=str(directory))

    def callback(self, domain: str, key: bytes) -> bool:
        """ZAP decision for a client's Z85 public ``key``: True to let it in."""
        if key in self._allowed:
            return True
        if key not in self._logged:
            if len(self._logged) >= MAX_LOGGED_KEYS:
                self._logged.clear()
            self._logged.add(key)
            suppressed = self._budget.take()
            if suppressed is not None:
                _log.warning(
                    "curve_client_denied",
                    client_key=key.decode("ascii", "replace"),
                    clients_dir=str(self.directory),
                    suppressed=suppressed,
                )
        return False


def _client_keys(directory: Path) -> frozenset[bytes]:
    """The Z85 public keys of the ``*.key`` files in ``directory``.

    Raises:
        ConfigError: the directory cannot be read or holds a malformed key file, or a
            ``*.key`` that is no regular file.
    """
    try:
        odd = sorted(path.name for path in directory.glob("*.key") if not path.is_file())
        if odd:  # a FIFO blocked the read forever, a link to /dev/zero filled the memory
            raise ConfigError(f"curve_clients_dir {directory}: not regular files: {odd}")
        keys = frozenset(zmq.auth.load_certificates(directory))
    except (OSError, ValueError) as exc:
        raise ConfigError(f"curve_clients_dir {directory}: {exc}") from exc
    bad = sorted(key.decode("ascii", "replace") for key in keys if not _is_curve_key(key))
    if bad:
        raise ConfigError(f"curve_clients_dir {directory}: {_BAD_KEY}: {bad}")
    return keys


_BAD_KEY = "not a CURVE key (40 Z85 characters, as tools/keygen.py writes)"


def _is_curve_key(key: bytes) -> bool:
    """Whether ``key`` is a Z85-encoded 32-byte CURVE key."""
    try:
        return len(key) == 40 and len(z85.decode(key)) == 32
    except (ValueError, KeyError, IndexError, struct.error):  # per kind of bad character
        return False


def check_curve_keys(ingress: Iterable[IngressConfig], egress: Iterable[EgressConfig]) -> None:
    """Read every socket's CURVE key pair and clients directory, so that a bad key file is a
    config error (``streamer check``, exit 2 at start) before anything starts.

    Raises:
        ConfigError: as :meth:`CurveServer.from_config` and :class:`ClientKeys` do.
    """
    sockets: list[tuple[str, SocketConfig]] = [(f"ingress {c.name}", c) for c in ingress]
    sockets += [(f"egress {c.name}", c) for c in egress]
    for where, config in sockets:
        if CurveServer.from_config(config, where) is not None:
            assert config.curve_clients_dir is not None
            try:
                _client_keys(config.curve_clients_dir)
            except ConfigError as exc:
                raise ConfigError(f"{where}: {exc}") from None


class CurveAuthenticator:
    """The ZAP handler of one ZeroMQ context, for every CURVE socket of the daemon.

    Start it (:func:`start_authenticator`) before any CURVE socket binds or connects, stop it
    before the context is terminated.
    """

    def __init__(self, context: zmq.Context[Any], directories: Iterable[Path]) -> None:
        self._providers = {zap_domain(d): ClientKeys(d) for d in directories}
        self._thread = ThreadAuthenticator(context)

    def start(self) -> None:
        """Start the authenticator's thread and register every directory's keys."""
        self._thread.start()
        for domain, provider in self._providers.items():
            self._thread.configure_curve_callback(domain, provider)

    def stop(self) -> None:
        """Stop the thread and close its ZAP socket; idempotent."""
        if self._thread.is_alive():
            self._thread.stop()


def start_authenticator(
    context: zmq.Context[Any], configs: Iterable[SocketConfig]
) -> CurveAuthenticator | None:
    """Start the ZAP handler of ``context`` for the sockets in ``configs`` that use CURVE.

    Returns:
        The running authenticator, or None when no socket uses CURVE (then none is started,
        and ZeroMQ admits every peer).

    Raises:
        ConfigError: a clients directory cannot be read or holds a malformed key file.
    """
    directories = {c.curve_clients_dir for c in configs if c.curve_clients_dir is not None}
    if not directories:
        return None
    authenticator = CurveAuthenticator(context, sorted(directories))
    authenticator.start()
    return authenticator


class HandshakeMonitor:
    """Logs the failed security handshakes of one socket, once per kind of failure.

    Owned by the thread that owns the socket: it reads the socket's monitor (a PAIR socket).

    Args:
        socket: the watched socket; create the monitor before it binds or connects.
        where: names the socket in the log (e.g. ``ingress frames``).
    """

    def __init__(self, socket: zmq.Socket[Any], where: str) -> None:
        self._watched = socket
        self.socket = unbounded_monitor(socket, _FAILED_HANDSHAKES)
        self._where = where
        self._seen: set[tuple[int, int]] = set()

    def drain(self) -> None:
        """Read the pending events without blocking; log each new kind of failure once."""
        while self.socket.poll(0):
            event = recv_monitor_message(self.socket)
            kind = (int(event["event"]), int(event["value"]))
            if kind in self._seen:
                continue
            self._seen.add(kind)
            _log.warning(
                "curve_handshake_failed",
                socket=self._where,
                endpoint=event["endpoint"].decode("utf-8", "replace"),
                error=_describe(*kind),
            )

    def close(self) -> None:
        """Stop monitoring and close the monitor socket; call before closing the socket."""
        stop_monitor(self._watched, self.socket)


def _describe(event: int, value: int) -> str:
    """A failed handshake's cause: the ``PROTOCOL_ERROR_*`` name of a protocol error, or the
    errno name of a socket error (``NO_DETAIL``). A client whose mechanism or server key does
    not match may notice first and hang up: the server then sees only the broken connection
    (EPIPE, ECONNRESET), which is said with its likely cause."""
    if event == zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL:
        name = errno.errorcode.get(value, str(value))
        if value in (errno.EPIPE, errno.ECONNRESET):
            return f"{name}: the peer hung up mid-handshake (no CURVE, or another server key?)"
        return name
    try:
        return str(zmq.Event(value).name)
    except ValueError:
        return hex(value)

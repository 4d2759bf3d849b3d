"""What the client tools share (``tools/produce.py``, ``tools/subscribe.py``): CURVE keys,
finite-number and endpoint checks, and SIGTERM taken as Ctrl-C."""

from __future__ import annotations

import re
import signal
from collections.abc import Callable
from pathlib import Path
from types import FrameType
from typing import Any, NoReturn, TypeVar

import click

from streamer.errors import ClientError
from streamer.option_checks import finite
from streamer.transport.security import CurveClient

__all__ = [
    "MAX_WAIT_S",
    "curve_client",
    "curve_options",
    "finite",
    "sigterm_as_ctrl_c",
    "zmq_endpoint",
]

MAX_WAIT_S = 86_400.0
"""The longest timeout a tool option takes (s): a day. Far longer ones overflowed a wait
(ZeroMQ's poll, a thread's wait): a traceback instead of a usage error."""

F = TypeVar("F", bound=Callable[..., Any])

_KEY_FILE = click.Path(exists=True, dir_okay=False, path_type=Path)
_ENDPOINT = re.compile(r"(tcp|ipc|inproc|ws|wss|pgm|epgm|udp|vmci)://\S+")
"""ZeroMQ's endpoint form, ``transport://address`` (the ``zmq_connect`` manual's transports)."""


def curve_options(command: F) -> F:
    """Add ``--curve-server-key`` and ``--curve-secret-key`` (the ``curve_server_key`` and
    ``curve_secret_key`` parameters) to a click command."""
    command = click.option(
        "--curve-secret-key",
        type=_KEY_FILE,
        help="This client's .key_secret file (tools/keygen.py), for a daemon socket that "
        "requires CURVE; with --curve-server-key.",
    )(command)
    return click.option(
        "--curve-server-key",
        type=_KEY_FILE,
        help="The daemon's public .key file, for a socket that requires CURVE.",
    )(command)


def curve_client(server_key: Path | None, secret_key: Path | None) -> CurveClient | None:
    """The CURVE client of the two options; None when neither is given.

    Raises:
        click.UsageError: only one is given, or a key file is not one keygen writes.
    """
    if server_key is None and secret_key is None:
        return None
    if server_key is None or secret_key is None:
        raise click.UsageError("--curve-server-key and --curve-secret-key go together")
    try:
        return CurveClient.from_files(server_key, secret_key)
    except ClientError as exc:
        raise click.UsageError(str(exc)) from exc


def zmq_endpoint(_ctx: click.Context, _param: click.Parameter, value: str) -> str:
    """A click callback: ``value``, refused unless it has ZeroMQ's endpoint form (``zmq``
    would refuse it only once the tool started: exit 1 instead of a usage error).

    Raises:
        click.BadParameter: ``value`` is not ``transport://address``.
    """
    if not _ENDPOINT.fullmatch(value):
        raise click.BadParameter(f"{value!r} is not a ZeroMQ endpoint such as tcp://127.0.0.1:5555")
    return value


def sigterm_as_ctrl_c() -> None:
    """Make SIGTERM stop the tool as Ctrl-C does: it raises KeyboardInterrupt in the main
    thread (a service manager's stop then ends a run as an operator's Ctrl-C would).
    Call it from the main thread."""
    signal.signal(signal.SIGTERM, _interrupt)


def _interrupt(_signum: int, _frame: FrameType | None) -> NoReturn:
    """SIGTERM's handler: stop as Ctrl-C does."""
    raise KeyboardInterrupt

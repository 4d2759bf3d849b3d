"""pyACL's calling conventions, as the C extension implements them.

Each simulated function is declared with the ``PyArg_ParseTuple`` format of the real wrapper
(RT ``python/pyACL/**/*.cpp``): a wrong number or type of arguments raises
``TypeError("acl.xxx args parse failed")`` instead of returning a code (``CHECK_NULL`` macro,
RT ``python/pyACL/utils_methods.h``). Integers are converted as C does: ``k``/``K`` wrap to
64 bits, ``I`` to 32 and ``B`` to 8 bits without overflow checks, ``i`` must fit an ``int``,
``h`` a ``short``, ``L`` a ``long long`` and ``b`` an ``unsigned char`` (0..255); only Python
``int`` is accepted (a numpy integer is not a ``PyLong``).
``f`` takes an ``int`` or a ``float``. Results keep pyACL's shapes: a
bare code, a ``(value, code)`` tuple, or a bare handle that is 0 on failure.

Inside the simulator a broken rule raises :class:`SimError`, which the binding turns into the
documented return code and records as a :class:`Violation`. Its message becomes the calling
thread's *recent error message*, which ``acl.get_recent_err_msg()`` returns and clears (thread
level, the default ``err_msg_mode``: RT ``python/docs/zh/api_ref/runtime/exception/
function-get_recent_err_msg.md``).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from types import ModuleType
from typing import Any, Literal

from streamer.runtime.acl.sim.calllog import CallLog
from streamer.runtime.acl.sim.faults import Faults

__all__ = ["Binder", "Returns", "SimError", "SimulatorFault", "Violation", "parse_args"]

Returns = Literal["ret", "pair", "handle", "value"]
"""Result shape: ``ret`` a code; ``pair`` ``(value, code)``; ``handle`` a handle, 0 on
failure; ``value`` a plain value that has no failure code."""

_INT_CODES = {"k": 64, "K": 64, "I": 32, "B": 8}
_CHECKED_INT_BITS = {"i": 32, "L": 64, "h": 16}
_UNSIGNED_CHAR_MAX = 0xFF


class SimError(Exception):
    """A call broke a rule; the binding returns ``code`` to the caller.

    Args:
        code: the aclError the real runtime returns.
        rule: the rule of reference/pyacl.md §9 (``S7``) or a short tag, or None for a plain
            failure that breaks no rule (e.g. an injected fault).
        message: what was wrong.
    """

    def __init__(self, code: int, rule: str | None, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.rule = rule


class SimulatorFault(RuntimeError):
    """Something a real process would not survive (a read of device memory from the host, a
    write into an immutable ``bytes``): the real pyACL would crash or corrupt memory."""


@dataclass(frozen=True)
class Violation:
    """One broken rule: which, by which call, the code returned, and why."""

    rule: str
    api: str
    code: int
    message: str


def parse_args(api: str, fmt: str, args: tuple[Any, ...]) -> tuple[Any, ...]:
    """Check and convert ``args`` like ``PyArg_ParseTuple(args, fmt)``.

    Raises:
        TypeError: ``{api} args parse failed``: wrong count or type.
    """
    required, _, optional = fmt.partition("|")
    if not len(required) <= len(args) <= len(required) + len(optional):
        raise TypeError(f"{api} args parse failed")
    return tuple(
        _convert(api, code, arg) for code, arg in zip(required + optional, args, strict=False)
    )


def _convert(api: str, code: str, arg: Any) -> Any:
    if code == "O":
        return arg
    if code == "s":
        if not isinstance(arg, str):
            raise TypeError(f"{api} args parse failed")
        return arg
    if code == "f":
        if not isinstance(arg, int | float):
            raise TypeError(f"{api} args parse failed")
        return float(arg)
    if not isinstance(arg, int):
        raise TypeError(f"{api} args parse failed")
    if code == "b":
        if not 0 <= arg <= _UNSIGNED_CHAR_MAX:
            raise TypeError(f"{api} args parse failed")
        return int(arg)
    if code in _CHECKED_INT_BITS:
        bound = 1 << (_CHECKED_INT_BITS[code] - 1)
        if not -bound <= arg < bound:
            raise TypeError(f"{api} args parse failed")
        return int(arg)
    return int(arg) & ((1 << _INT_CODES[code]) - 1)


def _failure(returns: Returns, code: int) -> Any:
    if returns == "pair":
        return (0, code)
    if returns == "ret":
        return code
    return 0


class Binder:
    """Wraps simulator functions with pyACL's conventions, the call log and injected faults.

    Args:
        log: where every call is recorded.
        faults: the injected failures (``fail_calls``).
    """

    def __init__(self, log: CallLog, faults: Faults) -> None:
        self.log = log
        self.faults = faults
        self.violations: list[Violation] = []
        self.names: list[str] = []
        self._lock = threading.Lock()
        self._recent = threading.local()

    def bind(self, api: str, fmt: str, returns: Returns, impl: Callable[..., Any]) -> Any:
        """A pyACL-style function named ``api`` that parses ``fmt`` and calls ``impl``."""

        def call(*args: Any) -> Any:
            try:
                values = parse_args(api, fmt, args)
                result = self.invoke(api, returns, impl, values)
            except Exception as exc:
                self.log.record(api, args, f"raised {type(exc).__name__}")
                raise
            self.log.record(api, values, result)
            return result

        call.__name__ = api.rsplit(".", 1)[-1]
        call.__qualname__ = api
        self.names.append(api)
        return call

    def export(
        self, module: ModuleType, api: str, fmt: str, returns: Returns, impl: Callable[..., Any]
    ) -> None:
        """:meth:`bind` ``impl`` and set it on ``module`` under the last part of ``api``."""
        setattr(module, api.rsplit(".", 1)[-1], self.bind(api, fmt, returns, impl))

    def invoke(
        self, api: str, returns: Returns, impl: Callable[..., Any], values: tuple[Any, ...]
    ) -> Any:
        """Run ``impl``, turning an injected fault or a :class:`SimError` into a code."""
        injected = self.faults.injected_code(api)
        if injected is not None:
            self._recent.message = f"{api}: injected failure {injected}"
            return _failure(returns, injected)
        try:
            return impl(*values)
        except SimError as err:
            self.record_violation(api, err)
            self._recent.message = f"{api}: {err}"
            return _failure(returns, err.code)

    def take_recent_message(self) -> str | None:
        """The calling thread's last failure message, cleared; None when there is none."""
        message: str | None = getattr(self._recent, "message", None)
        self._recent.message = None
        return message

    def record_violation(self, api: str, err: SimError) -> None:
        """Remember a broken rule (``err.rule`` set) for :attr:`violations`."""
        if err.rule is not None:
            with self._lock:
                self.violations.append(Violation(err.rule, api, err.code, str(err)))

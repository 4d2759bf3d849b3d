"""The simulator's call log: every API call in order, with its arguments and result.

Tests read it to check the documented start-up and teardown order; on a laptop it shows what
the backend asked of ACL. Bounded (``call_log_size``), so a long ``acl-sim`` run keeps only the
newest calls.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

__all__ = ["Call", "CallLog"]


@dataclass(frozen=True)
class Call:
    """One API call.

    Attributes:
        api: the name as the backend wrote it (``acl.rt.malloc``, ``acltdtEnqueueData``).
        args: the arguments: numbers and strings as given, anything else summarised as
            ``"<type len>"`` (the log must not keep buffers or callbacks alive).
        result: what the call returned (a code, a handle or a ``(value, code)`` tuple),
            summarised the same way.
        thread: name of the calling thread.
    """

    api: str
    args: tuple[Any, ...]
    result: Any
    thread: str


class CallLog:
    """Thread-safe, bounded, append-only list of :class:`Call`.

    Args:
        size: calls kept (the oldest are dropped first).
    """

    def __init__(self, size: int) -> None:
        self._calls: deque[Call] = deque(maxlen=size)
        self._lock = threading.Lock()
        self._recorded = threading.Condition(self._lock)

    def record(self, api: str, args: Iterable[Any], result: Any) -> None:
        """Append one call made by the current thread."""
        call = Call(api, tuple(map(_plain, args)), _plain(result), threading.current_thread().name)
        with self._recorded:
            self._calls.append(call)
            self._recorded.notify_all()

    def wait_for(self, match: Callable[[Call], bool], timeout_s: float) -> bool:
        """Wait until a call that ``match`` accepts is in the log, at most ``timeout_s``
        seconds; whether one is."""
        with self._recorded:
            return self._recorded.wait_for(lambda: any(map(match, self._calls)), timeout_s)

    def calls(self, prefix: str = "") -> list[Call]:
        """The calls whose API name starts with ``prefix``, oldest first."""
        with self._lock:
            return [call for call in self._calls if call.api.startswith(prefix)]

    def names(self, prefix: str = "") -> list[str]:
        """API names of :meth:`calls`, oldest first."""
        return [call.api for call in self.calls(prefix)]

    def clear(self) -> None:
        """Forget every call (tests use it to look at one phase)."""
        with self._lock:
            self._calls.clear()


def _plain(value: Any) -> Any:
    if value is None or isinstance(value, (int, float, str)):
        return value
    if isinstance(value, tuple):
        return tuple(_plain(v) for v in value)
    size = len(value) if hasattr(value, "__len__") else ""
    return f"<{type(value).__name__} {size}>".replace(" >", ">")

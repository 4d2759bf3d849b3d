"""Simulated devices and contexts, and each thread's current context.

Rules (reference/pyacl.md §2 and §9; seeds "多Device场景"):
    - ``set_device`` opens a device (reference counted) and makes its default context current
      in the calling thread; ``create_context`` makes the new context current; switching
      devices is ``set_context``.
    - S10: a new thread (``acl.util.start_thread`` or any other) has no current context; a
      call that needs one fails with ``ACL_ERROR_RT_CONTEXT_NULL`` until ``set_context``.
"""

from __future__ import annotations

import itertools
import threading
from dataclasses import dataclass

from streamer.runtime.acl.constants import AclCode
from streamer.runtime.acl.sim.binding import SimError

__all__ = ["Context", "SimDevices"]


@dataclass(frozen=True)
class Context:
    """A context handle and the device it belongs to; ``default`` for set_device's own."""

    handle: int
    device: int
    default: bool


class SimDevices:
    """Devices, contexts and the current context of every thread; thread-safe.

    Args:
        count: number of simulated devices (ids ``0 .. count - 1``).
    """

    def __init__(self, count: int) -> None:
        self.count = count
        self._lock = threading.Lock()
        self._handles = itertools.count(0x7F00_0000_1000, 0x1000)
        self._open: dict[int, int] = {}
        self._contexts: dict[int, Context] = {}
        self._defaults: dict[int, Context] = {}
        self._local = threading.local()

    def set_device(self, device: int) -> None:
        """Open ``device`` (again) and make its default context current.

        Raises:
            SimError: no such device (``ACL_ERROR_INVALID_DEVICE``).
        """
        if not 0 <= device < self.count:
            raise SimError(AclCode.ERROR_INVALID_DEVICE, "device", f"no device {device}")
        with self._lock:
            self._open[device] = self._open.get(device, 0) + 1
            default = self._defaults.get(device)
            if default is None:
                default = Context(next(self._handles), device, default=True)
                self._defaults[device] = default
                self._contexts[default.handle] = default
        self._local.context = default

    def reset_device(self, device: int) -> None:
        """Close ``device`` once.

        Raises:
            SimError: the device is not open.
        """
        with self._lock:
            if self._open.get(device, 0) < 1:
                raise SimError(AclCode.ERROR_INVALID_DEVICE, "device", f"device {device} not set")
            self._open[device] -= 1
            if self._open[device] == 0:
                del self._open[device]
                default = self._defaults.pop(device)
                del self._contexts[default.handle]
        current = getattr(self._local, "context", None)
        if current is not None and current.device == device and current.default:
            self._local.context = None

    def create_context(self, device: int) -> int:
        """A new context on ``device``, current in the calling thread.

        Raises:
            SimError: the device is not open.
        """
        with self._lock:
            if device not in self._open:
                raise SimError(AclCode.ERROR_INVALID_DEVICE, "device", f"device {device} not set")
            context = Context(next(self._handles), device, default=False)
            self._contexts[context.handle] = context
        self._local.context = context
        return context.handle

    def explicit(self, handle: int) -> Context:
        """The explicit context ``handle``.

        Raises:
            SimError: not an explicit context.
        """
        with self._lock:
            context = self._contexts.get(handle)
        if context is None or context.default:
            raise SimError(AclCode.ERROR_RT_PARAM_INVALID, "context", f"no context {handle:#x}")
        return context

    def destroy_context(self, handle: int) -> None:
        """Raises: SimError: not an explicit context."""
        context = self.explicit(handle)
        with self._lock:
            if self._contexts.pop(handle, None) is None:
                raise SimError(AclCode.ERROR_RT_PARAM_INVALID, "context", f"no context {handle:#x}")
        if getattr(self._local, "context", None) == context:
            self._local.context = None

    def set_context(self, handle: int) -> None:
        """Make ``handle`` current in the calling thread.

        Raises:
            SimError: no such context.
        """
        with self._lock:
            context = self._contexts.get(handle)
        if context is None:
            raise SimError(AclCode.ERROR_RT_PARAM_INVALID, "context", f"no context {handle:#x}")
        self._local.context = context

    def current(self) -> Context:
        """The calling thread's context.

        Raises:
            SimError: none is set (S10, ``ACL_ERROR_RT_CONTEXT_NULL``).
        """
        context: Context | None = getattr(self._local, "context", None)
        if context is None:
            raise SimError(AclCode.ERROR_RT_CONTEXT_NULL, "S10", "thread has no current context")
        with self._lock:
            if context.handle not in self._contexts:
                raise SimError(AclCode.ERROR_RT_CONTEXT_NULL, "S10", "current context destroyed")
        return context

    def current_device(self) -> int | None:
        """The device of the calling thread's context, or None when it has none."""
        context: Context | None = getattr(self._local, "context", None)
        with self._lock:
            if context is None or context.handle not in self._contexts:
                return None
        return context.device

    def open_count(self, device: int) -> int:
        """How many ``set_device`` calls of ``device`` no ``reset_device`` matched yet."""
        with self._lock:
            return self._open.get(device, 0)

    def explicit_contexts(self, device: int) -> list[int]:
        """The explicit contexts of ``device`` not destroyed yet."""
        with self._lock:
            return [
                c.handle for c in self._contexts.values() if c.device == device and not c.default
            ]

    def live(self) -> dict[str, list[int]]:
        """Open devices and explicit contexts not destroyed yet."""
        with self._lock:
            explicit = [c.handle for c in self._contexts.values() if not c.default]
            return {"devices": sorted(self._open), "contexts": explicit}

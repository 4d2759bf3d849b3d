"""Simulated memory: one address space with device, host and user regions.

Every allocation is a ``bytearray`` mapped at a virtual address, so pointer arithmetic works
(``ptr + offset``) and every access is checked: a copy that leaves its allocation, touches
freed memory or another device's memory fails instead of silently corrupting data.

Rules (reference/pyacl.md §9, sources there):
    S6: ``malloc`` of 0 bytes, or with a policy that is not one single documented value, fails
        (``ACL_ERROR_INVALID_PARAM``). A negative size wraps to a huge unsigned value (pyACL
        parses it with ``k``) and fails with ``ACL_ERROR_BAD_ALLOC``.
    S7: ``malloc`` returns a 64-byte-aligned address and reserves ``ALIGN_UP(size, 32) + 32``
        bytes (950 series: ``ALIGN_UP(size, 32)``); the contents are not zeroed (0xFF here).
    S8: ``malloc_host`` returns 64-byte-aligned memory.
    memcpy: ``count > dest_max``, an unknown ``kind``, or a range outside one live allocation
        fails with ``ACL_ERROR_INVALID_PARAM`` (``acl.rt.memcpy`` page).

User memory is the storage of a Python ``bytes`` object handed out by ``acl.util.bytes_to_ptr``:
valid while the object lives (RT ``util/bytes_convert.cpp``), so the simulator keeps it only
while someone else still references it and treats the address as dangling afterwards.
"""

from __future__ import annotations

import bisect
import enum
import sys
import threading
from dataclasses import dataclass

from streamer.runtime.acl.constants import AclCode, MallocPolicy, MemcpyKind
from streamer.runtime.acl.pool import align_up
from streamer.runtime.acl.sim.binding import SimError, SimulatorFault

__all__ = ["Allocation", "MemoryKind", "SimMemory"]

_ALIGN = 64
_FILL = b"\xff"
_REGION_SHIFT = 40
_HOST_REGION = 0x80
_USER_REGION = 0xF0
_DEVICE_REGION = 0x100


class MemoryKind(enum.Enum):
    """Where an allocation lives."""

    DEVICE = "device"
    HOST = "host"
    USER = "user"


@dataclass(eq=False)
class Allocation:
    """One mapped range: ``[start, start + reserved)``; ``size`` is what was asked for."""

    start: int
    size: int
    reserved: int
    kind: MemoryKind
    device: int | None
    data: bytearray | bytes

    @property
    def end(self) -> int:
        return self.start + self.reserved


class SimMemory:
    """The address space of the simulated machine; thread-safe.

    Args:
        device_count: simulated devices, each with its own region.
        device_bytes: capacity of each device (bytes).
        soc_950: malloc reserves ``ALIGN_UP(size, 32)`` without the extra 32 bytes.
    """

    def __init__(self, device_count: int, device_bytes: int, soc_950: bool) -> None:
        self._lock = threading.Lock()
        self._allocs: dict[int, Allocation] = {}
        self._starts: list[int] = []
        self._user_ids: dict[int, int] = {}
        self._next = {region: region << _REGION_SHIFT for region in (_HOST_REGION, _USER_REGION)}
        for device in range(device_count):
            self._next[_DEVICE_REGION + device] = (_DEVICE_REGION + device) << _REGION_SHIFT
        self._device_bytes = device_bytes
        self._used = dict.fromkeys(range(device_count), 0)
        self._extra = 0 if soc_950 else 32

    def malloc(self, device: int, size: int, policy: int) -> int:
        """``acl.rt.malloc`` on ``device``: S6, S7.

        Raises:
            SimError: 0 bytes or a combined policy (S6); device memory exhausted.
        """
        if size == 0:
            raise SimError(AclCode.ERROR_INVALID_PARAM, "S6", "malloc of 0 bytes")
        if policy not in set(MallocPolicy):
            raise SimError(
                AclCode.ERROR_INVALID_PARAM, "S6", f"policy {policy:#x} is not one value"
            )
        reserved = align_up(size, 32) + self._extra
        with self._lock:
            if self._used[device] + reserved > self._device_bytes:
                raise SimError(AclCode.ERROR_BAD_ALLOC, None, f"device {device} out of memory")
            self._used[device] += reserved
            return self._map(_DEVICE_REGION + device, size, reserved, MemoryKind.DEVICE, device)

    def malloc_host(self, size: int) -> int:
        """``acl.rt.malloc_host``: S8.

        Raises:
            SimError: 0 bytes.
        """
        if size == 0:
            raise SimError(AclCode.ERROR_INVALID_PARAM, "S6", "malloc_host of 0 bytes")
        with self._lock:
            return self._map(_HOST_REGION, size, size, MemoryKind.HOST, None)

    def free(self, ptr: int, kind: MemoryKind) -> None:
        """``acl.rt.free`` / ``free_host``.

        Raises:
            SimError: ``ptr`` is not the start of a live allocation of that kind (double free).
        """
        with self._lock:
            alloc = self._allocs.get(ptr)
            if alloc is None or alloc.kind != kind:
                raise SimError(AclCode.ERROR_INVALID_PARAM, "free", f"{ptr:#x} is not allocated")
            self._unmap(alloc)
            if alloc.device is not None:
                self._used[alloc.device] -= alloc.reserved

    def register_user(self, obj: bytes) -> int:
        """``acl.util.bytes_to_ptr``: the address of ``obj``'s storage (S5).

        Raises:
            ValueError: ``obj`` is not ``bytes``.
        """
        if not isinstance(obj, bytes):
            raise ValueError("bytes_to_ptr: argument must be bytes")
        with self._lock:
            self._prune_dangling()
            start = self._user_ids.get(id(obj))
            if start is None:
                start = self._map(_USER_REGION, len(obj), max(len(obj), 1), MemoryKind.USER, None)
                self._allocs[start].data = obj
                self._user_ids[id(obj)] = start
            return start

    def read(self, ptr: int, count: int) -> bytes:
        """A copy of ``count`` bytes at ``ptr``.

        Raises:
            SimError: the range is not inside one live allocation.
        """
        with self._lock:
            alloc = self._resolve(ptr, count)
            offset = ptr - alloc.start
            return bytes(alloc.data[offset : offset + count])

    def write(self, ptr: int, data: bytes) -> None:
        """Store ``data`` at ``ptr``.

        Raises:
            SimError: the range is not inside one live allocation.
            SimulatorFault: ``ptr`` is inside a Python ``bytes`` (immutable).
        """
        with self._lock:
            self._write(ptr, data)

    def copy(self, dst: int, dest_max: int, src: int, count: int, kind: int, device: int) -> None:
        """``acl.rt.memcpy`` in a context of ``device``.

        Raises:
            SimError: ``count > dest_max``, unknown ``kind``, a range outside one live
                allocation, or another device's memory.
        """
        if count > dest_max:
            raise SimError(AclCode.ERROR_INVALID_PARAM, "memcpy", f"count {count} > {dest_max}")
        if kind not in set(MemcpyKind):
            raise SimError(AclCode.ERROR_INVALID_PARAM, "memcpy", f"unknown kind {kind}")
        with self._lock:
            source = self._resolve(src, count)
            target = self._resolve(dst, count)
            for alloc in (source, target):
                if alloc.device not in (None, device):
                    raise SimError(
                        AclCode.ERROR_INVALID_PARAM,
                        "memcpy",
                        f"{alloc.start:#x} is on device {alloc.device}, context is on {device}",
                    )
            offset = src - source.start
            self._write(dst, bytes(source.data[offset : offset + count]))

    def owner(self, ptr: int, count: int) -> tuple[MemoryKind, int | None]:
        """Kind and device (None for host and user memory) of the live allocation that holds
        ``[ptr, ptr + count)``.

        Raises:
            SimError: the range is not inside one live allocation.
        """
        with self._lock:
            alloc = self._resolve(ptr, count)
            return alloc.kind, alloc.device

    def allocation_start(self, ptr: int, count: int) -> int:
        """Start address of the live allocation that holds ``[ptr, ptr + count)``.

        Raises:
            SimError: the range is not inside one live allocation.
        """
        with self._lock:
            return self._resolve(ptr, count).start

    def host_read(self, ptr: int, count: int, host_run_mode: bool) -> bytes:
        """``acl.util.ptr_to_bytes``: what the application process reads at ``ptr``.

        Raises:
            SimulatorFault: device memory read by a host (``ACL_HOST``) process, or an
                address that is not mapped: a real process would crash.
        """
        try:
            with self._lock:
                alloc = self._resolve(ptr, count)
                if host_run_mode and alloc.kind == MemoryKind.DEVICE:
                    raise SimulatorFault(f"host process read device memory at {ptr:#x}")
                offset = ptr - alloc.start
                return bytes(alloc.data[offset : offset + count])
        except SimError as err:
            raise SimulatorFault(f"ptr_to_bytes({ptr:#x}, {count}): {err}") from err

    def live(self) -> list[Allocation]:
        """Device and host allocations not freed yet (user memory excluded)."""
        with self._lock:
            return [a for a in self._allocs.values() if a.kind != MemoryKind.USER]

    def _map(
        self, region: int, size: int, reserved: int, kind: MemoryKind, device: int | None
    ) -> int:
        start = self._next[region]
        self._next[region] = align_up(start + reserved, _ALIGN)
        self._allocs[start] = Allocation(
            start, size, reserved, kind, device, bytearray(_FILL) * reserved
        )
        bisect.insort(self._starts, start)
        return start

    def _unmap(self, alloc: Allocation) -> None:
        del self._allocs[alloc.start]
        self._starts.remove(alloc.start)

    def _resolve(self, ptr: int, count: int) -> Allocation:
        index = bisect.bisect_right(self._starts, ptr) - 1
        alloc = self._allocs[self._starts[index]] if index >= 0 else None
        if alloc is not None and alloc.kind == MemoryKind.USER and self._dangling(alloc):
            self._drop_user(alloc)
            alloc = None
        if alloc is None or count < 0 or ptr + count > alloc.end:
            raise SimError(
                AclCode.ERROR_INVALID_PARAM,
                "bounds",
                f"[{ptr:#x}, +{count}) is not inside one live allocation",
            )
        return alloc

    def _write(self, ptr: int, data: bytes) -> None:
        alloc = self._resolve(ptr, len(data))
        if not isinstance(alloc.data, bytearray):
            raise SimulatorFault(f"write into an immutable Python bytes object at {ptr:#x}")
        offset = ptr - alloc.start
        alloc.data[offset : offset + len(data)] = data

    def _dangling(self, alloc: Allocation) -> bool:
        # Two references: the Allocation's attribute and getrefcount's own argument.
        return sys.getrefcount(alloc.data) <= 2

    def _drop_user(self, alloc: Allocation) -> None:
        self._user_ids.pop(id(alloc.data), None)
        self._unmap(alloc)

    def _prune_dangling(self) -> None:
        for start in [s for s in self._starts if s >> _REGION_SHIFT == _USER_REGION]:
            if self._dangling(self._allocs[start]):
                self._drop_user(self._allocs[start])

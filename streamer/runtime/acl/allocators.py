"""Block allocators of the memory pool: device memory and (pinned) host memory.

Run mode decides which one a host-readable buffer needs (RT ``acl_rt.h`` ``aclrtRunMode``;
official queue sample, HA ``appdevg/acldevg/aclcppdevg_000035.html``): under ``ACL_HOST``
the application reaches device memory only through ``acl.rt.memcpy`` and reads results from
``acl.rt.malloc_host`` memory; under ``ACL_DEVICE`` it runs on the device and reads device
memory directly.
"""

from __future__ import annotations

from typing import Any

from streamer.runtime.acl.constants import MallocPolicy, RunMode
from streamer.runtime.acl.errors import check_ret
from streamer.runtime.acl.pool import BlockAllocator

__all__ = ["DeviceAllocator", "HostAllocator", "readable_allocator"]


class DeviceAllocator:
    """``acl.rt.malloc(size, NORMAL_ONLY)`` / ``acl.rt.free``, in the current context.

    ``NORMAL_ONLY`` as in the samples (SAM ``python/common/acllite/acllite_model.py``).
    """

    def __init__(self, acl: Any) -> None:
        self._acl = acl

    def alloc(self, nbytes: int) -> int:
        """Device block of ``nbytes`` bytes, 64-byte aligned.

        Raises:
            AclError: ``acl.rt.malloc`` failed.
        """
        ptr, ret = self._acl.rt.malloc(nbytes, MallocPolicy.NORMAL_ONLY)
        check_ret(ret, f"acl.rt.malloc of {nbytes} bytes")
        return int(ptr)

    def free(self, ptr: int) -> None:
        """Raises: AclError: ``acl.rt.free`` failed."""
        check_ret(self._acl.rt.free(ptr), "acl.rt.free")


class HostAllocator:
    """``acl.rt.malloc_host`` / ``acl.rt.free_host`` (pinned host memory, 64-byte aligned)."""

    def __init__(self, acl: Any) -> None:
        self._acl = acl

    def alloc(self, nbytes: int) -> int:
        """Host block of ``nbytes`` bytes.

        Raises:
            AclError: ``acl.rt.malloc_host`` failed.
        """
        ptr, ret = self._acl.rt.malloc_host(nbytes)
        check_ret(ret, "acl.rt.malloc_host")
        return int(ptr)

    def free(self, ptr: int) -> None:
        """Raises: AclError: ``acl.rt.free_host`` failed."""
        check_ret(self._acl.rt.free_host(ptr), "acl.rt.free_host")


def readable_allocator(acl: Any, run_mode: RunMode) -> BlockAllocator:
    """Memory the application can read with ``acl.util.ptr_to_bytes``: host memory under
    ``ACL_HOST``, device memory under ``ACL_DEVICE`` (where it is the app's own memory)."""
    if run_mode == RunMode.HOST:
        return HostAllocator(acl)
    return DeviceAllocator(acl)

"""Secondary allocation: segments carved out of a few large ``acl.rt.malloc`` blocks.

The rule (ACL "内存二次分配管理" / secondary memory allocation page, for ``acl.rt.malloc``,
``malloc_host`` and ``malloc_cached``): when an application carves its own pieces out of a
large block, each piece of ``len`` bytes takes ``m = ALIGN_UP(len, 32) + 32`` bytes and starts
on a 64-byte boundary; pieces that media processing (DVPP) reads or writes start on a 128-byte
boundary (``acldvppMalloc`` / ``hi_mpi_dvpp_malloc`` rows of the same page), where
``ALIGN_UP(len, k) = ((len - 1) // k + 1) * k``.

The pool hands out all segments of one batch at once (all or nothing), reuses freed space
(first fit, lowest address first), never overlaps two segments, and blocks the caller while it
is full: a full pool is backpressure on the enqueue thread.
"""

from __future__ import annotations

import bisect
import threading
from collections.abc import Sequence
from contextlib import ExitStack
from dataclasses import dataclass
from typing import Protocol

from streamer.errors import BackendError

__all__ = [
    "ALIGN_MEDIA",
    "ALIGN_MODEL",
    "BlockAllocator",
    "MemoryPool",
    "Segment",
    "align_up",
    "footprint",
    "segment_bytes",
]

ALIGN_MODEL = 64
"""Start alignment of a segment for model inputs/outputs (bytes)."""
ALIGN_MEDIA = 128
"""Start alignment of a segment that media processing (DVPP) touches (bytes)."""
_WAIT_S = 0.05


def align_up(length: int, k: int) -> int:
    """``ALIGN_UP(len, k) = ((len - 1) // k + 1) * k`` for ``len >= 1`` (bytes)."""
    if length < 1:
        raise ValueError(f"length must be >= 1, got {length}")
    return ((length - 1) // k + 1) * k


def segment_bytes(length: int) -> int:
    """Bytes a segment of ``length`` bytes takes in a block: ``ALIGN_UP(length, 32) + 32``."""
    return align_up(length, 32) + 32


def footprint(sizes: Sequence[int], alignment: int = ALIGN_MODEL) -> int:
    """Bytes of a block that holds exactly the segments ``sizes``, each aligned (bytes)."""
    return sum(align_up(segment_bytes(size), alignment) for size in sizes)


class BlockAllocator(Protocol):
    """Where blocks come from: ``acl.rt.malloc``/``free`` or ``malloc_host``/``free_host``."""

    def alloc(self, nbytes: int) -> int:
        """A 64-byte-aligned block of ``nbytes`` bytes; raises on failure."""
        ...

    def free(self, ptr: int) -> None:
        """Release a block returned by :meth:`alloc`."""
        ...


@dataclass(frozen=True)
class Segment:
    """One carved piece.

    Attributes:
        ptr: start address (a multiple of the requested alignment).
        nbytes: the size asked for (bytes); the caller may use this many bytes.
        reserved: bytes taken from the block, ``ALIGN_UP(nbytes, 32) + 32``.
        block: index of the block it was carved from.
    """

    ptr: int
    nbytes: int
    reserved: int
    block: int


class _Block:
    """One ``malloc``-ed block and the sorted ``(start, end)`` offsets in use."""

    def __init__(self, base: int, size: int) -> None:
        self.base = base
        self.size = size
        self.used: list[tuple[int, int]] = []

    def find(self, reserved: int, alignment: int, used: list[tuple[int, int]]) -> int | None:
        """Lowest offset where ``reserved`` bytes fit, aligned in absolute address."""
        cursor = 0
        for start, end in [*used, (self.size, self.size)]:
            offset = self._aligned(cursor, alignment)
            if offset + reserved <= start:
                return offset
            cursor = max(cursor, end)
        return None

    def _aligned(self, offset: int, alignment: int) -> int:
        return -(-(self.base + offset) // alignment) * alignment - self.base


class MemoryPool:
    """Segments from ``block_count`` blocks of ``block_bytes`` bytes each.

    Thread-safe. Blocks are allocated in the constructor (released again if one fails) and
    freed by :meth:`close`.

    Args:
        allocator: where blocks come from.
        block_bytes: size of each block (bytes).
        block_count: number of blocks.

    Raises:
        AclError: a block allocation failed (earlier blocks are freed first).
    """

    def __init__(self, allocator: BlockAllocator, block_bytes: int, block_count: int = 1) -> None:
        self._allocator = allocator
        self._cond = threading.Condition()
        self._closed = False
        self._blocks: list[_Block] = []
        with ExitStack() as stack:
            for _ in range(block_count):
                ptr = allocator.alloc(block_bytes)
                stack.callback(allocator.free, ptr)
                self._blocks.append(_Block(ptr, block_bytes))
            stack.pop_all()

    @property
    def segments_in_use(self) -> int:
        """Segments handed out and not yet freed."""
        with self._cond:
            return sum(len(block.used) for block in self._blocks)

    def try_alloc(self, sizes: Sequence[int], alignment: int = ALIGN_MODEL) -> list[Segment] | None:
        """All segments of ``sizes`` (bytes), or None when they do not fit now."""
        with self._cond:
            return self._take(sizes, alignment)

    def alloc(
        self,
        sizes: Sequence[int],
        alignment: int = ALIGN_MODEL,
        cancelled: threading.Event | None = None,
    ) -> list[Segment]:
        """All segments of ``sizes`` (bytes), waiting while the pool is full (backpressure).

        Raises:
            ValueError: the segments cannot fit even in an empty pool.
            BackendError: the pool was closed, or ``cancelled`` was set, while waiting.
        """
        if not self._fits_empty(sizes, alignment):
            raise ValueError(f"segments {list(sizes)} never fit in this pool")
        with self._cond:
            while (segments := self._take(sizes, alignment)) is None:
                if self._closed or (cancelled is not None and cancelled.is_set()):
                    raise BackendError("memory pool closed while waiting for space")
                self._cond.wait(_WAIT_S)
            return segments

    def free(self, segments: Sequence[Segment]) -> None:
        """Return segments to the pool and wake the callers waiting in :meth:`alloc`.

        A no-op after :meth:`close` (the blocks are gone).
        """
        with self._cond:
            if self._closed:
                return
            for segment in segments:
                block = self._blocks[segment.block]
                offset = segment.ptr - block.base
                block.used.remove((offset, offset + segment.reserved))
            self._cond.notify_all()

    def close(self) -> None:
        """Free every block (segments still handed out become invalid). Idempotent.

        Raises:
            AclError: a block could not be freed (the others are still freed).
        """
        with self._cond:
            if self._closed:
                return
            self._closed = True
            self._cond.notify_all()
            blocks, self._blocks = self._blocks, []
        with ExitStack() as stack:
            for block in blocks:
                stack.callback(self._allocator.free, block.base)

    def _take(self, sizes: Sequence[int], alignment: int) -> list[Segment] | None:
        if self._closed:
            return None
        placed = self._place(sizes, alignment, [list(block.used) for block in self._blocks])
        if placed is None:
            return None
        for segment in placed:
            block = self._blocks[segment.block]
            offset = segment.ptr - block.base
            bisect.insort(block.used, (offset, offset + segment.reserved))
        return placed

    def _fits_empty(self, sizes: Sequence[int], alignment: int) -> bool:
        return self._place(sizes, alignment, [[] for _ in self._blocks]) is not None

    def _place(
        self, sizes: Sequence[int], alignment: int, used: list[list[tuple[int, int]]]
    ) -> list[Segment] | None:
        """First-fit placement of every size on copies of the blocks' ``used`` lists."""
        placed = []
        for size in sizes:
            reserved = segment_bytes(size)
            segment = self._place_one(size, reserved, alignment, used)
            if segment is None:
                return None
            placed.append(segment)
        return placed

    def _place_one(
        self, size: int, reserved: int, alignment: int, used: list[list[tuple[int, int]]]
    ) -> Segment | None:
        for index, block in enumerate(self._blocks):
            offset = block.find(reserved, alignment, used[index])
            if offset is not None:
                bisect.insort(used[index], (offset, offset + reserved))
                return Segment(block.base + offset, size, reserved, index)
        return None

"""The memory pool: the secondary-allocation rules, as properties (hypothesis) and examples."""

from __future__ import annotations

import threading
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from streamer.errors import BackendError
from streamer.runtime.acl.errors import AclError
from streamer.runtime.acl.pool import (
    ALIGN_MEDIA,
    ALIGN_MODEL,
    MemoryPool,
    Segment,
    align_up,
    footprint,
    segment_bytes,
)

pytestmark = pytest.mark.timeout(60)


class FakeAllocator:
    """Blocks at 64-byte-aligned (not always 128-aligned) addresses, like ``acl.rt.malloc``."""

    def __init__(self, fail_after: int | None = None) -> None:
        self.live: dict[int, int] = {}
        self._next = 0x10_0040
        self._fail_after = fail_after

    def alloc(self, nbytes: int) -> int:
        if self._fail_after is not None and len(self.live) >= self._fail_after:
            raise AclError(200000, "ACL_ERROR_BAD_ALLOC", "acl.rt.malloc")
        ptr = self._next
        self.live[ptr] = nbytes
        self._next = align_up(ptr + nbytes + 1, 64) + 64
        return ptr

    def free(self, ptr: int) -> None:
        del self.live[ptr]


def test_documented_rounding() -> None:
    """``ALIGN_UP(len, k) = ((len - 1) / k + 1) * k``; a piece takes ``ALIGN_UP(len, 32) + 32``."""
    assert [align_up(n, 32) for n in (1, 31, 32, 33, 64)] == [32, 32, 32, 64, 64]
    assert [segment_bytes(n) for n in (1, 32, 33, 100)] == [64, 64, 96, 160]
    assert footprint([1, 33], ALIGN_MODEL) == 64 + 128
    with pytest.raises(ValueError):
        align_up(0, 32)


def _check_invariants(pool: MemoryPool, live: list[Segment], alignment: dict[int, int]) -> None:
    blocks = {index: (block.base, block.size) for index, block in enumerate(pool._blocks)}
    spans = sorted((s.ptr, s.ptr + s.reserved) for s in live)
    for segment in live:
        base, size = blocks[segment.block]
        assert segment.ptr % alignment[segment.ptr] == 0
        assert segment.reserved == align_up(segment.nbytes, 32) + 32
        assert base <= segment.ptr and segment.ptr + segment.reserved <= base + size
    for (_, end), (start, _) in zip(spans, spans[1:], strict=False):
        assert end <= start, "two live segments overlap"


operations = st.lists(
    st.one_of(
        st.tuples(
            st.just("alloc"),
            st.lists(st.integers(1, 3000), min_size=1, max_size=4),
            st.sampled_from([ALIGN_MODEL, ALIGN_MEDIA]),
        ),
        st.tuples(st.just("free"), st.integers(0, 50), st.just(0)),
    ),
    max_size=60,
)


@settings(max_examples=150, deadline=None)
@given(operations, st.integers(1, 3), st.integers(256, 8192))
def test_alignment_bounds_no_overlap_and_reuse(ops: list, blocks: int, block_bytes: int) -> None:
    allocator = FakeAllocator()
    pool = MemoryPool(allocator, block_bytes, blocks)
    live: list[list[Segment]] = []
    alignment: dict[int, int] = {}
    for kind, arg, align in ops:
        if kind == "alloc":
            got = pool.try_alloc(arg, align)
            if got is not None:
                assert [s.nbytes for s in got] == arg
                alignment.update({s.ptr: align for s in got})
                live.append(got)
        elif live:
            pool.free(live.pop(arg % len(live)))
        _check_invariants(pool, [s for group in live for s in group], alignment)
    assert pool.segments_in_use == sum(len(group) for group in live)
    for group in live:
        pool.free(group)
    assert pool.segments_in_use == 0
    biggest = block_bytes - 128
    again = pool.try_alloc([biggest - 64], ALIGN_MODEL)
    assert again is not None, "freed space is reused: an empty pool takes a near-block segment"
    pool.close()
    assert allocator.live == {}


@settings(max_examples=100, deadline=None)
@given(st.lists(st.integers(1, 5000), min_size=1, max_size=5), st.integers(1, 4))
def test_footprint_holds_exactly_the_batches(sizes: list[int], slots: int) -> None:
    """A pool of ``slots`` blocks of ``footprint(sizes)`` takes ``slots`` batches, then is
    full, and takes one again after any batch is freed (what bounds the batches in flight)."""
    pool = MemoryPool(FakeAllocator(), footprint(sizes), slots)
    batches = [pool.try_alloc(sizes) for _ in range(slots)]
    assert all(batch is not None for batch in batches)
    assert pool.try_alloc(sizes) is None
    pool.free(batches[slots // 2] or [])
    assert pool.try_alloc(sizes) is not None
    pool.close()


def test_all_or_nothing() -> None:
    pool = MemoryPool(FakeAllocator(), 1024)
    assert pool.try_alloc([400, 400, 400]) is None
    assert pool.segments_in_use == 0
    assert pool.try_alloc([400, 400]) is not None


def test_full_pool_blocks_until_a_free() -> None:
    pool = MemoryPool(FakeAllocator(), footprint([1000]))
    first = pool.alloc([1000])
    released_at: list[float] = []

    def release() -> None:
        time.sleep(0.2)
        released_at.append(time.monotonic())
        pool.free(first)

    thread = threading.Thread(target=release)
    thread.start()
    second = pool.alloc([1000])
    assert released_at and time.monotonic() >= released_at[0]
    assert second[0].ptr == first[0].ptr, "the freed segment is reused"
    thread.join()
    pool.close()


def test_waiting_ends_on_cancel_or_close_and_impossible_sizes_fail_at_once() -> None:
    pool = MemoryPool(FakeAllocator(), footprint([1000]))
    pool.alloc([1000])
    cancelled = threading.Event()
    threading.Timer(0.1, cancelled.set).start()
    with pytest.raises(BackendError, match="closed while waiting"):
        pool.alloc([1000], cancelled=cancelled)
    with pytest.raises(ValueError, match="never fit"):
        pool.alloc([5000])
    threading.Timer(0.1, pool.close).start()
    with pytest.raises(BackendError):
        pool.alloc([1000])


def test_failed_block_allocation_frees_the_earlier_blocks() -> None:
    allocator = FakeAllocator(fail_after=2)
    with pytest.raises(AclError, match="BAD_ALLOC"):
        MemoryPool(allocator, 4096, 3)
    assert allocator.live == {}

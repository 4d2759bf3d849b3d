"""Per-source reordering before egress: each stream's results leave in arrival order.

Frames of one source can finish out of order once stages run in parallel (several model
replicas, chains). Each frame carries its stream key ``(source, epoch)`` and arrival index
``order`` (:class:`~streamer.scheduling.sources.SourceTracker`); :meth:`ReorderBuffer.push`
releases a frame once every earlier frame of its stream was released or reported lost
(:meth:`skip`). The window is bounded: when a stream holds more than ``window`` frames, or
its oldest held frame waited ``timeout_s``, the missing frames are given up on and the held
ones are released, so a lost frame cannot stall its source forever. Failed frames held do
not count towards the window (they can outrun any batch); only the timeout bounds them. The
places of dropped frames (:meth:`skip`) count towards neither: a ``drop_oldest`` queue drops
frames behind ones that may spend longer than ``timeout_s`` in a slow pipeline, and nothing
waits to be published until a result comes behind them; if none comes, they are given up on
after ``idle_evict_s``. A
frame that arrives after it was given up on is released at once (``late``): a result is
never thrown away. An end of stream, in its place in the order, waits for the stream's
frames given up on in the last ``timeout_s`` (they are still running), and what follows it
waits with it, so a subscriber that stops reading at the end of stream gets them too.

A stream is forgotten once the source tracker has forgotten its epoch (:meth:`close`: it
does so only when :meth:`released_through` says every frame it placed has left) and nothing
of it is held; a frame of it that still comes (one given up on) is then late, and so is
one of a stream the tracker no longer tracks (:attr:`ReorderBuffer.tracked`: it forgets a
source whose frame is stuck after ten idle times), which would otherwise open the stream
anew at order 0, give up on every order before its own and never be forgotten. So a stream
whose frames spend longer in the pipeline than the source's idle time is never forgotten
under them (its next result would have waited for orders long published).

Only the egress thread calls :meth:`push` and :meth:`expire`; :meth:`skip`, :meth:`close` and
:meth:`released_through` are thread-safe.
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from streamer.frames import EndOfStream, Frame

__all__ = ["ReorderBuffer"]

Item = Frame | EndOfStream
_SKIPPED: Any = object()


@dataclass(slots=True)
class _Stream:
    last_ns: int
    next_order: int = 0
    held: dict[int, Any] = field(default_factory=dict)
    held_at: dict[int, int] = field(default_factory=dict)
    """When each held frame or end of stream came (monotonic ns), oldest first: the timeout
    counts from the oldest one still held."""
    skipped_at: dict[int, int] = field(default_factory=dict)
    """When each held dropped frame's place came (monotonic ns), oldest first: they do not
    count towards the window or the timeout (a ``drop_oldest`` queue drops frames behind
    ones still running), only towards ``idle_evict_s``."""
    failed: int = 0
    """Entries of ``held`` that are failed frames: they do not count towards the window
    either. Frames failed before the model (a corrupt image) reach egress at the rate they
    arrive, however long an earlier frame's batch runs, so no window bounds them; the
    timeout does."""
    given_up: dict[int, int] = field(default_factory=dict)
    """Orders given up on and not come since -> when (monotonic ns), oldest first; kept for
    ``timeout_s``. An end of stream next in order waits while there are any."""
    closed: bool = False
    """Its source's tracker has forgotten this epoch: no frame of it is still to come."""


class ReorderBuffer:
    """Releases each stream's frames in ``order``.

    Args:
        window: frames a stream may hold while it waits for a missing one.
        timeout_s: longest the oldest held frame waits for a missing earlier one (s).
        idle_evict_s: how long a forgotten stream's frames are still taken as late (s).

    Attributes:
        window: as given; a reload that changes the chain sets it anew.
        tracked: whether the source tracker still tracks a stream ``(source, epoch)``
            (:meth:`~streamer.scheduling.sources.SourceTracker.tracks`); asked, from the
            egress thread, only for a stream this buffer does not hold. By default all are.
    """

    def __init__(self, window: int, timeout_s: float, idle_evict_s: float) -> None:
        self.window = window
        self.tracked: Callable[[tuple[str, int]], bool] = lambda key: True
        self._timeout_ns = int(timeout_s * 1e9)
        self._idle_ns = int(idle_evict_s * 1e9)
        self._streams: dict[tuple[str, int], _Stream] = {}
        # Streams forgotten while idle: anything of theirs still to come is late.
        self._forgotten: dict[tuple[str, int], int] = {}  # key -> when, monotonic ns
        self._skipped: list[tuple[tuple[str, int], int]] = []
        self._closed: list[tuple[str, int]] = []
        self._skip_lock = threading.Lock()
        self.gave_up = 0
        """Frames given up on: not released within the window or the timeout."""
        self.late = 0
        """Frames that arrived after they were given up on (released out of order)."""

    def skip(self, frame: Frame) -> None:
        """Report ``frame`` lost before egress (dropped); thread-safe."""
        if frame.order >= 0:
            with self._skip_lock:
                self._skipped.append(((frame.source, frame.epoch), frame.order))

    def close(self, key: tuple[str, int]) -> None:
        """The source tracker forgot the stream ``(source, epoch)``: forget it once nothing
        of it is held; thread-safe."""
        with self._skip_lock:
            self._closed.append(key)

    def released_through(self, key: tuple[str, int]) -> int:
        """How many of the stream's first orders have left it (released, reported dropped,
        or given up on); any thread. A stream not seen yet has 0, one forgotten all."""
        stream = self._streams.get(key)
        if stream is not None:
            return stream.next_order
        return sys.maxsize if key in self._forgotten else 0

    def push(self, item: Item) -> list[Item]:
        """Add a finished item; return what can be published now, in order."""
        if item.order < 0:
            return [item]
        now = time.monotonic_ns()
        released = self._apply_skips(now)
        stream = self._stream((item.source, item.epoch), now)
        if stream is None:
            self.late += 1
            return [*released, item]
        if item.order < stream.next_order:
            self.late += 1
            return [*released, item, *self._came(stream, item.order)]
        if item.order == stream.next_order and not stream.held and not _waits(stream, item):
            stream.next_order += 1
            released.append(item)
            return released
        self._hold(stream, item.order, item, now)
        stream.failed += _failed(item)
        released += self._drain(stream)
        if len(stream.held_at) - stream.failed > self.window:
            released += self._give_up(stream, now)
        return released

    def expire(self, now_ns: int | None = None) -> list[Item]:
        """Release what waited past ``timeout_s`` and forget idle streams; call it often."""
        now = time.monotonic_ns() if now_ns is None else now_ns
        released = self._apply_skips(now)
        for key, stream in list(self._streams.items()):
            released += self._expire_given_up(stream, now)
            released += self._expire_held(stream, now)
            if not stream.held and stream.closed:
                self._forgotten[key] = now
                del self._streams[key]
        for key, forgotten_ns in list(self._forgotten.items()):
            if now - forgotten_ns > self._idle_ns:
                del self._forgotten[key]
        return released

    def flush(self) -> list[Item]:
        """Release everything held, giving up on what is missing (at shutdown)."""
        now = time.monotonic_ns()
        released = self._apply_skips(now)
        for stream in self._streams.values():
            while stream.held:
                released += self._give_up(stream, now)
        self._streams.clear()
        return released

    def held(self) -> int:
        """Items waiting for an earlier one (a gauge)."""
        return sum(len(s.held) for s in self._streams.values())

    def _stream(self, key: tuple[str, int], now: int) -> _Stream | None:
        """The stream ``key``, opened if new; None if it was forgotten, by this buffer or
        by the tracker."""
        stream = self._streams.get(key)
        if stream is None:
            if key in self._forgotten or not self.tracked(key):
                return None
            stream = self._streams[key] = _Stream(now)
        stream.last_ns = now
        return stream

    @staticmethod
    def _hold(stream: _Stream, order: int, item: Any, now: int) -> None:
        stream.held[order] = item
        (stream.skipped_at if item is _SKIPPED else stream.held_at).setdefault(order, now)

    def _apply_skips(self, now: int) -> list[Item]:
        with self._skip_lock:
            skipped, self._skipped = self._skipped, []
            closed, self._closed = self._closed, []
        for key in closed:
            if (stream := self._streams.get(key)) is not None:
                stream.closed = True
        released: list[Item] = []
        for key, order in skipped:
            stream = self._stream(key, now)
            if stream is None:
                continue
            if order >= stream.next_order:
                self._hold(stream, order, _SKIPPED, now)
                released += self._drain(stream)
            else:
                released += self._came(stream, order)
        return released

    def _drain(self, stream: _Stream) -> list[Item]:
        released: list[Item] = []
        while (order := stream.next_order) in stream.held:
            item = stream.held[order]
            if _waits(stream, item):
                break
            del stream.held[order]
            stream.next_order += 1
            if item is _SKIPPED:
                del stream.skipped_at[order]
            else:
                del stream.held_at[order]
                stream.failed -= _failed(item)
                released.append(item)
        return released

    def _give_up(self, stream: _Stream, now: int) -> list[Item]:
        """Stop waiting for what is missing before the first held item, or, when that item
        is an end of stream, for the frames given up on before."""
        first = min(stream.held)
        if first == stream.next_order:
            stream.given_up.clear()
        self.gave_up += first - stream.next_order
        stream.given_up.update((order, now) for order in range(stream.next_order, first))
        stream.next_order = first
        return self._drain(stream)

    def _expire_held(self, stream: _Stream, now: int) -> list[Item]:
        """Give up on what is missing before held items that waited ``timeout_s`` (places
        alone ``idle_evict_s``), gap after gap; not while the next item is an end of stream
        that waits for frames given up on: they have ``timeout_s`` of their own."""
        released: list[Item] = []
        while stream.next_order not in stream.held and (
            _waited(stream.held_at, now, self._timeout_ns)
            or _waited(stream.skipped_at, now, self._idle_ns)
        ):
            released += self._give_up(stream, now)
        return released

    def _came(self, stream: _Stream, order: int) -> list[Item]:
        """A frame given up on came late or was dropped: what waited for it alone."""
        if stream.given_up.pop(order, None) is None or stream.given_up:
            return []
        return self._drain(stream)

    def _expire_given_up(self, stream: _Stream, now: int) -> list[Item]:
        """Stop waiting for frames given up on ``timeout_s`` ago."""
        given_up = stream.given_up
        if not given_up:
            return []
        while given_up:
            oldest = next(iter(given_up))
            if now - given_up[oldest] < self._timeout_ns:
                return []
            del given_up[oldest]
        return self._drain(stream)


def _waits(stream: _Stream, item: Any) -> bool:
    """Whether ``item``, next in order, waits: an end of stream behind frames given up on."""
    return isinstance(item, EndOfStream) and bool(stream.given_up)


def _waited(held_at: dict[int, int], now: int, limit_ns: int) -> bool:
    """Whether the oldest entry of ``held_at`` came ``limit_ns`` or more before ``now``."""
    return bool(held_at) and now - next(iter(held_at.values())) >= limit_ns


def _failed(item: Any) -> bool:
    """Whether ``item`` is a failed frame (its result is an error)."""
    return isinstance(item, Frame) and item.error is not None

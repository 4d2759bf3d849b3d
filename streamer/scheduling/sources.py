"""Per-source stream state: sequence checks, restarts, arrival order and idle eviction.

State is keyed by the ``source`` id of the header, never by connection, so a camera may
reconnect through another socket, or a producer process restart, and its stream goes on.

A producer may name its *run* (header ``run``, e.g. an id drawn at its start): ``seq`` is then
checked per run. A frame of a run the source has not had is a restart (counted, no gap); the
frames of the source's earlier runs still queued on the old connection, which ZeroMQ hands
over among the new run's, are checked against their own run's ``seq``, so none of them is
stale. A source keeps the :data:`MAX_RUNS` runs it had frames of last. Without ``run`` (one
run, ``None``), the old connection's frames read as far behind the new count: those behind
are dropped as ``stale_seq`` or taken as another restart.

Rules for the ``seq`` of a frame against the last accepted ``seq`` of its run, after RTP's
sequence number validation (RFC 3550, appendix A.1, with its ``MAX_DROPOUT`` = 3000,
``MAX_MISORDER`` = 100 and two sequential packets to resynchronise):

- ``last + 1``: in order.
- up to :data:`MAX_DROPOUT` above ``last + 1``: accepted; the frames in between are counted
  as a *gap*.
- ``0`` (also right after a 0: a producer that sent one frame and restarted, or an imagezmq
  source the reader forgot and numbers from 0 again), or more than :data:`MAX_DROPOUT` above
  ``last + 1``: the producer restarted (with a new counter): counted as a restart, no gap.
- less than :data:`MAX_MISORDER` below ``last``, or at it (a duplicate or a late frame):
  dropped with reason ``stale_seq``, since it could only be published out of order.
- further below: dropped as ``stale_seq`` too, but if the source's very next frame follows it
  (``seq + 1``) the producer restarted with a counter not at 0 (a camera that counts from 1,
  one that resumes a saved counter), and that frame is a restart. One stray late frame
  thus never restarts a stream, and a restarted producer loses one frame, not all of them
  until its counter passes the old one.

A restart changes only what ``seq`` is checked against: the frames keep their arrival order
(``order``), so results after a restart never overtake those before it. So does an end of
stream: it takes the next place in the order, and the source's next frame starts the ``seq``
count anew (any ``seq``; no gap, no restart) in the same order, so a producer that sends clip
after clip on one source id gets each clip's results, and its end of stream, before the next
clip's. A source forgotten (idle) begins a new *epoch* (numbered across all sources, so no
per-source history is kept) whose order starts at 0.

A frame whose header was refused (``bad_header``) with a source and an integer ``seq`` read
from it carries a ``seq`` nobody vouches for (any number, up to ``2**53`` and beyond; one
without, ``seq`` -1, is never admitted here and is published at once): it takes the next
place in its source's order (opening
the source's stream if it has none), so its error result is published in turn, but it moves
the source's ``seq`` state only when its ``seq`` is the next one expected (``last + 1``). Any
other refused ``seq`` (a jump, a repeat, a 0) sets no ``seq`` to check against, restarts
nothing, counts no gap and is never stale, so the frames after it are judged against the last
trusted ``seq``.

A source unseen for ``idle_evict_s`` is forgotten (its next frame starts a new epoch) once
every item placed in its epoch has left the reorder buffer (``released_through``): a source
whose frames are still in the pipeline (a batch waiting out a long ``max_delay_ms``, a slow
device) keeps its epoch, so its next frame, or its end of stream, still takes its place after
them. One idle :data:`FORCED_EVICTION_FACTOR` times as long is forgotten anyway (a frame lost
without a word must not pin its source forever). The reorder buffer is then told
(``on_forget``). ``source_restarted`` and ``source_evicted`` are logged at most 10 times per
10 s each (:class:`~streamer.log_budget.LogBudget`), the source id cut short
(:func:`~streamer.log_budget.logged`: an id may be 64 KiB); the counters count every one.

At most ``max_sources`` sources are tracked at once (``daemon.max_sources``), ended ones
included, until they are forgotten: a peer making up a new id per frame (a producer bug, a
hostile sender) would otherwise grow this state, and the reorder buffer's, without bound.
Beyond them a frame of a new source fails as ``too_many_sources`` (unless it failed already:
it keeps its reason) and takes no place in any stream, so it is published at once; an end of
stream of a source not tracked takes none either. Sources tracked go on as before, and a new
one is admitted once one is forgotten. ``too_many_sources`` is logged at most 10 times per
10 s, like the other two.
"""

from __future__ import annotations

import itertools
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import structlog

from streamer.config import DEFAULT_MAX_SOURCES
from streamer.errors import FrameError, Reason
from streamer.frames import EndOfStream, Frame
from streamer.log_budget import LogBudget, logged

__all__ = [
    "FORCED_EVICTION_FACTOR",
    "MAX_DROPOUT",
    "MAX_MISORDER",
    "MAX_RUNS",
    "SourceStats",
    "SourceTracker",
    "StreamKey",
]

_log = structlog.get_logger(__name__)

MAX_DROPOUT = 3000
"""Most frames missing in a forward jump of ``seq`` counted as a gap; more is a restart
(RFC 3550 A.1)."""
MAX_MISORDER = 100
"""Backward jumps of ``seq`` smaller than this are late or duplicate frames; larger ones may be
a restart, confirmed by the next frame (RFC 3550 A.1)."""
MAX_RUNS = 4
"""Producer runs a source keeps the ``seq`` of (the most recent ones): a frame of another run
forgets the one with the oldest frame."""
FORCED_EVICTION_FACTOR = 10
"""A source idle this many times ``idle_evict_s`` is forgotten even with items in flight."""

StreamKey = tuple[str, int]
"""``(source, epoch)``: one stream of a source."""


@dataclass(slots=True)
class _RunSeq:
    """The ``seq`` state of one producer run of a source."""

    last_seq: int | None = None  # the last trusted seq; None: the next frame starts anew
    restart_probe: int = -1  # the seq that confirms a restart below last_seq; -1 for none


@dataclass(slots=True)
class _Stream:
    epoch: int
    next_order: int
    last_seen_ns: int
    runs: dict[str | None, _RunSeq] = field(default_factory=dict)
    """By run id, the run with the oldest frame first; at most :data:`MAX_RUNS`."""
    ended: bool = False  # its end of stream came and no frame since


@dataclass(frozen=True)
class SourceStats:
    """Totals since start: missing frames in seq gaps, stale drops, restarts; and now: the
    live sources, and the sources held against ``max_sources`` (the live ones and those
    ended by their end of stream, until forgotten)."""

    seq_gaps: int
    stale: int
    restarts: int
    active_sources: int
    tracked_sources: int


class SourceTracker:
    """Thread-safe: every ingress thread calls :meth:`admit` / :meth:`end` for its frames.

    Args:
        idle_evict_s: forget a source after this many seconds without a frame, once its
            items have left (module docstring).
        released_through: how many of a stream's first items have left the pipeline (the
            reorder buffer's count); by default all of them.
        on_forget: told each stream forgotten.
        max_sources: sources tracked at once at most (module docstring).
    """

    def __init__(
        self,
        idle_evict_s: float,
        released_through: Callable[[StreamKey], int] = lambda key: sys.maxsize,
        on_forget: Callable[[StreamKey], None] = lambda key: None,
        max_sources: int = DEFAULT_MAX_SOURCES,
    ) -> None:
        self._idle_ns = int(idle_evict_s * 1e9)
        self._released_through = released_through
        self._on_forget = on_forget
        self._max_sources = max_sources
        self._lock = threading.Lock()
        self._streams: dict[str, _Stream] = {}
        self._epochs = itertools.count()
        self._gaps = self._stale = self._restarts = 0
        self._restart_lines = LogBudget("source_restarted")
        self._evict_lines = LogBudget("source_evicted")
        self._refuse_lines = LogBudget("too_many_sources")

    def admit(self, frame: Frame) -> bool:
        """Check ``frame.seq``, and set ``frame.epoch`` and ``frame.order`` if accepted.

        A frame whose header was refused gets its place but moves nothing unless its ``seq``
        is the next one expected; a frame of a new source while ``max_sources`` are tracked
        is failed (``too_many_sources``) and gets no place (see the module docstring).

        Returns:
            False when the frame is stale (the caller drops it as ``stale_seq``).
        """
        with self._lock:
            stream = self._streams.get(frame.source)
            if stream is None:
                if len(self._streams) >= self._max_sources:
                    self._refuse(frame)
                    return True
                stream = self._open(frame.source, frame.received_at_ns)
            if _refused(frame):
                run = stream.runs.get(frame.run)
                if run is None or run.last_seq is None or frame.seq != run.last_seq + 1:
                    self._place(frame, stream)
                    return True
            else:
                run = self._run(stream, frame)
            last = run.last_seq
            # No trusted seq (a new run, or the first frame after an end of stream): any.
            if last is not None and not self._follows(frame, run, last):
                return False
            run.last_seq, run.restart_probe, stream.ended = frame.seq, -1, False
            stream.last_seen_ns = frame.received_at_ns
            self._place(frame, stream)
            return True

    def _run(self, stream: _Stream, frame: Frame) -> _RunSeq:
        """Under the lock: the ``seq`` state of ``frame``'s run, made the most recent; a run
        the source has not had is a restart (unless it follows an end of stream), and
        forgets the oldest beyond :data:`MAX_RUNS`."""
        runs = stream.runs
        run = runs.pop(frame.run, None)
        if run is None:
            if runs and not stream.ended:
                self._restarted(frame, None)
            if len(runs) >= MAX_RUNS:
                del runs[next(iter(runs))]
            run = _RunSeq()
        runs[frame.run] = run
        return run

    def _follows(self, frame: Frame, run: _RunSeq, last: int) -> bool:
        """Under the lock: judge ``frame.seq`` after the trusted ``last`` of its run (module
        docstring), counting a restart, a gap or a stale frame; False when it is stale."""
        if _restarts(frame.seq, last, run.restart_probe):
            self._restarted(frame, last)
        elif frame.seq <= last:
            self._stale += 1
            far = last - frame.seq >= MAX_MISORDER
            run.restart_probe = frame.seq + 1 if far else -1
            return False
        else:
            self._gaps += frame.seq - last - 1
        return True

    def _restarted(self, frame: Frame, last: int | None) -> None:
        """Under the lock: count a restart of ``frame``'s producer, and log it within the
        budget; ``last`` is the run's last ``seq``, None for a new run."""
        self._restarts += 1
        if (suppressed := self._restart_lines.take()) is not None:
            _log.info(
                "source_restarted",
                source=logged(frame.source),
                run=frame.run,
                last_seq=last,
                seq=frame.seq,
                suppressed=suppressed,
            )

    def _refuse(self, frame: Frame) -> None:
        """Under the lock: fail ``frame``, of a new source beyond ``max_sources``, and log it
        within the budget; a frame that failed already keeps its reason and is not logged."""
        if frame.error is not None:
            return
        detail = (
            f"{self._max_sources} sources are tracked (daemon.max_sources); a new one is "
            "admitted once one has been silent for daemon.source_idle_s"
        )
        frame.fail(FrameError(Reason.TOO_MANY_SOURCES, detail))
        if (suppressed := self._refuse_lines.take()) is not None:
            _log.warning(
                "too_many_sources",
                source=logged(frame.source),
                max_sources=self._max_sources,
                suppressed=suppressed,
            )

    def end(self, eos: EndOfStream) -> None:
        """Place ``eos`` after the source's last frame; its next frame, of any run (an
        ``eos`` that names none, or another, ends them all), starts the ``seq`` count anew,
        in the same order, and is no restart. An end of stream of a source not tracked
        (never seen, forgotten, or refused beyond ``max_sources``) gets no place and opens
        no stream."""
        with self._lock:
            stream = self._streams.get(eos.source)
            if stream is not None:
                self._place(eos, stream)
                stream.runs.clear()
                stream.ended = True

    def evict_idle(self, now_ns: int | None = None) -> list[str]:
        """Forget sources idle for longer than ``idle_evict_s`` whose items have left (module
        docstring); returns their ids."""
        now_ns = time.monotonic_ns() if now_ns is None else now_ns
        with self._lock:
            idle = {
                source: stream
                for source, stream in self._streams.items()
                if self._forgettable(source, stream, now_ns)
            }
            for source in idle:
                del self._streams[source]
        for source, stream in idle.items():
            self._on_forget((source, stream.epoch))
            # A source that said goodbye is no news.
            if not stream.ended and (suppressed := self._evict_lines.take()) is not None:
                _log.info("source_evicted", source=logged(source), suppressed=suppressed)
        return list(idle)

    def _forgettable(self, source: str, stream: _Stream, now_ns: int) -> bool:
        idle_ns = now_ns - stream.last_seen_ns
        if idle_ns <= self._idle_ns:
            return False
        left = self._released_through((source, stream.epoch)) >= stream.next_order
        return left or idle_ns > FORCED_EVICTION_FACTOR * self._idle_ns

    def tracks(self, key: StreamKey) -> bool:
        """Whether the stream ``(source, epoch)`` is its source's current one (any thread)."""
        source, epoch = key
        with self._lock:
            stream = self._streams.get(source)
            return stream is not None and stream.epoch == epoch

    def stats(self) -> SourceStats:
        with self._lock:
            active = sum(not stream.ended for stream in self._streams.values())
            tracked = len(self._streams)
            return SourceStats(self._gaps, self._stale, self._restarts, active, tracked)

    def _open(self, source: str, now_ns: int) -> _Stream:
        stream = _Stream(next(self._epochs), 0, now_ns)
        self._streams[source] = stream
        return stream

    @staticmethod
    def _place(item: Frame | EndOfStream, stream: _Stream) -> None:
        item.epoch, item.order = stream.epoch, stream.next_order
        stream.next_order += 1


def _restarts(seq: int, last: int, probe: int) -> bool:
    """Whether ``seq`` after ``last`` is a producer restart (module docstring); ``probe``
    is the seq that confirms one below ``last``, -1 for none."""
    return seq == 0 or seq > last + 1 + MAX_DROPOUT or seq == probe


def _refused(frame: Frame) -> bool:
    """Whether the frame's header was refused, so that its ``seq`` is not to be trusted."""
    return frame.error is not None and frame.error.reason == Reason.BAD_HEADER

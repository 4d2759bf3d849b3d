"""Replacing the running chain by a reloaded one without losing a frame (SIGHUP).

The whole chain is replaced, whatever changed in it (a model file, a plug-in, the number of
stages or replicas), and the in-band marker is :data:`~streamer.frames.STOP` itself:

1. the new chain is loaded and its threads started, all but its first batcher; a chain that
   fails to load or start is released and the old one goes on (the pipeline logs why);
2. under the admission queue's lock, once the frames being prepared are queued, the chain
   frames are prepared for is switched and STOP is queued (``AdmissionQueue.put_marker``
   with a switch): every frame before the marker was prepared for the old chain's first
   stage, every frame after it for the new one's;
3. the old chain drains stage by stage as at shutdown, its results going to the shared
   egress, and its models are closed (:func:`retire`); one that does not drain in time
   (``reload_timeout_s``, or ``drain_timeout_s`` after a stop request) is given up: the
   frames it holds are dropped (``reload_given_up``, or ``shutdown`` after a stop request)
   at that moment and reported to egress's reorder buffer, so their sources go on at once,
   and so are the frames still queued before its marker, with the marker
   (``AdmissionQueue.discard_through``): they were prepared for it. Its models stay loaded
   until its threads have ended (the pipeline's housekeeping then closes them), or the
   daemon stops (a thread of it may be stuck inside one);
4. only then does the new first batcher start and take the frames after the marker.

Frames before the marker thus finish on the old chain and frames after it run on the new one,
and no result of the new chain can overtake one of the old: each source stays in order
without leaning on egress's bounded reorder window. The price is a pause of one drain (the
old chain's latency) at each reload, during which admission fills and ``block`` ingresses
push back.
"""

from __future__ import annotations

import time
from typing import Protocol

import structlog

from streamer.errors import Reason
from streamer.release import close_logged
from streamer.scheduling.chain_run import ChainRun

__all__ = ["StopRequest", "retire"]

_log = structlog.get_logger(__name__)


class StopRequest(Protocol):
    """Whether the daemon was asked to stop (a ``threading.Event``, or the signal handlers'
    :class:`~streamer.signals.SignalFlag`)."""

    def is_set(self) -> bool:
        """Whether a stop was asked for."""


def retire(
    old: ChainRun, timeout_s: float, stop: StopRequest | None = None, grace_s: float = 0.0
) -> str | None:
    """Step 4: drain the old chain within ``timeout_s`` seconds and close its models; once
    ``stop`` is set (the daemon was asked to stop meanwhile), within ``grace_s`` seconds of
    then at most (the daemon's ``drain_timeout_s``).

    Returns:
        None when it drained and its models were closed (a model that failed to release is
        logged, ``release_failed``: the new chain serves on). When it did not drain in time,
        the reason the frames it held were dropped with: ``reload_given_up``, or
        ``shutdown`` when a stop cut the drain short; it is given up
        (:meth:`ChainRun.give_up`) and its models are left for the pipeline to close after
        its threads ended.
    """
    deadline = _Deadline(time.monotonic() + timeout_s, stop, grace_s)
    if old.drain(deadline.current):
        close_logged(old.close, "retired chain")
        return None
    stages = [s.name for s in old.stages]
    if deadline.stopped_at is None:
        dropped = old.give_up(Reason.RELOAD_GIVEN_UP)
        _log.error("reload_swap_stuck", stages=stages, timeout_s=timeout_s, frames=dropped)
        return Reason.RELOAD_GIVEN_UP
    dropped = old.give_up(Reason.SHUTDOWN)
    _log.warning("reload_drain_cut_short", stages=stages, drain_timeout_s=grace_s, frames=dropped)
    return Reason.SHUTDOWN


class _Deadline:
    """A drain's deadline (``time.monotonic()`` s) that moves to ``grace_s`` after the
    moment ``stop`` is first seen set, when that is sooner."""

    def __init__(self, deadline: float, stop: StopRequest | None, grace_s: float) -> None:
        self._deadline = deadline
        self._stop = stop
        self._grace_s = grace_s
        self.stopped_at: float | None = None

    def current(self) -> float:
        """The deadline now, ``time.monotonic()`` seconds."""
        if self._stop is not None and self._stop.is_set() and self.stopped_at is None:
            self.stopped_at = time.monotonic()
        if self.stopped_at is None:
            return self._deadline
        return min(self._deadline, self.stopped_at + self._grace_s)

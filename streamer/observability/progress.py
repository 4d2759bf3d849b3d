"""Progress of the pipeline, told apart from a wedge, and the status line that reports it.

A pipeline *makes progress* when a frame came out of its end since the last reading
(published, published as an error result, or dropped by egress because no socket took it:
``egress_blocked``), or when nothing is in flight: an idle daemon is healthy. Drops at the
door (``queue_full``, ``superseded``, ``stale_seq``) are not progress: a ``latest`` ingress
keeps dropping in front of a wedged model. The pipeline is *stalled* when frames have been in
flight with none coming out for longer than ``stall_timeout_s``: the daemon then stops its
systemd watchdog pings (systemd restarts it after ``WatchdogSec``) and ``/readyz`` fails,
until a frame comes out again.
"""

from __future__ import annotations

import structlog

from streamer.errors import Reason
from streamer.frames import OutcomeSnapshot

__all__ = ["ProgressMonitor", "status_line"]

_log = structlog.get_logger(__name__)


def _completed(snapshot: OutcomeSnapshot) -> int:
    """Frames that came out of the pipeline's end (see the module docstring)."""
    blocked = snapshot.dropped.get(Reason.EGRESS_BLOCKED, 0)
    return snapshot.published + snapshot.failed_total + blocked


class ProgressMonitor:
    """Reads successive outcome snapshots; control thread only.

    Args:
        stall_timeout_s: frames in flight with none completed for longer than this (s) is a
            stall.
        now_s: the current ``time.monotonic()`` (s).
    """

    def __init__(self, stall_timeout_s: float, now_s: float) -> None:
        self._stall_timeout_s = stall_timeout_s
        self._completed = 0
        self._progress_at_s = now_s
        self._stalled = False
        self._rate_completed = 0
        self._rate_at_s = now_s

    @property
    def stalled(self) -> bool:
        """True while the pipeline is stalled (see the module docstring)."""
        return self._stalled

    def stalled_for_s(self, now_s: float) -> float:
        """Seconds since the last progress while stalled, else 0."""
        return now_s - self._progress_at_s if self._stalled else 0.0

    def state(self, now_s: float) -> str:
        """``running``, or ``stalled N s`` while stalled (for the status line)."""
        return f"stalled {self.stalled_for_s(now_s):.0f} s" if self._stalled else "running"

    def update(self, snapshot: OutcomeSnapshot, now_s: float) -> None:
        """Take a new reading; logs ``pipeline_stalled`` / ``pipeline_progressing`` on change.

        Args:
            snapshot: the current outcome counts.
            now_s: the current ``time.monotonic()`` (s).
        """
        completed = _completed(snapshot)
        if completed > self._completed or snapshot.in_flight <= 0:
            self._progress_at_s = now_s
        self._completed = completed
        stalled = now_s - self._progress_at_s > self._stall_timeout_s
        if stalled and not self._stalled:
            _log.warning(
                "pipeline_stalled",
                in_flight=snapshot.in_flight,
                stalled_for_s=round(now_s - self._progress_at_s, 1),
            )
        elif self._stalled and not stalled:
            _log.info("pipeline_progressing")
        self._stalled = stalled

    def rate_per_s(self, snapshot: OutcomeSnapshot, now_s: float) -> float:
        """Frames completed per second since the previous call (or since start).

        Args:
            snapshot: the current outcome counts.
            now_s: the current ``time.monotonic()`` (s).
        """
        completed, elapsed_s = _completed(snapshot), now_s - self._rate_at_s
        rate = (completed - self._rate_completed) / elapsed_s if elapsed_s > 0 else 0.0
        self._rate_completed, self._rate_at_s = completed, now_s
        return rate


def status_line(state: str, snapshot: OutcomeSnapshot, frames_per_s: float) -> str:
    """One ASCII line for systemd's ``STATUS=``.

    Example: ``running: 29.7 frames/s, 3 in flight; received 1200, published 1190, failed 2,
    dropped 5``.

    Args:
        state: ``running``, ``stalled N s`` (:meth:`ProgressMonitor.state`) or ``stopped``;
            while a reload runs, followed by it (``running, reload loading for 45 s``).
        snapshot: the current outcome counts.
        frames_per_s: recent throughput (frames completed per second).
    """
    return (
        f"{state}: {frames_per_s:.1f} frames/s, {snapshot.in_flight} in flight; "
        f"received {snapshot.received}, published {snapshot.published}, "
        f"failed {snapshot.failed_total}, dropped {snapshot.dropped_total}"
    )

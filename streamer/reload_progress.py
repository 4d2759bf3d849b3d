"""How far the reload under way has got, and the lines that say it still runs.

A reload (SIGHUP, ``RELOADING=1``) goes through three stages: ``reading`` the config file
(given up after ``daemon.reload_timeout_s``), ``loading`` the new chain's models, and
``swapping`` while the old chain drains (given up after ``reload_timeout_s``). The loading
has no bound and cannot be cancelled (pyACL's load holds the GIL, an onnxruntime session
is built in one call): a large model on a slow disk may take minutes, one on a hung mount
never ends, and every later reload waits for it. So the reload is not failed, but told:

- ``reload_in_progress`` (warning): ``reload_timeout_s`` after the reload began, then every
  ``reload_timeout_s`` while it loads or swaps, with ``running_s`` (since ``RELOADING=1``) and
  ``stage`` (a read has its own bound, and ends in ``reload_rejected`` when it is reached);
- ``reload_deferred`` (info): a SIGHUP came during the reload, which is acted on once it
  has ended; however many come meanwhile, one reload follows. At most 10 lines per 10 s.
"""

from __future__ import annotations

from enum import Enum

import structlog

from streamer.log_budget import LogBudget

__all__ = ["ReloadProgress", "ReloadStage"]

_log = structlog.get_logger(__name__)
_DEFERRED_LINES = LogBudget("reload_deferred")


class ReloadStage(str, Enum):
    """Where a reload stands."""

    READING = "reading"
    LOADING = "loading"
    SWAPPING = "swapping"


_WAITING_FOR = {
    ReloadStage.LOADING: "the new models' load, which cannot be cancelled (a hung mount? a "
    "slow disk?); a restart ends it",
    ReloadStage.SWAPPING: "the old chain's drain",
}


class ReloadProgress:
    """One reload's start and stage, and a SIGHUP that waits for its end.

    The control thread creates it as the reload begins and reads it; the reload's own
    thread moves the stage on (:meth:`enter`).

    Args:
        started_s: ``time.monotonic()`` as the reload began (s).
        report_every_s: seconds between two ``reload_in_progress`` lines, the first this long
            after ``started_s`` (``daemon.reload_timeout_s``).

    Attributes:
        started_s: as given.
        stage: where the reload stands, ``reading`` at first.
        deferred: whether a SIGHUP came during this reload: another reload follows it.
    """

    def __init__(self, started_s: float, report_every_s: float) -> None:
        self.started_s = started_s
        self.stage = ReloadStage.READING
        self.deferred = False
        self._every_s = report_every_s
        self._next_report_s = started_s + report_every_s

    def enter(self, stage: ReloadStage) -> None:
        """The reload reached ``stage``; any thread."""
        self.stage = stage

    def running_s(self, now_s: float) -> float:
        """Seconds since the reload began, at ``now_s`` (``time.monotonic()``)."""
        return now_s - self.started_s

    def describe(self, now_s: float) -> str:
        """The reload for systemd's ``STATUS=`` line, e.g. ``reload loading for 45 s``."""
        return f"reload {self.stage.value} for {self.running_s(now_s):.0f} s"

    def report(self, now_s: float) -> None:
        """Log ``reload_in_progress`` when one is due at ``now_s`` (``time.monotonic()``) and
        the reload is past its read: one line, however many periods went by since the last
        (a model load that held the GIL for minutes); control thread."""
        if now_s < self._next_report_s or self.stage is ReloadStage.READING:
            return
        periods = (now_s - self.started_s) // self._every_s
        self._next_report_s = self.started_s + (periods + 1) * self._every_s
        _log.warning(
            "reload_in_progress",
            running_s=round(self.running_s(now_s), 1),
            stage=self.stage.value,
            deferred=self.deferred,
            waiting_for=_WAITING_FOR[self.stage],
        )

    def defer(self, now_s: float) -> None:
        """A SIGHUP came at ``now_s`` (``time.monotonic()``): log ``reload_deferred`` and
        remember that another reload follows this one; control thread."""
        self.deferred = True
        if (suppressed := _DEFERRED_LINES.take()) is not None:
            _log.info(
                "reload_deferred",
                running_s=round(self.running_s(now_s), 1),
                stage=self.stage.value,
                suppressed=suppressed,
            )

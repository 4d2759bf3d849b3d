"""A budget for log lines that peers can multiply (one per source, per key, per frame).

A producer restarting on every frame, thousands of short-lived sources, or a client trying a
new CURVE key on every connection would each put a line in the journal per occurrence, and
journald's rate limit would then drop the daemon's other messages. Such an event passes
:meth:`LogBudget.take` at most ``lines`` times per ``interval_s``; the next line that passes
says how many were left out in between (``suppressed``). What no line has reported yet when
the daemon stops is in its final ``stopped`` line (:func:`take_unreported`), so ten lines of a
flood of ten thousand are never mistaken for the whole of it. A value a peer chooses the length
of (a source id, up to 64 KiB) goes into a line cut short (:func:`logged`).
"""

from __future__ import annotations

import threading
import time
from collections import Counter

__all__ = ["LOGGED_CHARS", "LogBudget", "logged", "take_unreported"]

LOGGED_CHARS = 256
"""Characters of a peer-chosen value (a source id) a log line shows at most."""

_BUDGETS: list[LogBudget] = []  # a few per component, kept for the final summary
_BUDGETS_LOCK = threading.Lock()


class LogBudget:
    """At most ``lines`` log lines of one event per ``interval_s``; thread-safe.

    Args:
        event: the event it budgets (its name in :func:`take_unreported`).
        lines: lines that pass per interval.
        interval_s: the interval (s, monotonic clock).
    """

    def __init__(self, event: str, lines: int = 10, interval_s: float = 10.0) -> None:
        self.event = event
        with _BUDGETS_LOCK:
            _BUDGETS.append(self)
        self._lines = lines
        self._interval_ns = int(interval_s * 1e9)
        self._lock = threading.Lock()
        self._window_start_ns = -self._interval_ns
        self._passed = 0
        self._suppressed = 0

    def take(self, now_ns: int | None = None) -> int | None:
        """Whether a line may be logged now: None if not (it is counted), else the number
        of lines left out since the last one that passed (log it as ``suppressed``)."""
        now_ns = time.monotonic_ns() if now_ns is None else now_ns
        with self._lock:
            if now_ns - self._window_start_ns >= self._interval_ns:
                self._window_start_ns, self._passed = now_ns, 0
            if self._passed >= self._lines:
                self._suppressed += 1
                return None
            self._passed += 1
            suppressed, self._suppressed = self._suppressed, 0
            return suppressed

    def take_unreported(self) -> int:
        """The lines left out since the last line that passed (none has reported them), and
        forget them."""
        with self._lock:
            suppressed, self._suppressed = self._suppressed, 0
            return suppressed


def take_unreported() -> dict[str, int]:
    """Lines left out that no line has reported yet, by event, over every live budget (the
    counts are then forgotten); events with none are left out."""
    with _BUDGETS_LOCK:
        budgets = list(_BUDGETS)
    totals: Counter[str] = Counter()
    for budget in budgets:
        totals[budget.event] += budget.take_unreported()
    return {event: count for event, count in sorted(totals.items()) if count}


def logged(value: str) -> str:
    """``value`` as a log line shows it: at most :data:`LOGGED_CHARS` characters, a longer
    one cut with its length said (a line of a 64 KiB source id, ten a second, would fill
    the journal, and journald splits lines over 48 KiB, which breaks their JSON)."""
    if len(value) <= LOGGED_CHARS:
        return value
    return f"{value[:LOGGED_CHARS]}… ({len(value)} characters)"

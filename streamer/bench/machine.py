"""How much CPU other processes took while a mode ran (the disturbance of a measurement),
and how much of the machine an unpaced daemon run left idle.

The machine's busy time (``/proc/stat``: everything but idle and iowait) less the CPU time of
the benchmark's own processes (this one, its finished children such as producers, and live
ones such as the daemon) is what the rest of the machine used. The benchmark waits a while
for a quiet machine before each run (:func:`wait_until_quiet`) and reports, for each run,
what other processes took meanwhile (load from other virtual machines on the same host is
not visible here; it shows only as rounds of one mode that differ).

An unpaced daemon run also reports the idle and iowait time of all CPUs from its first frame
sent to its last result, in cores (:func:`idle_cores`): what the daemon and its producer left
unused while there was work.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from streamer.bench.threads import thread_cpu_ns

__all__ = [
    "QUIET_CORES",
    "CpuSnapshot",
    "idle_cores",
    "machine_idle_s",
    "others_cores",
    "wait_until_quiet",
]

QUIET_CORES = 0.25
"""Other processes using less CPU than this (cores) leave the machine quiet enough to run."""
_QUIET_WINDOW_S = 0.5
_TICK_S = 1.0 / os.sysconf("SC_CLK_TCK")
_IDLE_FIELDS = (3, 4)  # idle, iowait (proc(5), the "cpu" line of /proc/stat)


@dataclass(frozen=True)
class CpuSnapshot:
    """CPU times at one moment, s.

    Attributes:
        wall_s: ``time.monotonic()``.
        machine_busy_s: all CPUs' non-idle time since boot.
        ours_s: this process, its waited-for children, and the live processes given.
    """

    wall_s: float
    machine_busy_s: float
    ours_s: float

    @classmethod
    def take(cls, live_pids: Iterable[int] = ()) -> CpuSnapshot:
        """Snapshot now, counting ``live_pids`` (running children) as ours."""
        times = os.times()
        ours = times.user + times.system + times.children_user + times.children_system
        ours += sum(sum(thread_cpu_ns(pid).values()) / 1e9 for pid in live_pids)
        return cls(time.monotonic(), _machine_times()[0], ours)


def others_cores(before: CpuSnapshot, after: CpuSnapshot) -> float | None:
    """CPU cores used by other processes between two snapshots; None if unreadable."""
    wall = after.wall_s - before.wall_s
    if wall <= 0 or after.machine_busy_s < 0:
        return None
    others = (after.machine_busy_s - before.machine_busy_s) - (after.ours_s - before.ours_s)
    return round(max(others, 0.0) / wall, 3)


def wait_until_quiet(max_wait_s: float, live_pids: Iterable[int] = ()) -> float:
    """Wait until other processes use less than :data:`QUIET_CORES` over half a second, for
    at most ``max_wait_s`` s (0: do not wait); returns the seconds waited.

    Args:
        max_wait_s: the longest wait, s.
        live_pids: the benchmark's running children (idle daemons), counted as its own.
    """
    start = time.monotonic()
    while time.monotonic() - start < max_wait_s:
        before = CpuSnapshot.take(live_pids)
        time.sleep(_QUIET_WINDOW_S)
        others = others_cores(before, CpuSnapshot.take(live_pids))
        if others is not None and others < QUIET_CORES:
            break
    return time.monotonic() - start


def machine_idle_s() -> float:
    """Idle and iowait CPU seconds of all CPUs since boot; -1.0 where /proc/stat is
    unreadable."""
    return _machine_times()[1]


def idle_cores(start_idle_s: float, end_idle_s: float, wall_s: float) -> float | None:
    """CPU cores left idle over ``wall_s`` seconds, from two :func:`machine_idle_s` readings
    taken that far apart; None if either was unreadable or no time passed."""
    if wall_s <= 0 or start_idle_s < 0 or end_idle_s < 0:
        return None
    return round(max(end_idle_s - start_idle_s, 0.0) / wall_s, 3)


def _machine_times() -> tuple[float, float]:
    """(non-idle, idle + iowait) CPU seconds of all CPUs since boot; (-1.0, -1.0) where
    /proc/stat is unreadable."""
    try:
        fields = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    except (OSError, ValueError):
        return -1.0, -1.0
    idle = sum(fields[i] for i in _IDLE_FIELDS)
    return (sum(fields[:8]) - idle) * _TICK_S, idle * _TICK_S  # user … steal; guest in user

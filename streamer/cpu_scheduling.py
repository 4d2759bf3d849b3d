"""The Linux CPU scheduling policy of the daemon's threads (``[daemon] cpu_scheduling_policy``).

Under full load on a CPU backend every core runs model executions, and each frame wakes
several small threads (ingress, batcher, dequeue, egress, ZeroMQ's I/O thread). Under the
usual policy (``SCHED_OTHER``) a waking thread preempts the running one at once. Measured
with BlazeFace on onnxruntime, 2 cores, carphone frames pushed as fast as ``block`` allows
(``voluntary_ctxt_switches`` and ``nonvoluntary_ctxt_switches`` of
``/proc/<pid>/task/<tid>/status``): the daemon's threads switched about 5 times per frame,
2 of them preemptions of an inference. ``SCHED_BATCH`` threads do not preempt on wakeup:
they run when the running thread's time slice ends and find several frames' work queued.
About 1.7 switches per frame, 0.5 of them preemptions; the small threads use 15-20 % less
CPU per frame, and the daemon's frames/s rose 2-3 % on average over 14 pairs of
alternating runs (less than the spread of single runs on a shared machine). The cost is
latency, and only while every core is busy: a waking thread then waits for a time slice to
end (a few ms). The threads' weight (nice value) is unchanged, so is their share of the CPU.

Sources: sched(7), SCHED_BATCH: "the scheduler will always assume that the thread is
CPU-intensive ... useful for workloads that are noninteractive, but do not want to lower
their nice value, and for workloads that want a deterministic scheduling policy without
interactivity causing extra preemptions (between the workload's tasks)"; Linux
``kernel/sched/fair.c``, ``check_preempt_wakeup``: "Batch and idle tasks do not preempt
non-idle tasks (their preemption is driven by the tick)".

A policy is a per-thread attribute that new threads inherit from the thread that creates
them. ``streamer run`` calls :func:`apply_cpu_scheduling_policy` on the main thread before
the daemon starts its threads; it sets every thread the process has then (native libraries
start some as they are imported), and the threads started later (the daemon's, ZeroMQ's
I/O threads, onnxruntime's thread pools, ACL's) inherit it.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from dataclasses import dataclass

import structlog

from streamer.config import CpuSchedulingPolicy

__all__ = ["PolicyChange", "apply_cpu_scheduling_policy", "log_policy_change"]

_log = structlog.get_logger(__name__)

_NAMES = {
    getattr(os, f"SCHED_{name.upper()}"): name
    for name in ("other", "batch", "idle", "fifo", "rr")
    if hasattr(os, f"SCHED_{name.upper()}")
}
"""Policy number → its name in systemd's ``CPUSchedulingPolicy=`` (where the OS has it)."""

_MAX_LISTINGS = 10
"""Passes over ``/proc/self/task`` for threads started while the others were being set."""


@dataclass(frozen=True)
class PolicyChange:
    """What :func:`apply_cpu_scheduling_policy` found and did.

    Attributes:
        was: the calling thread's policy before, by systemd's name (``other``, ``batch``,
            ``idle``, ``fifo``, ``rr``); empty where policies are not supported.
        not_set: why some or all threads keep their policy; None when every thread runs
            under the one asked for.
    """

    was: str
    not_set: str | None


def apply_cpu_scheduling_policy(policy: CpuSchedulingPolicy) -> PolicyChange:
    """Give every thread of the process, and so every thread started from now on, ``policy``.

    The calling thread is set first: if that is refused (a seccomp filter, or leaving
    ``SCHED_IDLE`` without ``RLIMIT_NICE``), nothing changes. A thread refused after it
    keeps its policy and the others get the new one; ``not_set`` says which.

    Args:
        policy: ``batch``, ``other`` or ``inherit`` (nothing is changed).

    Returns:
        The policy the calling thread had, and what could not be set. Never raises.
    """
    getter = getattr(os, "sched_getscheduler", None)
    setter = getattr(os, "sched_setscheduler", None)
    number = getattr(os, "SCHED_BATCH" if policy == "batch" else "SCHED_OTHER", None)
    was = "" if getter is None else _NAMES.get(getter(0), str(getter(0)))
    if policy == "inherit":
        return PolicyChange(was, None)
    if setter is None or number is None:  # not Linux
        return PolicyChange(was, "not supported here")
    try:
        setter(0, number, os.sched_param(0))  # 0: the calling thread (sched_setscheduler(2))
    except OSError as exc:
        return PolicyChange(was, str(exc))
    return PolicyChange(was, _set_other_threads(setter, number))


def _set_other_threads(
    setter: Callable[[int, int, os.sched_param], None], number: int
) -> str | None:
    """Set every other thread listed in ``/proc/self/task``, again until no new one shows
    up; why some keep theirs, or None."""
    done, refused = {threading.get_native_id()}, []
    for _ in range(_MAX_LISTINGS):
        try:
            new = {int(task) for task in os.listdir("/proc/self/task")} - done
        except OSError as exc:
            return f"the other threads cannot be listed ({exc}): they keep their policy"
        if not new:
            break
        for thread_id in sorted(new):
            done.add(thread_id)
            try:
                setter(thread_id, number, os.sched_param(0))
            except ProcessLookupError:  # a thread that ended meanwhile
                pass
            except OSError as exc:
                refused.append(f"thread {thread_id}: {exc}")
    return "; ".join(refused) or None


def log_policy_change(policy: CpuSchedulingPolicy, change: PolicyChange) -> None:
    """Say which CPU scheduling policy the daemon runs under: ``cpu_scheduling_policy`` (a
    warning when it replaced one the daemon was started with other than ``other``: chrt, a
    unit's ``CPUSchedulingPolicy=``), or ``cpu_scheduling_policy_not_set``; once logging is
    configured, which :func:`apply_cpu_scheduling_policy` comes before (its threads)."""
    in_force = change.was if policy == "inherit" else policy
    if change.not_set is not None:
        _log.warning(
            "cpu_scheduling_policy_not_set", policy=policy, was=change.was, error=change.not_set
        )
    elif change.was in ("other", in_force):
        _log.info("cpu_scheduling_policy", policy=in_force, was=change.was)
    elif change.was:  # empty: inherit where there are no policies
        _log.warning(
            "cpu_scheduling_policy",
            policy=policy,
            was=change.was,
            detail="replaces the policy the daemon was started with; "
            'cpu_scheduling_policy = "inherit" keeps it',
        )

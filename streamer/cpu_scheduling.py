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

Source: sched(7), "SCHED_BATCH: Scheduling batch processes" ("the scheduler will assume
that the thread is CPU-intensive ... this policy is useful for workloads that are
noninteractive, but do not want to lower their nice value").

A policy is a per-thread attribute that new threads inherit from the thread that creates
them. ``streamer run`` calls :func:`apply_cpu_scheduling_policy` on the main thread before
it starts any thread of its own; it sets every thread the process has then (native
libraries start some as they are imported), and the threads started later (the daemon's,
ZeroMQ's I/O threads, onnxruntime's thread pools, ACL's) inherit it.
"""

from __future__ import annotations

import contextlib
import os
import threading

from streamer.config import CpuSchedulingPolicy

__all__ = ["apply_cpu_scheduling_policy"]


def apply_cpu_scheduling_policy(policy: CpuSchedulingPolicy) -> str | None:
    """Give every thread of the process, and so every thread started from now on, ``policy``.

    Never raises: where the policy cannot be set (not Linux, or refused: a seccomp filter,
    or leaving ``SCHED_IDLE`` without ``RLIMIT_NICE``) the threads keep theirs.

    Args:
        policy: ``batch``, ``other`` or ``inherit`` (nothing is changed).

    Returns:
        None once every thread runs under ``policy``; else why not, for the log.
    """
    if policy == "inherit":
        return None
    setter = getattr(os, "sched_setscheduler", None)
    if setter is None:  # not Linux
        return "not supported here"
    number = os.SCHED_BATCH if policy == "batch" else os.SCHED_OTHER
    try:
        for thread_id in _thread_ids():
            with contextlib.suppress(ProcessLookupError):  # a thread that ended meanwhile
                setter(thread_id, number, os.sched_param(0))
    except OSError as exc:
        return str(exc)
    return None


def _thread_ids() -> list[int]:
    """The process's thread ids, the calling thread's (0: sched_setscheduler(2)) first."""
    try:
        others = [int(task) for task in os.listdir("/proc/self/task")]
    except OSError:  # no /proc: the calling thread, and the threads it starts, only
        others = []
    return [0, *(tid for tid in others if tid != threading.get_native_id())]

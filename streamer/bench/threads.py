"""CPU time of each thread of another process, and the Python names of those threads.

CPU time comes from ``/proc/<pid>/task/<tid>/schedstat`` (ns on a CPU; Linux), or from the
``utime + stime`` ticks of ``stat`` where schedstat is missing. Python thread names are not
visible to the OS (the kernel sees the process name), so they are read from a py-spy dump
(``py-spy dump --json``, which gives each thread's name and OS thread id); threads py-spy does
not list (ZeroMQ's I/O threads) keep their kernel name, e.g. ``ZMQbg/IO/0``.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

__all__ = ["py_spy_path", "thread_cpu_ns", "thread_names"]

_TICK_NS = 1e9 / os.sysconf("SC_CLK_TCK")
_PY_SPY_TIMEOUT_S = 30.0


def thread_cpu_ns(pid: int) -> dict[int, int]:
    """Thread id → CPU time so far, ns, for every live thread of ``pid`` (empty if gone)."""
    times: dict[int, int] = {}
    try:
        tasks = list(Path(f"/proc/{pid}/task").iterdir())
    except OSError:
        return times
    for task in tasks:
        cpu_ns = _task_cpu_ns(task)
        if cpu_ns is not None:
            times[int(task.name)] = cpu_ns
    return times


def _task_cpu_ns(task: Path) -> int | None:
    try:
        return int((task / "schedstat").read_text().split()[0])
    except (OSError, IndexError, ValueError):
        pass
    try:
        fields = (task / "stat").read_text().rpartition(")")[2].split()
    except OSError:
        return None
    return round((int(fields[11]) + int(fields[12])) * _TICK_NS)  # utime, stime (proc(5))


def thread_names(pid: int) -> dict[int, str]:
    """Thread id → name: Python's thread name where py-spy can read it, else the kernel's.

    Threads py-spy does not list (native ones: ZeroMQ's, onnxruntime's) get their kernel
    name and `` (native)``. Without py-spy (or without permission to trace ``pid``) every
    thread has its kernel name, which for Python threads is the process name.
    """
    python = _python_names(pid)
    suffix = " (native)" if python else ""
    names = {tid: _kernel_name(pid, tid) + suffix for tid in thread_cpu_ns(pid)}
    return {**names, **python}


def _kernel_name(pid: int, tid: int) -> str:
    try:
        return Path(f"/proc/{pid}/task/{tid}/comm").read_text().strip()
    except OSError:
        return "?"


def _python_names(pid: int) -> dict[int, str]:
    py_spy = py_spy_path()
    if py_spy is None:
        return {}
    command = [py_spy, "dump", "--pid", str(pid), "--json"]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=_PY_SPY_TIMEOUT_S)
        threads = json.loads(done.stdout) if done.returncode == 0 else []
    except (OSError, subprocess.TimeoutExpired, json.JSONDecodeError):
        return {}
    return {t["os_thread_id"]: t["thread_name"] for t in threads if t.get("thread_name")}


def py_spy_path() -> str | None:
    """The py-spy executable (beside this Python, or on PATH), or None."""
    beside = Path(os.path.dirname(sys.executable)) / "py-spy"
    return str(beside) if beside.is_file() else shutil.which("py-spy")

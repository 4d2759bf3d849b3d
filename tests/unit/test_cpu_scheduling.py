"""The daemon's CPU scheduling policy: every thread of the process, and those started later.

A policy set for the whole process would stay on the test runner's threads, so the cases
that set one run in a process of their own.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

from streamer.cpu_scheduling import apply_cpu_scheduling_policy

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux policies")

CHILD = """
import json, os, sys, threading
from streamer.cpu_scheduling import apply_cpu_scheduling_policy

if sys.argv[1] == "started-batch":  # as under chrt or a unit's CPUSchedulingPolicy=batch
    os.sched_setscheduler(0, os.SCHED_BATCH, os.sched_param(0))
started, done = threading.Event(), threading.Event()
earlier = threading.Thread(target=lambda: (started.set(), done.wait()))  # a library's
earlier.start()
started.wait()
not_set = apply_cpu_scheduling_policy(sys.argv[2])
later = []
thread = threading.Thread(target=lambda: later.append(os.sched_getscheduler(0)))
thread.start()
thread.join()
policies = {
    "not_set": not_set,
    "caller": os.sched_getscheduler(0),
    "earlier": os.sched_getscheduler(earlier.native_id),
    "later": later[0],
}
done.set()
print(json.dumps(policies))
"""


def policies_after(start: str, policy: str) -> dict[str, object]:
    """In a new process started under ``start`` (``started-batch`` or ``started-other``),
    with one thread already running: apply ``policy``, and the policies it leaves."""
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(CHILD), start, policy],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    result: dict[str, object] = json.loads(done.stdout)
    return result


def test_batch_reaches_the_caller_the_threads_running_and_those_started_later() -> None:
    batch = os.SCHED_BATCH
    assert policies_after("started-other", "batch") == {
        "not_set": None,
        "caller": batch,
        "earlier": batch,
        "later": batch,
    }


def test_other_undoes_a_batch_start_and_inherit_keeps_it() -> None:
    other, batch = os.SCHED_OTHER, os.SCHED_BATCH
    assert policies_after("started-batch", "other") == {
        "not_set": None,
        "caller": other,
        "earlier": other,
        "later": other,
    }
    assert policies_after("started-batch", "inherit") == {
        "not_set": None,
        "caller": batch,
        "earlier": batch,
        "later": batch,
    }


def test_a_refused_policy_says_why_and_changes_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*_: object) -> None:
        raise PermissionError(1, "Operation not permitted")

    before = os.sched_getscheduler(0)
    monkeypatch.setattr(os, "sched_setscheduler", refuse)  # as a seccomp filter answers
    assert apply_cpu_scheduling_policy("batch") == "[Errno 1] Operation not permitted"
    assert os.sched_getscheduler(0) == before


def test_where_policies_do_not_exist_it_says_so(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delattr(os, "sched_setscheduler")  # as on macOS
    assert apply_cpu_scheduling_policy("other") == "not supported here"

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

from streamer.cpu_scheduling import PolicyChange, apply_cpu_scheduling_policy

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="Linux policies")

CHILD = """
import json, os, sys, threading
from streamer.cpu_scheduling import PolicyChange, apply_cpu_scheduling_policy

start, policy, refuse_earlier = sys.argv[1], sys.argv[2], len(sys.argv) > 3
started_under = os.SCHED_BATCH if start == "started-batch" else os.SCHED_OTHER
os.sched_setscheduler(0, started_under, os.sched_param(0))  # batch: as chrt -b 0 would
started, done = threading.Event(), threading.Event()
earlier = threading.Thread(target=lambda: (started.set(), done.wait()))  # a library's
earlier.start()
started.wait()
if refuse_earlier:  # as a thread of another user, or one a seccomp filter guards
    real = os.sched_setscheduler

    def refusing(tid, *args):
        if tid == earlier.native_id:
            raise PermissionError(1, "Operation not permitted")
        real(tid, *args)

    os.sched_setscheduler = refusing
change = apply_cpu_scheduling_policy(policy)
later = []
thread = threading.Thread(target=lambda: later.append(os.sched_getscheduler(0)))
thread.start()
thread.join()
policies = {
    "was": change.was,
    "not_set": change.not_set and change.not_set.replace(str(earlier.native_id), "<earlier>"),
    "caller": os.sched_getscheduler(0),
    "earlier": os.sched_getscheduler(earlier.native_id),
    "later": later[0],
}
done.set()
print(json.dumps(policies))
"""


def policies_after(start: str, policy: str, *refuse: str) -> dict[str, object]:
    """In a new process started under ``start`` (``started-batch`` or ``started-other``),
    with one thread already running (whose change is refused with ``refuse``): apply
    ``policy``, and the policies it leaves."""
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(CHILD), start, policy, *refuse],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    result: dict[str, object] = json.loads(done.stdout)
    return result


def this_threads_policy() -> str:
    """The test thread's policy by name (``other`` unless the tests run under ``chrt``)."""
    names = {os.SCHED_OTHER: "other", os.SCHED_BATCH: "batch", os.SCHED_IDLE: "idle"}
    return names[os.sched_getscheduler(0)]


def test_batch_reaches_the_caller_the_threads_running_and_those_started_later() -> None:
    batch = os.SCHED_BATCH
    assert policies_after("started-other", "batch") == {
        "was": "other",
        "not_set": None,
        "caller": batch,
        "earlier": batch,
        "later": batch,
    }


def test_other_undoes_a_batch_start_and_inherit_keeps_it() -> None:
    other, batch = os.SCHED_OTHER, os.SCHED_BATCH
    assert policies_after("started-batch", "other") == {
        "was": "batch",
        "not_set": None,
        "caller": other,
        "earlier": other,
        "later": other,
    }
    assert policies_after("started-batch", "inherit") == {
        "was": "batch",
        "not_set": None,
        "caller": batch,
        "earlier": batch,
        "later": batch,
    }


def test_a_thread_refused_keeps_its_policy_and_is_named_the_others_change() -> None:
    assert policies_after("started-other", "batch", "refuse-earlier") == {
        "was": "other",
        "not_set": "thread <earlier>: [Errno 1] Operation not permitted",
        "caller": os.SCHED_BATCH,
        "earlier": os.SCHED_OTHER,
        "later": os.SCHED_BATCH,
    }


def test_a_refusal_for_the_calling_thread_changes_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*_: object) -> None:
        raise PermissionError(1, "Operation not permitted")

    before = os.sched_getscheduler(0)
    monkeypatch.setattr(os, "sched_setscheduler", refuse)  # as a seccomp filter answers
    change = apply_cpu_scheduling_policy("batch")
    assert change == PolicyChange(this_threads_policy(), "[Errno 1] Operation not permitted")
    assert os.sched_getscheduler(0) == before


@pytest.mark.parametrize("missing", ["sched_setscheduler", "SCHED_BATCH"])
def test_where_the_policy_does_not_exist_it_says_so(
    monkeypatch: pytest.MonkeyPatch, missing: str
) -> None:
    policy = this_threads_policy()
    monkeypatch.delattr(os, missing)  # macOS has neither; FreeBSD has no SCHED_BATCH
    assert apply_cpu_scheduling_policy("batch").not_set == "not supported here"
    assert apply_cpu_scheduling_policy("inherit") == PolicyChange(policy, None)

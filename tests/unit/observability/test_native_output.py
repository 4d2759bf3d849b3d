"""Native writes to descriptor 2 become budgeted log events, in a child process (the test
moves the child's descriptors, never pytest's)."""

from __future__ import annotations

import json
import subprocess
import sys

CHILD = """
import os, sys
from streamer.observability.logging import configure_logging
from streamer.observability.native_output import native_output_logged
configure_logging("info", "json")
with native_output_logged():
    for n in range(30):
        os.write(2, b"libfoo error: frame %d\\n" % n)
    print("python's own stderr", file=sys.stderr)
os.write(2, b"after the block\\n")
"""


def run_child(close_stderr: bool) -> subprocess.CompletedProcess[str]:
    command = CHILD
    if close_stderr:  # a service started with standard error closed
        command = "import os; os.close(2)\n" + CHILD
    return subprocess.run(
        [sys.executable, "-c", command], capture_output=True, text=True, timeout=60, check=True
    )


def test_native_lines_are_budgeted_events_and_python_keeps_its_stderr() -> None:
    child = run_child(close_stderr=False)
    events = [json.loads(line) for line in child.stdout.splitlines()]
    assert [e["line"] for e in events] == [f"libfoo error: frame {n}" for n in range(10)]
    assert {(e["event"], e["level"], e["suppressed"]) for e in events} == {
        ("native_output", "warning", 0)
    }
    assert child.stderr == "python's own stderr\nafter the block\n"


def test_a_process_started_with_stderr_closed_still_logs_native_lines() -> None:
    child = run_child(close_stderr=True)
    events = [json.loads(line) for line in child.stdout.splitlines()]
    assert len(events) == 10 and events[0]["line"] == "libfoo error: frame 0"
    assert child.stderr == ""

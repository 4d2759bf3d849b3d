"""The log's writer thread, in child processes whose standard output the test controls."""

from __future__ import annotations

import json
import subprocess
import sys

UNREAD = """
import structlog
from streamer.observability.log_writer import LOG_WRITER, QUEUED_LINES_MAX
from streamer.observability.logging import configure_logging
configure_logging("info", "json")
log = structlog.get_logger()
for n in range(3 * QUEUED_LINES_MAX):  # nobody reads: the pipe fills, then the queue
    log.info("line", n=n, padding="x" * 100)
print("dropped", LOG_WRITER.dropped > 0, file=__import__("sys").stderr)
"""


def test_logging_never_waits_for_a_reader_that_stopped_reading() -> None:
    """Every call returns while the pipe is full; what does not fit is dropped and counted;
    the process still exits cleanly (the writer thread blocked in a write holds no lock the
    interpreter needs at exit)."""
    child = subprocess.Popen(
        [sys.executable, "-c", UNREAD], stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    assert child.wait(timeout=120) == 0  # stdout is read only after the exit
    out, err = child.communicate()
    assert err == b"dropped True\n"
    *lines, _ = out.split(b"\n")  # the exit may cut the last line short
    numbers = [json.loads(line)["n"] for line in lines]
    assert numbers == list(range(len(numbers))) and 0 < len(numbers) < 30_000


ODD_STDOUT = """
import structlog
from streamer.observability.logging import configure_logging
configure_logging("info", "console")
structlog.get_logger().info("frame", source="caméra")
"""


def test_a_stdout_that_cannot_encode_a_source_id_gets_it_escaped() -> None:
    child = subprocess.run(
        [sys.executable, "-c", ODD_STDOUT],
        capture_output=True,
        env={"PYTHONIOENCODING": "ascii", "PATH": ""},
        timeout=60,
        check=True,
    )
    assert b"source=cam\\xe9ra" in child.stdout and child.stderr == b""


def test_a_process_started_with_stdout_closed_logs_to_nowhere_without_failing() -> None:
    command = (
        "import os; os.close(1)\n" + ODD_STDOUT + "print('done', file=__import__('sys').stderr)"
    )
    child = subprocess.run([sys.executable, "-c", command], capture_output=True, timeout=60)
    assert child.returncode == 0 and child.stderr == b"done\n", child.stderr

"""The log's writer thread, in child processes whose standard output the test controls."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

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


RESUMED = """
import fcntl, os, sys
import structlog
from streamer.observability.log_writer import LOG_WRITER, QUEUED_LINES_MAX
from streamer.observability.logging import configure_logging
fcntl.fcntl(1, fcntl.F_SETPIPE_SZ, 4096)
if sys.argv[1] == "nonblocking":  # as a supervisor may hand it over
    fcntl.fcntl(1, fcntl.F_SETFL, fcntl.fcntl(1, fcntl.F_GETFL) | os.O_NONBLOCK)
configure_logging("info", "json")
log = structlog.get_logger()
for n in range(int(sys.argv[2])):
    log.info("line", n=n)
print(LOG_WRITER.dropped, file=sys.stderr, flush=True)
sys.stdin.readline()  # the reader starts reading now
LOG_WRITER.flush(60)
log.info("after")
"""


def resumed(mode: str, lines: int) -> tuple[int, list[dict[str, object]]]:
    """A child logs ``lines`` lines into a 4 KiB pipe nobody reads, then the test reads it all:
    (the lines the child counted dropped, the events that came out)."""
    child = subprocess.Popen(
        [sys.executable, "-c", RESUMED, mode, str(lines)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert child.stderr is not None
    dropped = int(child.stderr.readline())
    out, _ = child.communicate("go\n", timeout=120)
    assert child.returncode == 0
    return dropped, [json.loads(line) for line in out.splitlines()]


def test_a_non_blocking_stdout_that_fills_up_loses_no_line() -> None:
    dropped, events = resumed("nonblocking", 2000)
    assert dropped == 0
    assert [e.get("n") for e in events] == [*range(2000), None]
    assert events[-1]["event"] == "after"


def test_where_lines_were_dropped_the_log_says_how_many() -> None:
    dropped, events = resumed("blocking", 30_000)
    assert dropped > 0
    (gap,) = [e for e in events if e["event"] == "log_lines_dropped"]
    assert gap["total"] == gap["dropped"] == dropped
    numbers = [e["n"] for e in events if e["event"] == "line"]
    assert numbers == sorted(numbers) and len(numbers) + dropped == 30_000
    assert "after" in [e["event"] for e in events[-2:]]  # the gap's line may come after it


NO_ROOM = """
import resource, signal, sys
import structlog
from streamer.observability.log_writer import LOG_WRITER
from streamer.observability.logging import configure_logging
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails with EFBIG
hard = resource.getrlimit(resource.RLIMIT_FSIZE)[1]
resource.setrlimit(resource.RLIMIT_FSIZE, (4000, hard))
configure_logging("info", "json")
log = structlog.get_logger()
for n in range(200):
    log.info("line", n=n)
    LOG_WRITER.flush(60)  # one write per line: the limit cuts one line, the rest fail
dropped = LOG_WRITER.dropped
resource.setrlimit(resource.RLIMIT_FSIZE, (hard, hard))  # room again
log.info("after")
LOG_WRITER.flush(60)
print(dropped, file=sys.stderr)
"""


def test_the_log_comes_back_when_its_file_has_room_again(tmp_path: Path) -> None:
    """A file that has no room (here a file-size limit: EFBIG, as ENOSPC on a full disk)
    loses the lines that do not fit, counted; the line it cut short is ended, and once
    there is room the log goes on with a ``log_lines_dropped`` line."""
    log_file = tmp_path / "daemon.log"
    with log_file.open("wb") as stdout:
        child = subprocess.run(
            [sys.executable, "-c", NO_ROOM], stdout=stdout, stderr=subprocess.PIPE, timeout=60
        )
    assert child.returncode == 0, child.stderr
    dropped = int(child.stderr)
    *whole, cut, after, gap = log_file.read_bytes().splitlines()
    numbers = [json.loads(line)["n"] for line in whole]
    # the line cut short is lost, so counted
    assert numbers == list(range(len(numbers))) and len(numbers) + dropped == 200
    assert cut.startswith(b'{"n": %d' % len(numbers)) and not cut.endswith(b"}")
    assert json.loads(after)["event"] == "after"
    assert json.loads(gap)["event"] == "log_lines_dropped"
    assert json.loads(gap)["dropped"] == dropped


def test_a_full_disk_drops_lines_without_stopping_the_process() -> None:
    """``/dev/full`` fails every write with ENOSPC: the lines are counted, none is retried
    forever, and the process exits cleanly."""
    command = ODD_STDOUT + (
        "from streamer.observability.log_writer import LOG_WRITER\n"
        "LOG_WRITER.flush(60)\n"
        "print(LOG_WRITER.dropped, file=__import__('sys').stderr)"
    )
    with open("/dev/full", "wb") as stdout:
        child = subprocess.run(
            [sys.executable, "-c", command], stdout=stdout, stderr=subprocess.PIPE, timeout=60
        )
    assert child.returncode == 0 and child.stderr == b"1\n", child.stderr

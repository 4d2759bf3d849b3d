"""tools/subscribe.py, tools/produce.py and tools/keygen.py as a user runs them: their
signals, files and usage errors, against real ZMQ sockets on loopback."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import cv2
import numpy as np
import pytest
import zmq

from streamer.bench.bench_config import free_port

ROOT = Path(__file__).resolve().parents[2]
SUBSCRIBE = [sys.executable, str(ROOT / "tools" / "subscribe.py")]
PRODUCE = [sys.executable, str(ROOT / "tools" / "produce.py")]
KEYGEN = [sys.executable, str(ROOT / "tools" / "keygen.py")]


@pytest.fixture
def xpub() -> Iterator[zmq.Socket[Any]]:
    """A publisher bound to a random loopback port, in a context of its own."""
    context: zmq.Context[Any] = zmq.Context()
    socket = context.socket(zmq.XPUB)
    socket.bind("tcp://127.0.0.1:*")
    yield socket
    socket.close(linger=0)
    context.term()


def _result(seq: int) -> list[bytes]:
    body = {"v": 1, "source": "cam", "seq": seq, "run": "r", "latency_ms": {"total": 1.0}}
    return [b"cam", json.dumps({**body, "detections": [], "error": None}).encode()]


def _start_subscriber(xpub: zmq.Socket[Any], *options: str) -> subprocess.Popen[bytes]:
    """tools/subscribe.py on ``xpub``'s endpoint, once its subscription arrived."""
    endpoint = xpub.getsockopt_string(zmq.LAST_ENDPOINT)
    command = [*SUBSCRIBE, "--endpoint", endpoint, "--idle-timeout", "0", *options]
    tool = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert xpub.poll(60_000), "it never subscribed"
    assert xpub.recv() == b"\x01"
    return tool


def _run(command: list[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(command, capture_output=True, text=True, timeout=120)


def test_subscribe_tool_on_sigterm_flushes_and_summarises_as_on_ctrl_c(
    xpub: zmq.Socket[Any], tmp_path: Path
) -> None:
    """SIGTERM killed it with no summary, and the --jsonl lines were in its buffer until
    exit: now each line is in the file as soon as written, and SIGTERM stops it as Ctrl-C
    does (summary printed; exit 1 only for an --expect-eos whose end of stream is missing)."""
    jsonl = tmp_path / "results.jsonl"
    tool = _start_subscriber(xpub, "--jsonl", str(jsonl), "--expect-eos", "cam")
    with tool:
        for seq in range(3):
            xpub.send_multipart(_result(seq))
        deadline = time.monotonic() + 30
        while len(jsonl.read_text().splitlines()) < 3:
            assert time.monotonic() < deadline, "the lines never reached the file"
            time.sleep(0.05)
        tool.send_signal(signal.SIGTERM)
        out, err = tool.communicate(timeout=60)
    assert tool.returncode == 1, err.decode()[-2000:]
    assert b"Error: no end of stream from 'cam': interrupted" in err
    assert json.loads(out[out.index(b"{") :])["per_source"] == {"cam": 3}
    assert [json.loads(line)["seq"] for line in jsonl.read_text().splitlines()] == [0, 1, 2]


def test_subscribe_tool_names_the_jsonl_file_it_cannot_write(xpub: zmq.Socket[Any]) -> None:
    """A write error was reported as a bare ``[Errno 28] No space left on device``."""
    tool = _start_subscriber(xpub, "--jsonl", "/dev/full", "--count", "1")
    with tool:
        xpub.send_multipart(_result(0))
        _, err = tool.communicate(timeout=60)
    assert tool.returncode == 1
    assert "Error: cannot write /dev/full: No space left on device" in err.decode()


@pytest.mark.parametrize("video", ["no-such-video.mp4", "not-a-video.mp4"])
def test_subscribe_tool_checks_the_video_to_annotate_before_opening_any_file(
    tmp_path: Path, video: str
) -> None:
    """An unknown or unreadable --annotate VIDEO truncated an existing --jsonl file first,
    then failed with exit 1 (or even started receiving, for a file OpenCV cannot read)."""
    (tmp_path / "not-a-video.mp4").write_text("not a video")
    jsonl = tmp_path / "kept.jsonl"
    jsonl.write_text('{"seq": 0}\n')
    command = [*SUBSCRIBE, "--endpoint", f"tcp://127.0.0.1:{free_port()}"]
    command += ["--annotate", str(tmp_path / video) if "not-a" in video else video]
    command += ["--out", str(tmp_path / "a.mp4"), "--jsonl", str(jsonl)]
    run = _run(command)
    assert run.returncode == 2, run.stderr[-2000:]
    assert "Invalid value for '--annotate'" in run.stderr
    assert jsonl.read_text() == '{"seq": 0}\n' and not (tmp_path / "a.mp4").exists()


@pytest.mark.parametrize(
    "options",
    [
        [*SUBSCRIBE, "--idle-timeout", "nan"],
        [*PRODUCE, "astronaut.png", "--fps", "nan"],
        [*PRODUCE, "astronaut.png", "--fps", "inf"],
        [*PRODUCE, "astronaut.png", "--send-timeout", "nan"],
        [*PRODUCE, "astronaut.png", "--close-timeout", "inf"],
        [*PRODUCE, "astronaut.png", "--close-timeout", "nan"],
    ],
)
def test_the_tools_refuse_a_value_that_is_not_finite(options: list[str]) -> None:
    """NaN and infinity passed click's ranges: tracebacks, or a run that never idles out."""
    run = _run([*options, "--endpoint", f"tcp://127.0.0.1:{free_port()}"])
    assert run.returncode == 2, run.stderr[-2000:]
    assert "must be a finite number" in run.stderr and "Traceback" not in run.stderr


def test_produce_tool_refuses_an_empty_source() -> None:
    """``--source ""`` was silently the file stem."""
    run = _run([*PRODUCE, "astronaut.png", "--source", ""])
    assert run.returncode == 2 and "Invalid value for '--source': must not be empty" in run.stderr


def test_produce_tool_ends_the_run_at_an_unreadable_image(
    tmp_path: Path, astronaut: np.ndarray
) -> None:
    """It sends the end of stream, exits 1 naming the file and counting the frames sent."""
    cv2.imwrite(str(tmp_path / "a.jpg"), astronaut[:32, :32])
    (tmp_path / "b.jpg").write_bytes(b"\xff\xd8\xff\xe0")
    context: zmq.Context[Any] = zmq.Context()
    pull = context.socket(zmq.PULL)
    try:
        pull.bind("tcp://127.0.0.1:*")
        endpoint = pull.getsockopt_string(zmq.LAST_ENDPOINT)
        run = _run([*PRODUCE, str(tmp_path), "--endpoint", endpoint, "--no-progress"])
        received = [json.loads(pull.recv_multipart()[0]) for _ in range(2)]
    finally:
        pull.close(linger=0)
        context.term()
    assert run.returncode == 1, run.stderr[-2000:]
    assert f"Error: cannot read image {tmp_path / 'b.jpg'}; sent 1 frame(s)," in run.stderr
    assert [(h["seq"], h.get("eos", False)) for h in received] == [(0, False), (0, True)]


@pytest.mark.parametrize("name", ["../outside", "sub/inner", "", ".."])
def test_keygen_refuses_a_name_that_is_no_plain_file_name(tmp_path: Path, name: str) -> None:
    """``keygen.py DIR ../outside`` wrote its keys outside DIR."""
    run = _run([*KEYGEN, str(tmp_path / "keys"), "server", name])
    assert run.returncode == 2, run.stderr[-2000:]
    assert f"{name!r} is not a plain file name" in run.stderr
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("tool", [[*PRODUCE, "astronaut.png"], SUBSCRIBE])
@pytest.mark.parametrize("endpoint", ["nonsense", "tcp://", "127.0.0.1:5555"])
def test_the_tools_refuse_a_malformed_endpoint_as_a_usage_error(
    tool: list[str], endpoint: str
) -> None:
    """ZeroMQ refused it once the tool had started: exit 1, as for a daemon that is down."""
    run = _run([*tool, "--endpoint", endpoint])
    assert run.returncode == 2, run.stderr[-2000:]
    assert f"Invalid value for '--endpoint': {endpoint!r} is not a ZeroMQ endpoint" in run.stderr

"""tools/subscribe.py, tools/produce.py and tools/keygen.py as a user runs them: their
signals, files and usage errors, against real ZMQ sockets on loopback."""

from __future__ import annotations

import json
import os
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
from procfs import wait_opening_a_fifo

from streamer.bench.bench_config import free_port

ROOT = Path(__file__).resolve().parents[2]
SUBSCRIBE = [sys.executable, str(ROOT / "tools" / "subscribe.py")]
PRODUCE = [sys.executable, str(ROOT / "tools" / "produce.py")]
KEYGEN = [sys.executable, str(ROOT / "tools" / "keygen.py")]


def _bound(kind: int) -> Iterator[zmq.Socket[Any]]:
    """A socket of ``kind`` bound to a random loopback port, in a context of its own."""
    context: zmq.Context[Any] = zmq.Context()
    socket = context.socket(kind)
    socket.bind("tcp://127.0.0.1:*")
    yield socket
    socket.close(linger=0)
    context.term()


@pytest.fixture
def xpub() -> Iterator[zmq.Socket[Any]]:
    """A publisher, as a subscriber's daemon."""
    yield from _bound(zmq.XPUB)


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


def test_subscribe_tool_names_the_summary_file_it_cannot_write(xpub: zmq.Socket[Any]) -> None:
    """As for --jsonl: a full disk under --summary said only ``[Errno 28] No space left on
    device``, naming no file."""
    tool = _start_subscriber(xpub, "--summary", "/dev/full", "--count", "1")
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
    """NaN and infinity passed click's ranges: tracebacks, or a run that never idles out.
    (A range with a maximum refuses infinity itself.)"""
    run = _run([*options, "--endpoint", f"tcp://127.0.0.1:{free_port()}"])
    assert run.returncode == 2, run.stderr[-2000:]
    refused = ("must be a finite number", "inf is not in the range")
    assert any(why in run.stderr for why in refused) and "Traceback" not in run.stderr


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


@pytest.mark.parametrize("unreadable", ["camera", "first image"])
def test_produce_tool_fails_an_input_it_cannot_open_before_it_connects(
    tmp_path: Path, pull: zmq.Socket[Any], unreadable: str
) -> None:
    """A camera index no camera answers to (or a folder whose first image is unreadable)
    connected first, then sent an end of stream for a stream that never began."""
    (tmp_path / "a.jpg").write_bytes(b"\xff\xd8\xff\xe0")
    media = "97" if unreadable == "camera" else str(tmp_path)
    endpoint = pull.getsockopt_string(zmq.LAST_ENDPOINT)
    run = _run([*PRODUCE, media, "--endpoint", endpoint, "--no-progress"])
    assert run.returncode == 1, run.stderr[-2000:]
    error = "cannot open video or camera 97" if unreadable == "camera" else "cannot read image"
    assert f"Error: {error}" in run.stderr and "sent 0 frame(s)" not in run.stderr
    assert not pull.poll(500), pull.recv_multipart()


@pytest.mark.parametrize("content", [None, "a.gif"])
def test_produce_tool_refuses_a_folder_without_images_before_it_connects(
    tmp_path: Path, pull: zmq.Socket[Any], content: str | None
) -> None:
    """An empty folder (or one of GIFs) sent no frame, an end of stream, and exited 0."""
    if content is not None:
        (tmp_path / content).write_bytes(b"GIF89a")
    endpoint = pull.getsockopt_string(zmq.LAST_ENDPOINT)
    run = _run([*PRODUCE, str(tmp_path), "--endpoint", endpoint, "--no-progress"])
    assert run.returncode == 2, run.stderr[-2000:]
    assert f"Invalid value for 'INPUT': folder {str(tmp_path)!r} has no image files" in run.stderr
    assert not pull.poll(500), pull.recv_multipart()


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


@pytest.fixture
def pull() -> Iterator[zmq.Socket[Any]]:
    """A PULL socket, as a producer's daemon."""
    yield from _bound(zmq.PULL)


def _headers_to_eos(pull: zmq.Socket[Any]) -> list[dict[str, Any]]:
    """The headers of the messages ``pull`` receives, up to and including an end of stream."""
    headers: list[dict[str, Any]] = []
    while not headers or not headers[-1].get("eos"):
        assert pull.poll(60_000), f"no end of stream after {len(headers)} messages"
        headers.append(json.loads(pull.recv_multipart()[0]))
    return headers


def test_produce_tool_fails_a_truncated_video(
    pull: zmq.Socket[Any], tmp_path: Path, assets: dict[str, Path]
) -> None:
    """carphone.mp4 with the second half of its video data zeroed: 57 or so of its 120
    frames were sent and reported as ``sent 57 frames``, exit 0."""
    data = bytearray(assets["carphone.mp4"].read_bytes())
    start = data.index(b"mdat") + 4
    end = start - 8 + int.from_bytes(data[start - 8 : start - 4], "big")  # its box size
    data[(start + end) // 2 : end] = bytes(end - (start + end) // 2)
    (tmp_path / "carphone.mp4").write_bytes(data)
    endpoint = pull.getsockopt_string(zmq.LAST_ENDPOINT)
    run = _run([*PRODUCE, str(tmp_path / "carphone.mp4"), "--endpoint", endpoint])
    *frames, eos = _headers_to_eos(pull)
    assert run.returncode == 1, run.stderr[-2000:]
    sent = len(frames)
    assert 0 < sent < 118 and eos["seq"] == sent - 1
    assert (
        f"Error: {tmp_path / 'carphone.mp4'}: read {sent} of the 120 frames its container "
        f"announces: the video is truncated or corrupt; sent {sent} frame(s), none from seq "
        f"{sent} on; all of them left and so did the end of stream"
    ) in run.stderr


def test_produce_tool_refuses_a_video_it_cannot_open_once(
    tmp_path: Path, assets: dict[str, Path]
) -> None:
    """carphone.mp4 cut to 250 kB, its index lost: OpenCV's ``moov atom not found`` came
    twice (the video was opened to count, then to read), then the run failed after
    connecting. Now it is a usage error, as for subscribe.py's --annotate."""
    (tmp_path / "cut.mp4").write_bytes(assets["carphone.mp4"].read_bytes()[:250_000])
    command = [*PRODUCE, str(tmp_path / "cut.mp4"), "--send-timeout", "0.2"]
    run = _run([*command, "--endpoint", f"tcp://127.0.0.1:{free_port()}"])
    assert run.returncode == 2, run.stderr[-2000:]
    assert f"Invalid value for 'INPUT': cannot open video or camera '{tmp_path}" in run.stderr
    assert run.stderr.count("moov atom not found") <= 1


@pytest.mark.parametrize(
    ("command", "option"),
    [
        ([*PRODUCE, "/nonexistent/file.mp4"], "INPUT"),
        ([*SUBSCRIBE, "--annotate", "/nonexistent/file.mp4", "--out", "/tmp/a.mp4"], "--annotate"),
    ],
)
def test_the_tools_say_a_missing_file_does_not_exist(command: list[str], option: str) -> None:
    """Both said ``unknown media '/nonexistent/file.mp4'``, produce.py with exit 1."""
    run = _run([*command, "--endpoint", f"tcp://127.0.0.1:{free_port()}"])
    assert run.returncode == 2, run.stderr[-2000:]
    assert (
        f"Invalid value for '{option}': '/nonexistent/file.mp4' does not exist: no such file"
    ) in run.stderr


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ([*PRODUCE, "astronaut.png", "--fps", "1e-300"], "must be 0 or at least 0.001"),
        ([*PRODUCE, "astronaut.png", "--fps", "1e-10"], "must be 0 or at least 0.001"),
        ([*PRODUCE, "astronaut.png", "--send-timeout", "1e300"], "0<x<=86400.0"),
        ([*PRODUCE, "astronaut.png", "--close-timeout", "1e300"], "0<x<=86400.0"),
        ([*SUBSCRIBE, "--idle-timeout", "1e300"], "0<=x<=86400.0"),
    ],
)
def test_the_tools_refuse_an_extreme_number(options: list[str], message: str) -> None:
    """Finite but extreme, they overflowed a sleep or a poll: tracebacks, and for
    ``--fps 1e-10`` one frame sent with no end of stream."""
    run = _run([*options, "--endpoint", f"tcp://127.0.0.1:{free_port()}"])
    assert run.returncode == 2, run.stderr[-2000:]
    assert message in run.stderr and "Traceback" not in run.stderr


def test_produce_tool_refuses_a_frame_over_the_default_limits_unless_told(
    pull: zmq.Socket[Any], tmp_path: Path
) -> None:
    """A 9000-pixel-wide image went to the daemon, to fail there as too_large."""
    cv2.imwrite(str(tmp_path / "wide.png"), np.zeros((10, 9000, 3), np.uint8))
    command = [*PRODUCE, str(tmp_path / "wide.png"), "--no-progress"]
    command += ["--endpoint", pull.getsockopt_string(zmq.LAST_ENDPOINT)]
    refused = _run(command)
    assert refused.returncode == 1, refused.stderr[-2000:]
    assert "wide.png: the daemon would refuse frame 0: too_large: image is 9000x10" in (
        refused.stderr
    )
    assert [h["eos"] for h in _headers_to_eos(pull)] == [True]
    sent = _run([*command, "--no-size-limits"])
    assert sent.returncode == 0, sent.stderr[-2000:]
    assert len(_headers_to_eos(pull)) == 2


def test_produce_tool_on_sigterm_ends_as_on_ctrl_c(pull: zmq.Socket[Any]) -> None:
    """SIGTERM killed it, with no end of stream; now it ends the stream as Ctrl-C does."""
    command = [*PRODUCE, "astronaut.png", "--loop", "0", "--fps", "20", "--no-progress"]
    command += ["--endpoint", pull.getsockopt_string(zmq.LAST_ENDPOINT)]
    with subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE) as tool:
        for _ in range(3):  # it is sending
            assert pull.poll(60_000), "the tool sent nothing"
            pull.recv_multipart()
        tool.send_signal(signal.SIGTERM)
        _, err = tool.communicate(timeout=60)
        eos = _headers_to_eos(pull)[-1]
    assert tool.returncode == 1, err.decode()[-2000:]
    assert b"Aborted!" in err and eos["eos"] and eos["seq"] >= 1


def test_produce_tool_on_sigterm_while_its_video_opens_ends_at_once(tmp_path: Path) -> None:
    """A video that does not open (a FIFO nobody writes, a file on a hung mount): OpenCV's
    open blocked the main thread, where Python runs signal handlers, and SIGTERM went
    unseen."""
    fifo = tmp_path / "camera.mp4"
    os.mkfifo(fifo)
    command = [*PRODUCE, str(fifo), "--endpoint", f"tcp://127.0.0.1:{free_port()}"]
    with subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE) as tool:
        try:
            wait_opening_a_fifo(tool.pid)
            tool.send_signal(signal.SIGTERM)
            _, err = tool.communicate(timeout=30)
        finally:
            tool.kill()
    assert tool.returncode == 1, err.decode()[-2000:]
    assert err.decode().strip() == "Aborted!"


def test_produce_tool_gives_no_rate_for_one_frame(pull: zmq.Socket[Any]) -> None:
    """One image sent: "sent 1 frames ... (0.0 fps)" read as a rate of nothing."""
    endpoint = pull.getsockopt_string(zmq.LAST_ENDPOINT)
    run = _run([*PRODUCE, "astronaut.png", "--endpoint", endpoint, "--no-progress"])
    assert run.returncode == 0, run.stderr
    header = json.loads(pull.recv_multipart()[0])
    assert (header["seq"], json.loads(pull.recv_multipart()[0])["eos"]) == (0, True)
    assert run.stdout.startswith("sent 1 frame (") and "fps" not in run.stdout, run.stdout


@pytest.mark.parametrize("tool", [PRODUCE, SUBSCRIBE])
def test_a_ctrl_c_while_a_tool_imports_is_aborted_not_a_traceback(tool: list[str]) -> None:
    """Interrupted while it imports OpenCV and ZeroMQ (about half a second), the tool ended
    with a KeyboardInterrupt traceback from inside an import; now as after its imports:
    ``Aborted!`` and exit 1. ``-X importtime`` says when its own imports have begun."""
    command = [tool[0], "-X", "importtime", *tool[1:], "--endpoint", "tcp://127.0.0.1:1"]
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    assert process.stderr is not None
    lines = iter(process.stderr)
    next(line for line in lines if line.rsplit(b"|", 1)[-1].strip() == b"click")
    process.send_signal(signal.SIGINT)  # it imports streamer.clients: OpenCV, ZeroMQ
    err = process.stderr.read()
    process.stderr.close()
    assert process.wait(timeout=60) == 1, err.decode()[-2000:]
    assert b"Aborted!" in err and b"Traceback" not in err

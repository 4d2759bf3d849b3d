"""The producer and subscriber libraries against real ZMQ sockets on loopback."""

from __future__ import annotations

import json
import math
import random
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import cv2
import numpy as np
import pytest
import zmq
from zmq.auth.thread import ThreadAuthenticator
from zmq.utils.garbage import GarbageCollectorThread
from zmq.utils.monitor import recv_monitor_message

from streamer.bench.bench_config import free_port
from streamer.clients import (
    DEFAULT_FRAME_LIMITS,
    Annotator,
    ClientError,
    CurveClient,
    FrameLimits,
    MediaInput,
    Producer,
    SendTimeoutError,
    Subscriber,
    Summary,
    open_input,
    produce,
    result_line,
)
from streamer.config import IngressConfig
from streamer.transport.protocol import Header, parse_header

Context = zmq.Context[Any]
Socket = zmq.Socket[Any]
ROOT = Path(__file__).resolve().parents[2]
PRODUCE = ROOT / "tools" / "produce.py"

RUN_WITH_CTRL_C = (
    "import runpy, signal, sys; signal.signal(signal.SIGINT, signal.default_int_handler); "
    "sys.argv = sys.argv[1:]; runpy.run_path(sys.argv[0], run_name='__main__')"
)
"""Runs a tool with Ctrl-C raising KeyboardInterrupt even when the tests were started with
SIGINT ignored (as a shell starts a background job): a process that starts under an ignored
SIGINT keeps ignoring it, as Unix tools should."""


def _threads() -> set[threading.Thread]:
    """Live threads, less pyzmq's process-wide zero-copy garbage collector (started once)."""
    return {t for t in threading.enumerate() if not isinstance(t, GarbageCollectorThread)}


@pytest.fixture
def context() -> Iterator[Context]:
    """A private ZMQ context; the test fails if it leaves a socket open or a thread running."""
    threads = _threads()
    ctx: Context = zmq.Context()
    yield ctx
    terminator = threading.Thread(target=ctx.term, name="zmq-term")
    terminator.start()
    terminator.join(timeout=5)
    if terminator.is_alive():
        ctx.destroy(linger=0)
        terminator.join()
        pytest.fail("a socket was left open")
    assert _threads() == threads


@pytest.fixture
def sockets(context: Context) -> Iterator[list[Socket]]:
    """The sockets a test opens itself, closed with linger=0 at teardown."""
    opened: list[Socket] = []
    yield opened
    for socket in opened:
        socket.close(linger=0)


def _bind(context: Context, kind: int, opened: list[Socket]) -> tuple[Socket, str]:
    """A socket bound to a random loopback port, and its endpoint."""
    socket = context.socket(kind)
    opened.append(socket)
    socket.bind("tcp://127.0.0.1:*")
    return socket, socket.getsockopt_string(zmq.LAST_ENDPOINT)


# --- producer ----------------------------------------------------------------------------


def _drain(pull: Socket, pause_s: float = 0.0) -> list[tuple[Header, list[bytes]]]:
    """Every message up to and including end-of-stream, as (parsed header, raw parts);
    ``pause_s`` after each message makes a slow receiver."""
    messages = []
    while pull.poll(5000):
        parts = pull.recv_multipart()
        header = parse_header(parts[0])
        messages.append((header, parts))
        if header.eos:
            return messages
        time.sleep(pause_s)
    pytest.fail("no end-of-stream within 5 s")


def _decode(header: Header, payload: bytes) -> np.ndarray:
    if header.encoding == "raw":
        array = np.frombuffer(payload, np.dtype(header.fields["dtype"]))
        return array.reshape(header.fields["shape"])
    image = cv2.imdecode(np.frombuffer(payload, np.uint8), cv2.IMREAD_COLOR)
    assert image is not None
    return image


@pytest.mark.parametrize("encoding", ["jpeg", "png", "raw"])
def test_producer_sends_valid_frames_then_eos(
    context: Context,
    sockets: list[Socket],
    carphone_frames: list[np.ndarray],
    encoding: str,
) -> None:
    pull, endpoint = _bind(context, zmq.PULL, sockets)
    before = time.time()
    stats = produce(
        "carphone.mp4", endpoint, limit=5, encoding=encoding, meta={"k": 1}, context=context
    )
    *frames, (eos, eos_parts) = _drain(pull)

    assert [header.seq for header, _ in frames] == [0, 1, 2, 3, 4]
    assert (eos.source, eos.seq, len(eos_parts)) == ("carphone", 4, 1)
    assert len({eos.run, *(header.run for header, _ in frames)}) == 1 and eos.run
    assert stats.frames == 5
    assert stats.bytes_sent == sum(len(part) for _, parts in frames for part in parts)
    for (header, (_, payload)), original in zip(frames, carphone_frames[:5], strict=True):
        assert (header.source, header.encoding, header.meta) == ("carphone", encoding, {"k": 1})
        assert header.ts is not None and before <= header.ts <= time.time()
        image = _decode(header, payload)
        assert image.shape == original.shape
        if encoding != "jpeg":
            np.testing.assert_array_equal(image, original)


def test_producer_paces_frames_and_repeats_an_image(
    context: Context, sockets: list[Socket], astronaut: np.ndarray
) -> None:
    pull, endpoint = _bind(context, zmq.PULL, sockets)
    started = time.monotonic()
    stats = produce("astronaut.png", endpoint, fps=50, loop=10, source="still", context=context)
    elapsed = time.monotonic() - started
    *frames, _ = _drain(pull)

    assert stats.frames == len(frames) == 10
    assert elapsed >= 0.15 and stats.seconds >= 0.15
    assert {header.source for header, _ in frames} == {"still"}
    header, parts = frames[-1]
    assert _decode(header, parts[1]).shape == astronaut.shape


def test_producer_loops_over_a_folder_in_name_order(
    context: Context, sockets: list[Socket], tmp_path: Path, astronaut: np.ndarray
) -> None:
    names = ["b.png", "a.jpg", "c.PNG", "d.bmp", "e.tif", "f.TIFF", "g.webp"]
    for side, name in enumerate(names, start=1):
        cv2.imwrite(str(tmp_path / name), astronaut[: side * 10, : side * 10])
    (tmp_path / "notes.txt").write_text("not an image")
    pull, endpoint = _bind(context, zmq.PULL, sockets)
    stats = produce(
        tmp_path, endpoint, loop=2, limit=9, encoding="png", meta={"site": 7}, context=context
    )
    *frames, (eos, _) = _drain(pull)

    sizes = [_decode(header, parts[1]).shape[0] for header, parts in frames]
    assert sizes == [20, 10, 30, 40, 50, 60, 70, 20, 10]
    assert [header.meta for header, _ in frames[:7]] == [
        {"site": 7, "file": name} for name in sorted(names)
    ]
    assert stats.frames == 9 and eos.seq == 8 and eos.source == tmp_path.name


def test_producer_without_a_daemon_fails_clearly(context: Context) -> None:
    # Not a ZeroMQ socket bound and closed: ZeroMQ closes its listener in the background, so a
    # connect right after could still reach it and the frame would be taken.
    endpoint = f"tcp://127.0.0.1:{free_port()}"
    started = time.monotonic()
    with pytest.raises(ClientError, match=f"^no daemon is connected at {endpoint} ") as info:
        produce("astronaut.png", endpoint, send_timeout_s=0.2, context=context)
    assert time.monotonic() - started < 3
    assert str(info.value).endswith(
        "no message was taken for 0.2 s; sent 0 frame(s), none from seq 0 on; "
        "the end of stream was not sent"
    )


def test_an_interrupted_produce_tool_with_no_daemon_exits_at_once() -> None:
    """A send waiting for a daemon that is not there is no reason to wait out the send
    timeout after Ctrl-C (reported by a break test; the sends now wait in 100 ms slices)."""
    endpoint = f"tcp://127.0.0.1:{free_port()}"
    # A video: its decoder's threads (and libzmq's) may take the signal instead of the
    # thread blocked in the send.
    command = [sys.executable, "-c", RUN_WITH_CTRL_C, str(PRODUCE), "carphone.mp4"]
    command += ["--endpoint", endpoint, "--send-timeout", "120"]
    with subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE) as tool:
        assert tool.stderr is not None
        tool.stderr.read1(1)  # type: ignore[attr-defined]  # its progress bar: it is sending
        tool.send_signal(signal.SIGINT)
        out, err = tool.communicate(timeout=60)  # well before the send timeout
    assert tool.returncode == 1
    assert b"Aborted!" in err and b"no message was taken" not in err


def test_producer_misuse_is_a_clear_error(context: Context, astronaut: np.ndarray) -> None:
    """Bad arguments are refused before any socket exists (a negative timeout was a raw
    ZMQError, after the producer's own context was made and leaked); an empty image, or a
    send after close, is a ClientError (was a cv2.error / a raw ZMQError)."""
    endpoint = f"tcp://127.0.0.1:{free_port()}"
    for bad in ({"send_timeout_s": -1}, {"sndhwm": -5}, {"close_timeout_s": 0}, {"run": ""}):
        with pytest.raises(ValueError, match="must"):
            Producer(endpoint, source="cam", **bad)  # type: ignore[arg-type]
    producer = Producer(endpoint, source="cam", context=context)
    with pytest.raises(ClientError, match="an empty image"):
        producer.send(np.zeros((0, 10, 3), np.uint8))
    producer.close()
    with pytest.raises(ClientError, match="is closed"):
        producer.send(astronaut)
    with pytest.raises(ClientError, match="is closed"):
        producer.send_eos(wait=False)


SLOW_FRAMES = 10


def _slow_pull(context: Context, opened: list[Socket]) -> tuple[Socket, str]:
    """A bound PULL socket that holds one message and a 64 KiB TCP window, so what it does
    not read stays queued on the sender's side; and its endpoint."""
    pull = context.socket(zmq.PULL)
    opened.append(pull)
    pull.setsockopt(zmq.RCVHWM, 1)
    pull.setsockopt(zmq.RCVBUF, 64 * 1024)
    pull.bind("tcp://127.0.0.1:*")
    return pull, pull.getsockopt_string(zmq.LAST_ENDPOINT)


def test_produce_tool_delivers_every_queued_frame_to_a_slow_receiver(
    context: Context, sockets: list[Socket], assets: dict[str, Path]
) -> None:
    """``tools/produce.py`` queues 10 raw 512x512 frames (7.9 MB) at once and closes; the
    receiver holds one message and takes one every 0.15 s, so most frames are still queued
    at close (a 1 s LINGER used to discard them and the end-of-stream, and libzmq could
    still be reading a frame as the interpreter exited). Each run delivers every frame and
    the end-of-stream, and the process exits 0."""
    pull, endpoint = _slow_pull(context, sockets)
    for run in range(3):
        command = [sys.executable, str(ROOT / "tools" / "produce.py"), "astronaut.png"]
        command += ["--encoding", "raw", "--loop", str(SLOW_FRAMES), "--endpoint", endpoint]
        command += ["--source", f"run{run}", "--no-progress"]
        with subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE) as tool:
            assert pull.poll(60_000), "the tool sent nothing"  # its start-up, on a busy machine
            messages = _drain(pull, pause_s=0.15)
            out, err = tool.communicate(timeout=60)
        assert tool.returncode == 0, err.decode()[-2000:]
        assert [h.seq for h, _ in messages] == [*range(SLOW_FRAMES), SLOW_FRAMES - 1]
        assert messages[-1][0].eos and {h.source for h, _ in messages} == {f"run{run}"}
        assert f"sent {SLOW_FRAMES} frames".encode() in out


def test_an_interrupted_produce_tool_does_not_wait_to_send_its_end_of_stream(
    context: Context, sockets: list[Socket]
) -> None:
    """Ctrl-C while the daemon takes no more frames: neither the end of stream nor the
    queued frames are waited for (it used to wait the send timeout, then blame the daemon,
    and the close timeout)."""
    pull, endpoint = _slow_pull(context, sockets)
    command = [sys.executable, "-c", RUN_WITH_CTRL_C, str(PRODUCE), "astronaut.png"]
    command += ["--encoding", "raw", "--loop", "50", "--endpoint", endpoint]
    command += ["--send-timeout", "120", "--close-timeout", "120", "--no-progress"]
    with subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE) as tool:
        assert pull.poll(60_000), "the tool sent nothing"  # its start-up, on a busy machine
        time.sleep(0.5)  # its queue fills: it waits for room
        tool.send_signal(signal.SIGINT)
        out, err = tool.communicate(timeout=60)  # well before the send timeout
    assert tool.returncode == 1
    assert b"Aborted!" in err and b"no message was taken" not in err


def test_producer_reports_the_frames_it_gave_up_on(context: Context, sockets: list[Socket]) -> None:
    """A receiver that takes nothing: close waits ``close_timeout_s``, then discards the
    frames and the end-of-stream still queued, and the error names them."""
    _, endpoint = _slow_pull(context, sockets)
    with pytest.raises(ClientError) as info:
        produce(
            "astronaut.png", endpoint, loop=20, encoding="raw", close_timeout_s=0.3, context=context
        )
    found = re.match(
        r"sent 20 frame\(s\); the last (\d+) frame\(s\) \(seq (\d+)-19\) and the end of "
        r"stream, still queued 0.3 s after the last send, discarded: the daemon at ",
        str(info.value),
    )
    assert found is not None, info.value
    assert int(found[1]) == 20 - int(found[2]) and 0 < int(found[1]) < 20


def test_produce_tool_says_the_daemon_pushes_back_and_counts_what_it_gave_up(
    context: Context, sockets: list[Socket]
) -> None:
    """A daemon connected that takes no more frames is pushing back, not absent (the tool
    said "no daemon"), and the frames still queued when the tool gave up, discarded
    uncounted, are counted and named."""
    pull, endpoint = _slow_pull(context, sockets)
    command = [sys.executable, str(ROOT / "tools" / "produce.py"), "astronaut.png"]
    command += ["--encoding", "raw", "--loop", "100", "--endpoint", endpoint, "--no-progress"]
    command += ["--send-timeout", "0.3", "--close-timeout", "0.3"]
    run = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert run.returncode == 1 and run.stdout == "", run.stderr[-2000:]
    found = re.fullmatch(
        rf"Error: the daemon at {endpoint} is connected but no message was taken for 0.3 s: "
        r"it is pushing back \(.*\); sent (\d+) frame\(s\), none from seq (\d+) on; the last "
        r"(\d+) frame\(s\) \(seq (\d+)-(\d+)\), still queued 0.3 s after the last send, "
        r"discarded; the end of stream was not sent; allow a longer send timeout or send at "
        r"a lower fps\n",
        run.stderr,
    )
    assert found is not None, run.stderr[-2000:]
    sent, not_from, lost, first, last = (int(n) for n in found.groups())
    assert 0 < lost < sent == not_from == last + 1 == first + lost < 100


def test_producer_tells_a_lost_connection_from_a_daemon_pushing_back(
    context: Context, sockets: list[Socket]
) -> None:
    """The daemon goes away mid-stream: no daemon is connected any more, and what it had
    queued went with the connection, so none of it is reported as delivered."""
    pull, endpoint = _slow_pull(context, sockets)
    errors: list[ClientError] = []

    def send() -> None:
        try:
            produce("astronaut.png", endpoint, loop=0, send_timeout_s=3, context=context)
        except ClientError as exc:
            errors.append(exc)

    producer = threading.Thread(target=send, name="producer")
    producer.start()
    assert pull.poll(60_000), "nothing sent"
    sockets.remove(pull)
    pull.close(linger=0)
    producer.join(timeout=60)
    (error,) = errors
    assert str(error).startswith(f"the connection to the daemon at {endpoint} was lost, ")
    sent = int(re.findall(r"; sent (\d+) frame\(s\), none from seq \1 on; ", str(error))[0])
    assert sent > 0 and str(error).endswith("; the end of stream was not sent")


def test_open_input_resolves_every_kind(tmp_path: Path, assets: dict[str, Path]) -> None:
    video = open_input("carphone.mp4")
    assert video == MediaInput("video", path=assets["carphone.mp4"])
    assert (video.name, video.frame_count()) == ("carphone", 120)
    assert open_input(assets["chelsea.png"]).kind == "image"
    assert open_input(tmp_path) == MediaInput("folder", path=tmp_path)
    assert open_input("0") == open_input(0) == MediaInput("camera", camera=0)
    assert open_input(0).name == "camera0"


@pytest.mark.parametrize("spec", ["no-such-input.mp4", "/nonexistent/file.mp4"])
def test_open_input_says_a_missing_file_does_not_exist(spec: str) -> None:
    """It said ``unknown media '/nonexistent/file.mp4'``: a file that does not exist."""
    with pytest.raises(ClientError, match=f"^{re.escape(repr(spec))} does not exist: no such"):
        open_input(spec)


def test_a_folder_named_like_an_image_is_no_frame(
    context: Context, sockets: list[Socket], tmp_path: Path, astronaut: np.ndarray
) -> None:
    """``dir/sub.png``, a folder, was taken as an image: ``cannot read image``."""
    cv2.imwrite(str(tmp_path / "a.png"), astronaut[:16, :16])
    (tmp_path / "sub.png").mkdir()
    pull, endpoint = _bind(context, zmq.PULL, sockets)
    media = open_input(tmp_path)
    assert media.frame_count() == produce(media, endpoint, context=context).frames == 1
    assert [header.meta for header, _ in _drain(pull)[:-1]] == [{"file": "a.png"}]


def _mjpeg_video(path: Path, frames: int, corrupt_last: int) -> None:
    """A ``frames``-frame MJPEG AVI (its index announces them all) whose last
    ``corrupt_last`` frames are zeroed: OpenCV's reading stops at the first of them."""
    noise = np.random.default_rng(0).integers(0, 255, (frames, 48, 64, 3), dtype=np.uint8)
    writer = cv2.VideoWriter(str(path), cv2.VideoWriter_fourcc(*"MJPG"), 10, (64, 48))
    for image in noise:
        writer.write(image)
    writer.release()
    data = bytearray(path.read_bytes())
    starts = [m.start() for m in re.finditer(b"\xff\xd8\xff", data)]  # JPEG SOI
    assert len(starts) == frames
    for start in starts[len(starts) - corrupt_last :]:
        data[start : start + 600] = bytes(600)
    path.write_bytes(data)


def test_produce_ends_the_run_at_a_truncated_video(
    context: Context, sockets: list[Socket], tmp_path: Path
) -> None:
    """A video whose frames stop before the count its container announces was sent in part
    and reported as a success; now the run ends as at an unreadable image, end of stream
    sent."""
    _mjpeg_video(tmp_path / "v.avi", frames=10, corrupt_last=3)
    pull, endpoint = _bind(context, zmq.PULL, sockets)
    with pytest.raises(ClientError) as info:
        produce(tmp_path / "v.avi", endpoint, context=context)
    *frames, (eos, _) = _drain(pull)
    assert len(frames) == 7 and eos.eos and eos.seq == 6
    assert str(info.value) == (
        f"{tmp_path / 'v.avi'}: read 7 of the 10 frames its container announces: the video "
        "is truncated or corrupt; sent 7 frame(s), none from seq 7 on; all of them left and "
        "so did the end of stream"
    )


def test_produce_takes_a_video_two_frames_short_as_complete(
    context: Context, sockets: list[Socket], tmp_path: Path
) -> None:
    """Real files often end a frame or two short of their container's count."""
    _mjpeg_video(tmp_path / "v.avi", frames=10, corrupt_last=2)
    pull, endpoint = _bind(context, zmq.PULL, sockets)
    assert produce(tmp_path / "v.avi", endpoint, loop=2, context=context).frames == 16
    assert len(_drain(pull)) == 17


# --- subscriber ---------------------------------------------------------------------------


def _result(
    source: str, seq: int, *, faces: int = 1, total_ms: float = 5.0, run: str | None = None
) -> list[bytes]:
    detections = [{"box": [40, 30, 50, 60], "score": 0.9, "keypoints": [[60, 50]]}] * faces
    body = {"v": 1, "source": source, "seq": seq, "run": run, "latency_ms": {"total": total_ms}}
    body.update(detections=detections, error=None)
    return [source.encode(), json.dumps(body).encode()]


def _error(source: str, seq: int, reason: str) -> list[bytes]:
    body = {"v": 1, "source": source, "seq": seq, "latency_ms": {"total": 1.0}}
    body["error"] = {"reason": reason, "detail": "test"}
    return [source.encode(), json.dumps(body).encode()]


def _eos(source: str, seq: int) -> list[bytes]:
    return [
        source.encode(),
        json.dumps({"v": 1, "source": source, "seq": seq, "eos": True}).encode(),
    ]


def _await_subscriptions(xpub: Socket, topics: set[bytes]) -> None:
    """Sync handshake: wait until the subscriber's subscriptions reached the publisher."""
    while topics:
        assert xpub.poll(5000), f"subscriptions {topics} never arrived"
        message = xpub.recv()
        if message[:1] == b"\x01":
            topics.discard(message[1:])


def test_subscriber_stops_on_eos_and_summarises(context: Context, sockets: list[Socket]) -> None:
    xpub, endpoint = _bind(context, zmq.XPUB, sockets)
    with Subscriber(endpoint, sources=["a", "b"], context=context) as subscriber:
        _await_subscriptions(xpub, {b"a", b"b"})
        messages = [
            _result("a", 0, faces=0, total_ms=10),
            _result("ab", 0),  # matches the "a" prefix subscription, not the source
            _result("a", 2, faces=2, total_ms=20),
            _result("b", 0, faces=1, total_ms=30),
            _result("a", 1, faces=1, total_ms=40),
            _error("b", 1, "decode_failed"),
            _eos("a", 2),
            [b"b", b"not json"],
            _eos("b", 1),
            _result("a", 9),  # after the last expected eos: not read
        ]
        for message in messages:
            xpub.send_multipart(message)
        results = list(subscriber.results(expect_eos=["a", "b"], idle_timeout_s=5))
        skipped = subscriber.skipped

    summary = Summary()
    for result in results:
        summary.add(result)
    assert [(r["source"], r["seq"], r.get("eos", False)) for r in results] == [
        ("a", 0, False),
        ("a", 2, False),
        ("b", 0, False),
        ("a", 1, False),
        ("b", 1, False),
        ("a", 2, True),
        ("b", 1, True),
    ]
    assert skipped == 2  # the prefix match and the malformed message
    assert summary.as_dict() == {
        "results": 5,
        "per_source": {"a": 3, "b": 2},
        "errors": {"decode_failed": 1},
        "detections_per_frame": {"0": 1, "1": 2, "2+": 1},
        "out_of_order": 1,
        "eos": ["a", "b"],
        "missing": {"a": 0, "b": 0},
        "latency_ms": {"p50": 20.0, "p95": 38.0, "p99": 39.6},
    }


def test_summary_follows_the_daemon_across_a_restart_or_an_end_of_stream() -> None:
    """A source that ends its stream and starts again (produce.py run twice, a camera that
    counts from 1), or restarts at seq 0 without an end of stream (a camera restart), is in
    order again, as the daemon sees it; every later result used to count as out of order. A
    bad_header result's seq is trusted, as the daemon trusts it, only when it is the next one."""
    messages = [_result("cam", seq) for seq in range(5)]
    messages += [_eos("cam", 4), *(_result("cam", seq) for seq in (0, 1, 2))]
    messages += [_eos("cam", 2), *(_result("cam", seq) for seq in (1, 2))]  # any seq after eos
    messages += [_result("cam", 0), _result("cam", 1), _result("cam", 1)]  # restart, duplicate
    messages += [_error("cam", 0, "bad_header"), _error("cam", -1, "bad_header")]  # untrusted
    messages += [_error("cam", 2, "bad_header"), _result("cam", 2)]  # trusted, a duplicate
    summary = Summary()
    for message in messages:
        summary.add(json.loads(message[1]))
    assert summary.out_of_order == 2
    assert summary.per_source == {"cam": 17} and summary.eos == {"cam"}


def test_summary_counts_seq_per_run() -> None:
    """A restarted producer's results among those of the run it replaced, which the daemon
    still had queued: each run's seq rises, so none is out of order."""
    old = [_result("cam", seq, run="r1") for seq in (500, 501, 502)]
    new = [_result("cam", seq, run="r2") for seq in (0, 1, 2)]
    summary = Summary()
    for message in [old[0], new[0], old[1], new[1], new[2], old[2], _result("cam", 1, run="r2")]:
        summary.add(json.loads(message[1]))
    assert summary.out_of_order == 1 and summary.per_source == {"cam": 7}


def test_subscriber_stops_after_count_or_idle_timeout(
    context: Context, sockets: list[Socket]
) -> None:
    xpub, endpoint = _bind(context, zmq.XPUB, sockets)
    with Subscriber(endpoint, context=context) as subscriber:
        _await_subscriptions(xpub, {b""})
        for seq in range(5):
            xpub.send_multipart(_result("cam", seq))
        counted = [r["seq"] for r in subscriber.results(count=3, idle_timeout_s=5)]
        rest = [r["seq"] for r in subscriber.results(idle_timeout_s=0.2)]
        started = time.monotonic()
        assert list(subscriber.results(idle_timeout_s=0.2)) == []
        assert 0.15 <= time.monotonic() - started < 3
    assert (counted, rest) == ([0, 1, 2], [3, 4])
    assert Summary().as_dict()["latency_ms"] == {"p50": None, "p95": None, "p99": None}


SUBSCRIBE = [sys.executable, str(ROOT / "tools" / "subscribe.py")]


def test_subscribe_tool_refuses_a_file_it_cannot_write_as_a_usage_error(tmp_path: Path) -> None:
    """A --jsonl, --summary or --out in a directory that does not exist, or an empty one
    (the current directory), is a usage error naming the path (exit 2), before anything
    connects; --jsonl was a traceback, --summary one after every result had been read."""
    missing = tmp_path / "no" / "such"
    endpoint = f"tcp://127.0.0.1:{free_port()}"
    for option in (["--jsonl", str(missing / "x.jsonl")], ["--summary", str(missing / "s.json")]):
        command = [*SUBSCRIBE, "--endpoint", endpoint, "--idle-timeout", "0.1", *option]
        run = subprocess.run(command, capture_output=True, text=True, timeout=60)
        assert run.returncode == 2, run.stderr[-2000:]
        assert f"Invalid value for '{option[0]}': {option[1]}: directory {missing}" in run.stderr
        assert "Traceback" not in run.stderr and run.stdout == ""
    empty = [*SUBSCRIBE, "--endpoint", endpoint, "--idle-timeout", "0.1", "--summary", ""]
    run = subprocess.run(empty, capture_output=True, text=True, timeout=60)
    assert run.returncode == 2 and "'.' is a directory, not a file" in run.stderr
    assert run.stdout == "", "refused before any result was read"
    video = ["--annotate", "carphone.mp4", "--out", str(missing / "a.mp4")]
    run = subprocess.run([*SUBSCRIBE, *video], capture_output=True, text=True, timeout=60)
    assert run.returncode == 2 and "Invalid value for '--out'" in run.stderr


def _subscribe_tool(
    xpub: Socket, messages: list[list[bytes]], *options: str
) -> subprocess.CompletedProcess[str]:
    """Run ``tools/subscribe.py`` on ``xpub``'s endpoint with ``options``, publish
    ``messages`` once it subscribed, and wait for it to stop by itself."""
    endpoint = xpub.getsockopt_string(zmq.LAST_ENDPOINT)
    command = [*SUBSCRIBE, "--endpoint", endpoint, "--idle-timeout", "0.5", *options]
    with subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE) as tool:
        _await_subscriptions(xpub, {b""})
        for message in messages:
            xpub.send_multipart(message)
        out, err = tool.communicate(timeout=60)
    return subprocess.CompletedProcess(command, tool.returncode, out.decode(), err.decode())


def test_subscribe_tool_fails_when_an_expected_end_of_stream_never_came(
    context: Context, sockets: list[Socket]
) -> None:
    """--expect-eos exits 0 only when every such source's end of stream arrived; stopped
    before (by the idle timeout or --count) it exits 1 naming the sources still missing (it
    used to exit 0)."""
    xpub, _ = _bind(context, zmq.XPUB, sockets)
    expect = ("--expect-eos", "a", "--expect-eos", "b")
    a_only = [_result("a", 0), _eos("a", 0), _result("b", 0)]
    idle = _subscribe_tool(xpub, a_only, *expect)
    assert idle.returncode == 1, idle.stderr[-2000:]
    assert "Error: no end of stream from 'b': 0.5 s passed without a result" in idle.stderr
    assert json.loads(idle.stdout[idle.stdout.index("{") :])["eos"] == ["a"]

    counted = _subscribe_tool(xpub, a_only, "--count", "1", *expect)
    assert counted.returncode == 1
    assert "no end of stream from 'a', 'b': --count 1 results came first" in counted.stderr

    both = _subscribe_tool(xpub, [*a_only, _eos("b", 0)], *expect)
    assert both.returncode == 0, both.stderr[-2000:]
    assert both.stderr == f"subscribed to {xpub.getsockopt_string(zmq.LAST_ENDPOINT)}\n"

    filtered = subprocess.run(
        [*SUBSCRIBE, "--source", "a", *expect], capture_output=True, text=True, timeout=60
    )
    assert (
        filtered.returncode == 2 and "--expect-eos 'b': not among the --source" in filtered.stderr
    )


def test_result_line_is_one_compact_line() -> None:
    lines = [
        result_line(json.loads(message[1]))
        for message in (_result("cam", 3, faces=2, total_ms=7.5), _error("cam", 4, "too_large"))
    ]
    assert lines == ["cam seq=3 faces=2 latency=7.5ms", "cam seq=4 error=too_large latency=1.0ms"]
    assert result_line(json.loads(_eos("cam", 4)[1])) == "cam seq=4 eos"
    classified = {**json.loads(_result("lfw", 5, faces=0, total_ms=2.0)[1])}
    del classified["detections"]
    classified["face"] = {"score": 0.99, "is_face": True}
    assert result_line(classified) == (
        "lfw seq=5 face={'score': 0.99, 'is_face': True} latency=2.0ms"
    )


def test_annotator_writes_every_frame_in_seq_order(
    tmp_path: Path, assets: dict[str, Path], carphone_frames: list[np.ndarray]
) -> None:
    out = tmp_path / "annotated.mp4"
    order = list(range(len(carphone_frames)))
    random.Random(7).shuffle(order)
    with Annotator(assets["carphone.mp4"], out) as annotator:
        for seq in order:
            annotator.add(json.loads(_result("carphone", seq)[1]))
        annotator.add(json.loads(_result("other", 0)[1]))
        annotator.add(json.loads(_eos("carphone", 119)[1]))
    assert annotator.frames_written == 120

    capture = cv2.VideoCapture(str(out))
    written = []
    while (frame := capture.read()[1]) is not None:
        written.append(frame)
    capture.release()
    assert len(written) == 120
    assert written[0].shape == carphone_frames[0].shape
    box_edge = (slice(29, 32), slice(40, 90))  # around the top side of every box (y = 30)
    greenish = written[60][box_edge].astype(int)
    assert (greenish[..., 1] - greenish[..., 2]).mean() > 30


def test_annotator_fills_frames_without_results(tmp_path: Path, assets: dict[str, Path]) -> None:
    out = tmp_path / "partial.mp4"
    annotator = Annotator(assets["carphone.mp4"], out, source="cam")
    annotator.add(json.loads(_result("cam", 9)[1]))
    annotator.add(json.loads(_error("cam", 4, "decode_failed")[1]))
    assert annotator.frames_written == 0
    assert annotator.close() == annotator.close() == 10


# --- review findings: start-up, input errors, header checks, interrupts, limits ------------


def test_the_clients_and_subscribe_tool_do_not_import_onnx() -> None:
    """``streamer.clients`` imported ``streamer.assets``, hence onnx (over a second), so a
    subscriber started with its producer missed the first results."""
    code = (
        "import runpy, sys; import streamer.clients; assert 'onnx' not in sys.modules; "
        f"sys.argv = [{str(ROOT / 'tools' / 'subscribe.py')!r}, '--help']\n"
        "try: runpy.run_path(sys.argv[0], run_name='__main__')\n"
        "except SystemExit: assert 'onnx' not in sys.modules, 'subscribe.py imported onnx'"
    )
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr[-2000:]


def test_a_fetched_media_name_is_found_without_importing_onnx(assets: dict[str, Path]) -> None:
    """produce.py carphone.mp4 looked the name up through streamer.assets, whose fetching
    and converting pulled in onnx: 0.6 s more before the first frame."""
    code = (
        "import sys; from streamer.clients.media import open_input; "
        "media = open_input('carphone.mp4'); assert media.kind == 'video', media; "
        "assert 'onnx' not in sys.modules"
    )
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr[-2000:]


def test_subscriber_waits_for_its_connection(context: Context, sockets: list[Socket]) -> None:
    """wait_connected is False while no daemon is there, True once connected, and the
    subscription then reaches the publisher."""
    port = free_port()
    with Subscriber(f"tcp://127.0.0.1:{port}", sources=["cam"], context=context) as subscriber:
        assert not subscriber.wait_connected(0.2)
        xpub = context.socket(zmq.XPUB)
        sockets.append(xpub)
        xpub.bind(f"tcp://127.0.0.1:{port}")
        assert subscriber.wait_connected(10) and subscriber.wait_connected(0)
        _await_subscriptions(xpub, {b"cam"})


def test_subscriber_refuses_a_single_string_of_sources(context: Context) -> None:
    """``sources="cam1"`` subscribed to "c", "a", "m" and "1"."""
    with pytest.raises(TypeError, match="sources must be a collection of source ids, got 'cam1'"):
        Subscriber(f"tcp://127.0.0.1:{free_port()}", sources="cam1", context=context)


def test_produce_ends_the_run_at_an_unreadable_image(
    context: Context, sockets: list[Socket], tmp_path: Path, astronaut: np.ndarray
) -> None:
    """A 4-byte b.jpg among good images raised out of the send loop: no end of stream, no
    report. Now the run ends there, as after a send timeout."""
    cv2.imwrite(str(tmp_path / "a.jpg"), astronaut[:32, :32])
    (tmp_path / "b.jpg").write_bytes(b"\xff\xd8\xff\xe0")
    cv2.imwrite(str(tmp_path / "c.jpg"), astronaut[:32, :32])
    pull, endpoint = _bind(context, zmq.PULL, sockets)
    with pytest.raises(ClientError) as info:
        produce(tmp_path, endpoint, context=context)
    *frames, (eos, _) = _drain(pull)
    assert [header.seq for header, _ in frames] == [0] and eos.eos and eos.seq == 0
    assert str(info.value) == (
        f"cannot read image {tmp_path / 'b.jpg'}; sent 1 frame(s), none from seq 1 on; all "
        "of them left and so did the end of stream"
    )


@pytest.mark.parametrize(
    ("send", "message"),
    [
        ({"meta": [1]}, "bad_header: `meta` must be a JSON object"),
        ({"meta": {"k": {1, 2}}}, "not JSON: Type is not JSON serializable: set"),
        ({"ts": "noon"}, "bad_header: `ts` must be a number"),
        ({"image": np.zeros((4, 4, 3), np.float32)}, "unsupported_dtype: raw dtype 'float32'"),
        ({"image": np.zeros((4, 4), np.uint8)}, "bad_header: `color` must be gray for 1 chan"),
    ],
)
def test_producer_refuses_a_frame_the_daemon_would_refuse(
    context: Context, sockets: list[Socket], send: dict[str, Any], message: str
) -> None:
    """The daemon's own rules, before anything is sent (these reached the daemon, which
    refused them as bad_header; a set in meta was a bare TypeError)."""
    pull, endpoint = _bind(context, zmq.PULL, sockets)
    with Producer(endpoint, source="cam", encoding="raw", context=context) as producer:
        image = send.pop("image", np.zeros((4, 4, 3), np.uint8))
        with pytest.raises(
            ClientError, match=f"^the daemon would refuse frame 0: {re.escape(message)}"
        ):
            producer.send(image, **send)
        producer.send_eos()
    ((eos, _),) = _drain(pull)
    assert eos.eos and producer.stats.frames == 0


def test_the_frame_limits_are_the_daemons_defaults() -> None:
    """They are read from the config model, so they follow the daemon's defaults."""
    ingress = IngressConfig(uri="pull+bind:tcp://127.0.0.1:5555")
    limits = (ingress.max_width_px, ingress.max_height_px, ingress.max_pixels)
    assert FrameLimits(*limits, ingress.max_message_bytes) == DEFAULT_FRAME_LIMITS


@pytest.mark.parametrize(
    ("encoding", "image", "message"),
    [
        ("jpeg", np.zeros((10, 9000, 3), np.uint8), "too_large: image is 9000x10 (90000 pixels)"),
        (
            "raw",
            np.zeros((4800, 4800, 3), np.uint8),
            "too_large: a part of its message is 69120000 bytes, over max_message_bytes 67108864",
        ),
    ],
)
def test_producer_refuses_a_frame_over_the_daemons_default_limits(
    context: Context, sockets: list[Socket], encoding: str, image: np.ndarray, message: str
) -> None:
    """Frames were checked with no size limits: a wide one was sent for the daemon to fail
    it as too_large, and a raw one over its 64 MiB message limit was dropped with the
    connection, then blamed on a slow daemon. Given no limits, the wide one is sent."""
    pull, endpoint = _bind(context, zmq.PULL, sockets)
    with Producer(endpoint, source="cam", encoding=encoding, context=context) as producer:
        with pytest.raises(
            ClientError, match=f"^the daemon would refuse frame 0: {re.escape(message)}"
        ):
            producer.send(image)
        producer.send_eos()
    ((eos, _),) = _drain(pull)
    assert eos.eos and producer.stats.frames == 0
    if encoding == "jpeg":
        with Producer(
            endpoint, source="cam", limits=FrameLimits.unlimited(), context=context
        ) as producer:
            producer.send(image)
        assert len(_drain_frames(pull, 1)) == 1


def test_produce_says_the_end_of_stream_was_sent_after_no_frame(
    context: Context, sockets: list[Socket], tmp_path: Path, astronaut: np.ndarray
) -> None:
    """A first frame the daemon would refuse: ``sent 0 frame(s), none from seq 0 on`` said
    nothing of the end of stream, which was sent."""
    cv2.imwrite(str(tmp_path / "x.png"), astronaut)
    pull, endpoint = _bind(context, zmq.PULL, sockets)
    with pytest.raises(ClientError) as info:
        produce(tmp_path / "x.png", endpoint, context=context, limits=FrameLimits(max_pixels=9))
    ((eos, _),) = _drain(pull)
    assert eos.eos and str(info.value).endswith(
        "; sent 0 frame(s), none from seq 0 on; the end of stream was sent"
    )


def test_produce_fails_an_unreadable_first_frame_before_it_connects(
    context: Context, sockets: list[Socket], tmp_path: Path
) -> None:
    """An empty x.jpg connected, then sent an end of stream for a stream that never began."""
    (tmp_path / "x.jpg").touch()
    pull, endpoint = _bind(context, zmq.PULL, sockets)
    with pytest.raises(ClientError, match=r"^cannot read image .*x\.jpg$"):
        produce(tmp_path / "x.jpg", endpoint, context=context)
    assert not pull.poll(300)


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        ({"source": ""}, "bad_header: `source` must be a non-empty string"),
        ({"source": 7}, "bad_header: `source` must be a non-empty string"),
        ({"source": "s" * 70_000}, "bad_header: header is 70"),
        ({"send_timeout_s": math.nan}, "must be finite and > 0"),
        ({"close_timeout_s": math.inf}, "must be finite and > 0"),
    ],
)
def test_producer_refuses_bad_arguments_before_making_a_socket(
    context: Context, arguments: dict[str, Any], message: str
) -> None:
    """A NaN send timeout raised after the socket was made (the context fixture then finds
    it open); a source the daemon refuses was only seen there."""
    with pytest.raises(ValueError, match=message):
        Producer(
            f"tcp://127.0.0.1:{free_port()}", **{"source": "cam", **arguments}, context=context
        )


def test_produce_refuses_an_empty_source_and_a_nan_fps(context: Context) -> None:
    """``source=""`` silently became the file stem; ``fps=nan`` failed after connecting."""
    endpoint = f"tcp://127.0.0.1:{free_port()}"
    with pytest.raises(ValueError, match="`source` must be a non-empty string"):
        produce("astronaut.png", endpoint, source="", context=context)
    for fps in (math.nan, math.inf, -1.0, 1e-10, 1e-300):
        with pytest.raises(ValueError, match="fps must be finite and 0 or >= 0.001"):
            produce("astronaut.png", endpoint, fps=fps, context=context)


def test_a_producer_interrupted_in_its_with_block_aborts(
    context: Context, sockets: list[Socket], astronaut: np.ndarray
) -> None:
    """``with Producer(...)`` left by a KeyboardInterrupt waited the whole close timeout for
    frames a daemon was not taking; other exceptions still close normally."""
    _, endpoint = _slow_pull(context, sockets)
    started = time.monotonic()
    with pytest.raises(KeyboardInterrupt):  # noqa: PT012
        with Producer(
            endpoint, source="cam", encoding="raw", close_timeout_s=30, context=context
        ) as producer:
            for _ in range(5):
                producer.send(astronaut)
            raise KeyboardInterrupt
    assert time.monotonic() - started < 10 and producer.undelivered > 0

    pull, endpoint = _bind(context, zmq.PULL, sockets)
    with pytest.raises(RuntimeError), Producer(endpoint, source="cam", context=context) as producer:
        producer.send(astronaut)
        raise RuntimeError
    assert producer.undelivered == 0 and len(_drain_frames(pull, 1)) == 1


def _drain_frames(pull: Socket, count: int) -> list[list[bytes]]:
    """``count`` messages from ``pull``."""
    messages = []
    for _ in range(count):
        assert pull.poll(5000), "no message within 5 s"
        messages.append(pull.recv_multipart())
    return messages


def test_producer_fps_is_the_frame_rate(context: Context, sockets: list[Socket]) -> None:
    """A one-frame run reported thousands of fps (frames / the one send's duration), and a
    paced run more than its pace (n frames over n - 1 intervals)."""
    _, endpoint = _bind(context, zmq.PULL, sockets)
    assert produce("astronaut.png", endpoint, context=context).fps == 0.0
    paced = produce("astronaut.png", endpoint, loop=5, fps=10, context=context)
    assert 9.0 <= paced.fps <= 10.05 and paced.frames_span_s >= 0.39


def test_the_clients_connect_to_an_ipv6_host() -> None:
    """Without ZeroMQ's IPV6 option on their sockets they never connected to tcp://[::1]."""
    context: zmq.Context[Any] = zmq.Context()
    pull, pub = context.socket(zmq.PULL), context.socket(zmq.XPUB)
    for bound in (pull, pub):
        bound.setsockopt(zmq.IPV6, 1)
        bound.setsockopt(zmq.LINGER, 0)
        bound.bind("tcp://[::1]:*")
    try:
        subscriber_endpoint = pub.getsockopt_string(zmq.LAST_ENDPOINT)
        with Subscriber(subscriber_endpoint) as subscriber:
            assert subscriber.wait_connected(10.0)
        with Producer(pull.getsockopt_string(zmq.LAST_ENDPOINT), source="v6") as producer:
            producer.send(np.zeros((8, 8, 3), np.uint8))
        assert pull.poll(5000) and parse_header(pull.recv_multipart()[0]).source == "v6"
    finally:
        pull.close()
        pub.close()
        context.term()


_SERVER_REFUSALS = (
    zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL
    | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL
    | zmq.EVENT_HANDSHAKE_FAILED_AUTH
)


def test_a_refused_producer_does_not_stop_the_other_sockets_of_its_context() -> None:
    """libzmq sends a monitor's events from the context's I/O thread and waits while their
    queue is full: a producer whose daemon refused its handshakes (a server key that is not
    the daemon's, keys rotated under a running producer) filled its monitor of failed
    handshakes (2000 events) in about 5 minutes of reconnections, and then no socket of its
    context moved a byte, and its close waited for ever, holding the GIL. Reconnecting every
    millisecond instead of every 100 ms fills it in seconds."""
    context: Context = zmq.Context()
    context.setsockopt(zmq.RECONNECT_IVL, 1)
    server_public, server_secret = zmq.curve_keypair()
    locked, plain = context.socket(zmq.PULL), context.socket(zmq.PULL)
    locked.setsockopt(zmq.CURVE_SERVER, 1)
    locked.setsockopt(zmq.CURVE_SECRETKEY, server_secret)
    locked_endpoint, plain_endpoint = (f"tcp://127.0.0.1:{free_port()}" for _ in range(2))
    refusals = locked.get_monitor_socket(_SERVER_REFUSALS)
    locked.bind(locked_endpoint)
    plain.bind(plain_endpoint)
    public, secret = zmq.curve_keypair()
    stranger = CurveClient(public, secret, zmq.curve_keypair()[0])  # not the server's key
    image = np.zeros((4, 4, 3), np.uint8)
    with (
        Producer(locked_endpoint, source="a", encoding="raw", context=context, curve=stranger,
                 send_timeout_s=0.5) as refused,
        Producer(plain_endpoint, source="b", encoding="raw", context=context) as other,
    ):  # fmt: skip
        deadline = time.monotonic() + 60
        for seen in range(2100):  # more than the monitor's default queue holds
            wait_ms = max(0, int((deadline - time.monotonic()) * 1000))
            assert refusals.poll(wait_ms), f"the producer stopped retrying after {seen}"
            recv_monitor_message(refusals)
        other.send(image)
        assert plain.poll(5000), "the context's I/O thread waits on a full monitor"
        with pytest.raises(SendTimeoutError, match="refused the connection's security handsh"):
            refused.send(image)
    locked.disable_monitor()
    refusals.close(linger=0)
    locked.close(linger=0)
    plain.close(linger=0)
    context.term()


def test_a_subscriber_through_thousands_of_reconnections_stops_no_socket_of_its_context() -> None:
    """The subscriber's monitor of successful handshakes gets an event at every reconnection
    (a daemon restarted): unread once connected, 2000 of them filled its queue and stopped
    the context's I/O thread (see the producer's test above)."""
    client_context: Context = zmq.Context()
    client_context.setsockopt(zmq.RECONNECT_IVL, 1)
    server_context: Context = zmq.Context()
    endpoint = f"tcp://127.0.0.1:{free_port()}"
    subscriber = Subscriber(endpoint, context=client_context)
    for restart in range(2100):
        pub = server_context.socket(zmq.PUB)
        handshakes = pub.get_monitor_socket(zmq.EVENT_HANDSHAKE_SUCCEEDED)
        while True:  # the port of the last one is released by its I/O thread, soon
            try:
                pub.bind(endpoint)
                break
            except zmq.ZMQError:
                time.sleep(0.001)
        assert handshakes.poll(5000), f"no reconnection after {restart} restarts"
        assert subscriber.wait_connected(0)
        pub.disable_monitor()
        handshakes.close(linger=0)
        pub.close(linger=0)
    pull, push = client_context.socket(zmq.PULL), server_context.socket(zmq.PUSH)
    push.connect(f"tcp://127.0.0.1:{pull.bind_to_random_port('tcp://127.0.0.1')}")
    push.send(b"moves")
    assert pull.poll(5000) and pull.recv() == b"moves"
    for socket in (pull, push):
        socket.close(linger=0)
    subscriber.close()
    client_context.term()
    server_context.term()


def test_a_producer_refused_for_good_says_so_at_every_send_timeout(tmp_path: Path) -> None:
    """libzmq does not reconnect after the daemon's ZAP handler refused a client key: the
    first send timeout read the refusal off the monitor, and every later one said that no
    daemon was connected (``is `streamer run` listening there?``), with one listening."""
    context: Context = zmq.Context()
    authenticator = ThreadAuthenticator(context)
    authenticator.start()
    authenticator.configure_curve(domain="*", location=str(tmp_path))  # no client allowed
    server_public, server_secret = zmq.curve_keypair()
    daemon = context.socket(zmq.PULL)
    daemon.setsockopt(zmq.CURVE_SERVER, 1)
    daemon.setsockopt(zmq.CURVE_SECRETKEY, server_secret)
    endpoint = f"tcp://127.0.0.1:{free_port()}"
    daemon.bind(endpoint)
    stranger = CurveClient(*zmq.curve_keypair(), server_public)
    image = np.zeros((4, 4, 3), np.uint8)
    refused = "refused the connection's security handshake \\(HANDSHAKE_FAILED_AUTH.*not retried"
    try:
        with Producer(
            endpoint,
            source="a",
            encoding="raw",
            context=context,
            curve=stranger,
            send_timeout_s=0.3,
        ) as producer:
            for _ in range(2):
                with pytest.raises(SendTimeoutError, match=refused):
                    producer.send(image)
    finally:
        daemon.close(linger=0)
        authenticator.stop()
        context.term()

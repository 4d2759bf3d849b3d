"""Producer processes of the benchmark (run as ``python -m streamer.bench.feed``).

- ``push``: the daemon's producers. Native-protocol frames on one PUSH socket per source,
  the sources taking turns, as fast as the daemon takes them (``on_full = "block"`` pushes
  back through ZeroMQ) or paced at ``--rate`` frames/s in total; each header's ``ts`` is the
  wall-clock time just before its send, so a subscriber measures latency from it. An
  end-of-stream message closes every source.
- ``req``: the ``naive`` mode's sender. imagezmq-style messages on a REQ socket, each sent
  once the reply to the previous one has come back; ``--warmup`` frames go first, unmeasured.

Each prints one JSON object on stdout when done (see :func:`push` and :func:`req`). The
frames come from a :class:`~streamer.bench.frameset.FrameSet` file, so nothing is encoded
while the clock runs.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import click
import zmq

from streamer.bench.frameset import FrameSet
from streamer.bench.machine import machine_idle_s
from streamer.clients.pacer import Pacer
from streamer.transport.protocol import encode_eos

__all__ = ["main"]

_SEND_TIMEOUT_MS = 60_000
_LINGER_MS = 60_000
_SNDHWM = 32  # the Producer client's default


@click.group()
def main() -> None:
    """Benchmark producers."""


@main.command()
@click.option("--endpoint", required=True, help="the daemon's PULL ingress")
@click.option("--frames", "frames_path", required=True, type=click.Path(path_type=Path))
@click.option("--count", required=True, type=int, help="frames to send, all sources together")
@click.option("--source", "sources", required=True, multiple=True, help="a source id; repeat")
@click.option("--rate", default=0.0, help="frames/s, all sources together; 0 = unpaced")
def push(
    endpoint: str, frames_path: Path, count: int, sources: tuple[str, ...], rate: float
) -> None:
    """Send COUNT frames over one PUSH socket per source, then end-of-stream for each.

    Prints ``{"sent", "first_send", "last_send", "cpu_s", "first_send_idle_s"}``: frames
    sent, the wall-clock times (Unix s) of the first and the last send, the CPU seconds of
    the sending, and the machine's idle CPU seconds since boot just before the first send
    (:func:`~streamer.bench.machine.machine_idle_s`; -1.0 where unreadable).
    """
    frames = FrameSet.load(frames_path)
    context: zmq.Context[Any] = zmq.Context()
    sockets = [_push_socket(context, endpoint) for _ in sources]
    cpu_s = time.process_time()
    idle_s = machine_idle_s()
    first, last = _send_frames(frames, sockets, sources, count, Pacer(rate or None))
    cpu_s = time.process_time() - cpu_s
    for turn, socket in enumerate(sockets):
        sent = len(range(turn, count, len(sources)))
        socket.send_multipart(encode_eos(sources[turn], max(sent - 1, 0)))
        socket.close()
    context.term()
    report = {
        "sent": count,
        "first_send": first,
        "last_send": last,
        "cpu_s": cpu_s,
        "first_send_idle_s": idle_s,
    }
    click.echo(json.dumps(report))


def _send_frames(
    frames: FrameSet,
    sockets: list[zmq.Socket[Any]],
    sources: tuple[str, ...],
    count: int,
    pacer: Pacer,
) -> tuple[float, float]:
    """Send ``count`` frames, source after source; (first, last) send times, Unix s."""
    first = last = 0.0
    for index in range(count):
        turn = index % len(sources)
        pacer.wait()
        last = time.time()
        first = first or last
        parts = frames.native_message(sources[turn], index // len(sources), index, last)
        sockets[turn].send_multipart(parts, copy=False)
    return first, last


def _push_socket(context: zmq.Context[Any], endpoint: str) -> zmq.Socket[Any]:
    socket: zmq.Socket[Any] = context.socket(zmq.PUSH)
    socket.setsockopt(zmq.SNDHWM, _SNDHWM)
    socket.setsockopt(zmq.SNDTIMEO, _SEND_TIMEOUT_MS)
    socket.setsockopt(zmq.LINGER, _LINGER_MS)
    socket.connect(endpoint)
    return socket


@main.command()
@click.option("--endpoint", required=True, help="the receiver's REP socket")
@click.option("--frames", "frames_path", required=True, type=click.Path(path_type=Path))
@click.option("--count", required=True, type=int, help="frames to time")
@click.option("--warmup", default=0, help="frames sent first, not timed")
@click.option("--source", default="naive", help="the imagezmq msg text")
def req(endpoint: str, frames_path: Path, count: int, warmup: int, source: str) -> None:
    """Send WARMUP + COUNT frames, each after the previous reply.

    Prints ``{"frames", "seconds", "latencies_ms"}``: timed frames, wall seconds from the
    first timed send to the last reply, and each timed frame's round trip in ms.
    """
    frames = FrameSet.load(frames_path)
    context: zmq.Context[Any] = zmq.Context()
    socket = context.socket(zmq.REQ)
    socket.setsockopt(zmq.LINGER, 0)
    socket.setsockopt(zmq.RCVTIMEO, _SEND_TIMEOUT_MS)
    socket.connect(endpoint)
    for index in range(warmup):
        socket.send_multipart(frames.imagezmq_message(source, index), copy=False)
        socket.recv()
    latencies_ms = []
    start_ns = time.monotonic_ns()
    for index in range(warmup, warmup + count):
        sent_ns = time.monotonic_ns()
        socket.send_multipart(frames.imagezmq_message(source, index), copy=False)
        socket.recv()
        latencies_ms.append(round((time.monotonic_ns() - sent_ns) / 1e6, 4))
    seconds = (time.monotonic_ns() - start_ns) / 1e9
    socket.close()
    context.term()
    click.echo(json.dumps({"frames": count, "seconds": seconds, "latencies_ms": latencies_ms}))


if __name__ == "__main__":
    main()

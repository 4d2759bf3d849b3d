"""``naive``: what a user writes by hand, an imagezmq-style REQ/REP receiver.

The receiver (``python -m streamer.bench.naive --config FILE --endpoint tcp://…``, a
subprocess) binds a REP socket and, for each message, decodes, preprocesses, runs the model
on that one frame, postprocesses and replies with the detections as JSON, one frame at a
time: imagezmq's hub pattern. It uses the daemon's own steps (:class:`FrameWork`), so only
the architecture differs. A REQ sender process (:mod:`.feed` ``req``) sends the frames, each
after the previous reply, and times the round trips.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import click
import numpy as np
import zmq

from streamer.bench.child import Child, python_module, stop_all
from streamer.bench.modes import NAIVE
from streamer.bench.stats import RunResult
from streamer.bench.work import FrameWork
from streamer.config import load_config
from streamer.errors import FrameError, StreamerError

__all__ = ["NaiveReceiver", "main", "run_naive_sender"]

_READY_TIMEOUT_S = 120.0
_SENDER_TIMEOUT_S = 3600.0


class NaiveReceiver:
    """The receiver subprocess, running until :meth:`stop`.

    Args:
        config_path: the benchmark's config file (its model and plug-ins are used).
        endpoint: where its REP socket binds, e.g. ``tcp://127.0.0.1:5600``.
        log_path: where its output goes once stopped.

    Raises:
        StreamerError: it did not come up within 120 s.
    """

    def __init__(self, config_path: Path, endpoint: str, log_path: Path) -> None:
        self.endpoint = endpoint
        command = python_module(
            "streamer.bench.naive", "--config", str(config_path), "--endpoint", endpoint
        )
        self._child = Child(command, log_path)
        try:
            self._child.wait_event("ready", _READY_TIMEOUT_S)
        except BaseException:  # Ctrl-C or SIGTERM too: nothing else knows of the child yet
            stop_all([self._child])
            raise

    @property
    def pid(self) -> int:
        """The receiver's process id."""
        return self._child.pid

    def stop(self) -> None:
        """End the receiver (SIGTERM)."""
        self._child.stop()


def run_naive_sender(endpoint: str, frames_path: Path, count: int, warmup: int) -> RunResult:
    """Run the REQ sender process against a receiver and return what it measured.

    Args:
        endpoint: the receiver's endpoint.
        frames_path: a saved :class:`FrameSet`.
        count: frames to time.
        warmup: frames sent first, untimed.

    Raises:
        StreamerError: the sender failed.
    """
    command = python_module(
        "streamer.bench.feed", "req", "--endpoint", endpoint, "--frames", str(frames_path),
        "--count", str(count), "--warmup", str(warmup),
    )  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True, timeout=_SENDER_TIMEOUT_S)
    if done.returncode != 0:
        raise StreamerError(f"naive sender failed: {done.stderr.strip()[-2000:]}")
    report = json.loads(done.stdout.strip().splitlines()[-1])
    return RunResult.of(NAIVE, report["frames"], report["seconds"], report["latencies_ms"])


def _decode_args(header: Mapping[str, Any]) -> tuple[str, Mapping[str, Any]]:
    """(encoding, header fields) of an imagezmq message: an array when it names a dtype."""
    if "dtype" in header:
        return "raw", {"shape": header["shape"], "dtype": header["dtype"], "color": "bgr"}
    return "jpeg", {}


def _handle(work: FrameWork, parts: list[zmq.Frame]) -> bytes:
    """One request → the JSON reply: ``{"msg", "detections"}`` or ``{"msg", "error"}``."""
    header = json.loads(parts[0].bytes)
    encoding, fields = _decode_args(header)
    try:
        image = work.decode(encoding, parts[1].buffer, fields)
        tensor, transform = work.preprocess(image)
        result = work.postprocess(work.infer(np.expand_dims(tensor, 0)), [transform])[0]
    except FrameError as error:
        result = {"error": error.reason}
    return json.dumps({"msg": header.get("msg"), **result}).encode()


@click.command()
@click.option("--config", "config_path", required=True, type=click.Path(path_type=Path))
@click.option("--endpoint", required=True, help="where the REP socket binds")
def main(config_path: Path, endpoint: str) -> None:
    """Serve frames one at a time until SIGTERM; prints ``{"event": "ready"}`` once bound."""
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(0))
    context: zmq.Context[Any] = zmq.Context()
    socket = context.socket(zmq.REP)
    socket.setsockopt(zmq.LINGER, 0)
    try:
        with FrameWork(load_config(config_path)) as work:
            socket.bind(endpoint)
            click.echo(json.dumps({"event": "ready"}))
            while True:
                socket.send(_handle(work, socket.recv_multipart(copy=False)))
    finally:
        socket.close()
        context.term()


if __name__ == "__main__":
    main()

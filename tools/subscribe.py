"""Receive a streamer daemon's results: print them, save them, summarise and annotate them.

Usage::

    python tools/subscribe.py --expect-eos carphone
    python tools/subscribe.py --source cam1 --source cam2 --count 1000 --quiet --summary s.json
    python tools/subscribe.py --expect-eos carphone --annotate carphone.mp4 --out annotated.mp4
    python tools/subscribe.py --jsonl results.jsonl --idle-timeout 0      # until Ctrl-C
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

from streamer.entry import ctrl_c_aborts

with ctrl_c_aborts():  # the libraries load in about half a second (OpenCV, ZeroMQ)
    import click
    import cv2

    from streamer.clients import (
        DEFAULT_SUBSCRIBER_ENDPOINT,
        Annotator,
        Subscriber,
        Summary,
        open_input,
        result_line,
    )
    from streamer.clients.tool_options import (
        MAX_WAIT_S,
        curve_client,
        curve_options,
        finite,
        sigterm_as_ctrl_c,
        zmq_endpoint,
    )
    from streamer.errors import ClientError, StreamerError
    from streamer.lifecycle import Closing

_T = TypeVar("_T")


def _in_writable_directory(
    _ctx: click.Context, _param: click.Parameter, path: Path | None
) -> Path | None:
    """``path``, once its directory is known to exist and, for a new file, to be writable:
    a usage error before anything connects, not a failure after the results were read."""
    if path is None:
        return None
    if path.is_dir():  # "" is the current directory
        raise click.BadParameter(f"{str(path)!r} is a directory, not a file")
    directory = path.parent
    if not directory.is_dir():
        raise click.BadParameter(f"{path}: directory {directory} does not exist")
    if not path.exists() and not os.access(directory, os.W_OK):
        raise click.BadParameter(f"{path}: directory {directory} is not writable")
    return path


def _video(_ctx: click.Context, _param: click.Parameter, spec: str | None) -> Path | None:
    """The video file ``spec`` names, once known to be readable: a usage error before any
    other file is opened or anything connects."""
    if spec is None:
        return None
    try:
        media = open_input(spec)
    except StreamerError as exc:
        raise click.BadParameter(str(exc)) from exc
    if media.kind != "video" or media.path is None:
        raise click.BadParameter(f"needs a video file, got {media.kind} {spec!r}")
    capture = cv2.VideoCapture(str(media.path))
    readable = capture.isOpened()
    capture.release()
    if not readable:
        raise click.BadParameter(f"cannot read video {media.path}")
    return media.path


@click.command()
@click.option(
    "--endpoint",
    default=DEFAULT_SUBSCRIBER_ENDPOINT,
    callback=zmq_endpoint,
    show_default=True,
    help="The daemon's PUB egress.",
)
@click.option(
    "--source",
    "sources",
    multiple=True,
    help="Only results of this source (repeatable).  [default: all]",
)
@click.option(
    "--expect-eos",
    multiple=True,
    metavar="SOURCE",
    help="Stop once this source's end-of-stream arrived (repeatable); exit 1 if the run "
    "stops otherwise (--count, --idle-timeout, Ctrl-C) before it did.",
)
@click.option("--count", type=click.IntRange(min=1), help="Stop after this many results.")
@click.option(
    "--idle-timeout",
    "idle_timeout_s",
    type=click.FloatRange(min=0, max=MAX_WAIT_S),
    callback=finite,
    default=10.0,
    show_default=True,
    help="Stop after this many seconds without a result; 0: never.",
)
@click.option(
    "--print/--quiet",
    "print_lines",
    default=True,
    show_default=True,
    help="Print one line per result.",
)
@click.option(
    "--jsonl",
    type=click.Path(dir_okay=False, writable=True, path_type=Path),
    callback=_in_writable_directory,
    help="Write every result to this file, one JSON object a line.",
)
@click.option(
    "--annotate",
    metavar="VIDEO",
    callback=_video,
    help="Draw the results onto this video (the producer's INPUT); needs --out.",
)
@click.option(
    "--out",
    type=click.Path(dir_okay=False, writable=True, path_type=Path),
    callback=_in_writable_directory,
    help="The annotated video to write (.mp4).",
)
@click.option(
    "--summary",
    "summary_path",
    type=click.Path(dir_okay=False, writable=True, path_type=Path),
    callback=_in_writable_directory,
    help="Also write the summary to this JSON file.",
)
@curve_options
def main(
    endpoint: str,
    sources: tuple[str, ...],
    expect_eos: tuple[str, ...],
    count: int | None,
    idle_timeout_s: float,
    print_lines: bool,
    jsonl: Path | None,
    annotate: Path | None,
    out: Path | None,
    summary_path: Path | None,
    curve_server_key: Path | None,
    curve_secret_key: Path | None,
) -> None:
    """Subscribe to a streamer daemon's results until the stop condition, then print a
    summary (results per source, frames without a result, errors, detections per frame,
    latency percentiles). Once connected it says ``subscribed to ENDPOINT`` on stderr:
    results published before then are not delivered to it. SIGTERM stops it as Ctrl-C does."""
    if (annotate is None) != (out is None):
        raise click.UsageError("--annotate VIDEO and --out OUT.mp4 go together")
    if sources and (filtered := set(expect_eos) - set(sources)):
        raise click.UsageError(f"--expect-eos {_names(filtered)}: not among the --source ones")
    curve = curve_client(curve_server_key, curve_secret_key)
    sigterm_as_ctrl_c()
    summary = Summary()
    interrupted = False
    try:
        with contextlib.ExitStack() as stack:
            sinks = _open_sinks(stack, jsonl, annotate, out, sources)
            subscriber = stack.enter_context(Subscriber(endpoint, sources=sources, curve=curve))
            try:
                for result in _results(subscriber, expect_eos, count, idle_timeout_s):
                    summary.add(result)
                    _handle(result, print_lines, *sinks)
            except KeyboardInterrupt:
                interrupted = True
    except (StreamerError, OSError) as exc:
        raise click.ClickException(str(exc)) from exc
    _report(summary, summary_path)
    if missing := set(expect_eos) - summary.eos:
        why = _stop_reason(summary, interrupted, count, idle_timeout_s)
        raise click.ClickException(f"no end of stream from {_names(missing)}: {why}")


def _results(
    subscriber: Subscriber, expect_eos: tuple[str, ...], count: int | None, idle_timeout_s: float
) -> Iterator[dict[str, Any]]:
    """The results until the stop condition, once connected within the idle timeout."""
    if not subscriber.wait_connected(idle_timeout_s or None):
        return
    click.echo(f"subscribed to {subscriber.endpoint}", err=True)
    yield from subscriber.results(
        expect_eos=expect_eos, count=count, idle_timeout_s=idle_timeout_s or None
    )


def _report(summary: Summary, path: Path | None) -> None:
    """Print the summary as JSON, and write it to ``path`` too if given."""
    report = json.dumps(summary.as_dict(), indent=2)
    click.echo(report)
    if path is not None:
        try:
            path.write_text(report + "\n")
        except OSError as exc:  # a full disk: the error would not name the file
            raise click.ClickException(f"cannot write {path}: {exc.strerror or exc}") from exc


def _stop_reason(
    summary: Summary, interrupted: bool, count: int | None, idle_timeout_s: float
) -> str:
    """Why the results stopped before every expected end of stream came."""
    if interrupted:
        return "interrupted"
    if count is not None and sum(summary.per_source.values()) >= count:
        return f"--count {count} results came first"
    return f"{idle_timeout_s} s passed without a result"


def _names(sources: set[str]) -> str:
    return ", ".join(repr(source) for source in sorted(sources))


def _open_sinks(
    stack: contextlib.ExitStack,
    jsonl: Path | None,
    annotate: Path | None,
    out: Path | None,
    sources: tuple[str, ...],
) -> tuple[_JsonLines | None, Annotator | None]:
    """The JSONL file and the annotator asked for (None where not)."""
    annotator = None
    if annotate is not None and out is not None:
        source = sources[0] if len(sources) == 1 else None
        annotator = Annotator(annotate, out, source=source)
        stack.callback(_finish_annotation, annotator, out)
    lines = stack.enter_context(_JsonLines(jsonl)) if jsonl is not None else None
    return lines, annotator


def _finish_annotation(annotator: Annotator, out: Path) -> None:
    click.echo(f"wrote {annotator.close()} annotated frames to {out}", err=True)


class _JsonLines(Closing):
    """Results written to ``path``, one JSON object a line, each line flushed as written.

    Raises:
        ClientError: naming the file, when it cannot be written.
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        self._file = self._io(lambda: path.open("w", buffering=1))

    def write(self, result: dict[str, Any]) -> None:
        self._io(lambda: self._file.write(json.dumps(result, separators=(",", ":")) + "\n"))

    def close(self) -> None:
        self._io(self._file.close)

    def _io(self, action: Callable[[], _T]) -> _T:
        try:
            return action()
        except OSError as exc:
            raise ClientError(f"cannot write {self.path}: {exc.strerror or exc}") from exc


def _handle(
    result: dict[str, Any],
    print_lines: bool,
    lines: _JsonLines | None,
    annotator: Annotator | None,
) -> None:
    if print_lines:
        click.echo(result_line(result))
    if lines is not None:
        lines.write(result)
    if annotator is not None:
        annotator.add(result)


if __name__ == "__main__":
    main()

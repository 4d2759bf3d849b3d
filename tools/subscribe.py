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
from pathlib import Path
from typing import IO, Any

import click

from streamer.clients import (
    DEFAULT_SUBSCRIBER_ENDPOINT,
    Annotator,
    Subscriber,
    Summary,
    open_input,
    result_line,
)
from streamer.errors import StreamerError


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


@click.command()
@click.option(
    "--endpoint",
    default=DEFAULT_SUBSCRIBER_ENDPOINT,
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
    type=click.FloatRange(min=0),
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
def main(
    endpoint: str,
    sources: tuple[str, ...],
    expect_eos: tuple[str, ...],
    count: int | None,
    idle_timeout_s: float,
    print_lines: bool,
    jsonl: Path | None,
    annotate: str | None,
    out: Path | None,
    summary_path: Path | None,
) -> None:
    """Subscribe to a streamer daemon's results until the stop condition, then print a
    summary (results per source, errors, detections per frame, latency percentiles)."""
    if (annotate is None) != (out is None):
        raise click.UsageError("--annotate VIDEO and --out OUT.mp4 go together")
    if sources and (filtered := set(expect_eos) - set(sources)):
        raise click.UsageError(f"--expect-eos {_names(filtered)}: not among the --source ones")
    summary = Summary()
    interrupted = False
    try:
        with contextlib.ExitStack() as stack:
            sinks = _open_sinks(stack, jsonl, annotate, out, sources)
            subscriber = stack.enter_context(Subscriber(endpoint, sources=sources))
            results = subscriber.results(
                expect_eos=expect_eos, count=count, idle_timeout_s=idle_timeout_s or None
            )
            try:
                for result in results:
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


def _report(summary: Summary, path: Path | None) -> None:
    """Print the summary as JSON, and write it to ``path`` too if given."""
    report = json.dumps(summary.as_dict(), indent=2)
    click.echo(report)
    if path is not None:
        try:
            path.write_text(report + "\n")
        except OSError as exc:
            raise click.ClickException(str(exc)) from exc


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
    annotate: str | None,
    out: Path | None,
    sources: tuple[str, ...],
) -> tuple[IO[str] | None, Annotator | None]:
    """The JSONL file and the annotator asked for (None where not)."""
    lines = stack.enter_context(jsonl.open("w")) if jsonl is not None else None
    if annotate is None or out is None:
        return lines, None
    media = open_input(annotate)
    if media.kind != "video" or media.path is None:
        raise click.UsageError(f"--annotate needs a video file, got {media.kind} {annotate!r}")
    source = sources[0] if len(sources) == 1 else None
    annotator = Annotator(media.path, out, source=source)
    stack.callback(_finish_annotation, annotator, out)
    return lines, annotator


def _finish_annotation(annotator: Annotator, out: Path) -> None:
    click.echo(f"wrote {annotator.close()} annotated frames to {out}", err=True)


def _handle(
    result: dict[str, Any],
    print_lines: bool,
    lines: IO[str] | None,
    annotator: Annotator | None,
) -> None:
    if print_lines:
        click.echo(result_line(result))
    if lines is not None:
        lines.write(json.dumps(result, separators=(",", ":")) + "\n")
    if annotator is not None:
        annotator.add(result)


if __name__ == "__main__":
    main()

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
    help="Stop once this source's end-of-stream arrived (repeatable).",
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
    help="The annotated video to write (.mp4).",
)
@click.option(
    "--summary",
    "summary_path",
    type=click.Path(dir_okay=False, writable=True, path_type=Path),
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
    summary = Summary()
    try:
        with contextlib.ExitStack() as stack:
            sinks = _open_sinks(stack, jsonl, annotate, out, sources)
            subscriber = stack.enter_context(Subscriber(endpoint, sources=sources))
            results = subscriber.results(
                expect_eos=expect_eos, count=count, idle_timeout_s=idle_timeout_s or None
            )
            with contextlib.suppress(KeyboardInterrupt):
                for result in results:
                    summary.add(result)
                    _handle(result, print_lines, *sinks)
    except StreamerError as exc:
        raise click.ClickException(str(exc)) from exc
    report = json.dumps(summary.as_dict(), indent=2)
    click.echo(report)
    if summary_path is not None:
        summary_path.write_text(report + "\n")


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

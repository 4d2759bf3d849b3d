"""The README's Python client example runs as written against a daemon."""

from __future__ import annotations

import contextlib
import io
import re
from typing import Any

from streamer.clients import open_input

from .conftest import ROOT, Daemon


def test_the_python_client_example_runs_as_written(start_daemon: Any) -> None:
    """The example under "Producers and socket types", on this daemon's ports: carphone's
    frames come back in order, under the producer's run, to the last one (a subscriber that
    joins a PUB socket may miss what is published before its subscription arrives)."""
    readme = (ROOT / "README.md").read_text()
    section = readme.split("## Producers and socket types", 1)[1]
    example = re.search(r"```python\n(.*?)```", section, re.DOTALL)
    assert example is not None, "no python example under Producers and socket types"
    daemon: Daemon = start_daemon()
    code = re.sub(r"tcp://127\.0\.0\.1:5555\b", daemon.ingress, example.group(1))
    code = re.sub(r"tcp://127\.0\.0\.1:5556\b", daemon.egress, code)
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        exec(compile(code, "README.md example", "exec"), {})
    lines = [line.split() for line in printed.getvalue().splitlines()]
    frames = open_input("carphone.mp4").frame_count()
    assert frames is not None and len(lines) > frames - 10
    assert [int(seq) for seq, _, _ in lines] == list(range(frames - len(lines), frames))
    assert len({run for _, run, _ in lines}) == 1
    assert daemon.stop() == 0

"""Sampling the daemon with py-spy under load: who holds the GIL, and at which line.

``py-spy record --gil --format raw --threads`` keeps, at each of its 200 samples a second,
the stack of the thread that holds the GIL (if one does), as one collapsed stack per line:
``thread (TID): NAME;frame (file:line);…;leaf (file:line) COUNT``. Code that runs without
the GIL (onnxruntime's ``run``, OpenCV's decoding and resizing) is not sampled: the
per-thread CPU table shows it. What is sampled is the Python work, which the daemon's
threads can only do one at a time. py-spy pauses the process for each sample (without the
pause, ``--nonblocking``, the stacks of the decode pool's threads come out torn), which
slows the daemon down by up to a third: a profiled run's rate is not a measurement.

:func:`hot_spots` gives how much of the time the GIL was held, each thread's share of that,
and each sample charged to the deepest frame in streamer's own code (``streamer/…``), so a
library call (numpy, json, pyzmq) counts against the daemon line that made it.
"""

from __future__ import annotations

import signal
import subprocess
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from streamer.bench.threads import py_spy_path
from streamer.errors import StreamerError

__all__ = ["HotSpot", "Profile", "Profiler", "hot_spots"]

RATE_HZ = 200
_STOP_TIMEOUT_S = 30.0
_TOP = 25


@dataclass(frozen=True)
class HotSpot:
    """A place samples fall.

    Attributes:
        where: ``function (file:line)`` of streamer's code, or a thread's name.
        share_pct: its share of the samples, %.
    """

    where: str
    share_pct: float


@dataclass(frozen=True)
class Profile:
    """What one profile says.

    Attributes:
        seconds: how long it sampled, s.
        samples: samples in which some thread held the GIL.
        gil_held_pct: ``samples`` ÷ the samples taken, %: how busy the GIL was.
        threads: each thread's share of ``samples``, largest first.
        lines: ``samples`` charged to their deepest frame in streamer's code, largest first
            (the top 25); ``(outside streamer)`` for stacks with no such frame.
        raw_path: the collapsed stacks.
    """

    seconds: float
    samples: int
    gil_held_pct: float
    threads: tuple[HotSpot, ...]
    lines: tuple[HotSpot, ...]
    raw_path: str


class Profiler:
    """``py-spy record --gil`` on a running process, from construction to :meth:`stop`.

    Args:
        pid: the process to sample.
        path: where the collapsed stacks go.

    Raises:
        StreamerError: py-spy is not installed.
    """

    def __init__(self, pid: int, path: Path) -> None:
        py_spy = py_spy_path()
        if py_spy is None:
            raise StreamerError("--profile needs py-spy: pip install 'streamer[bench]'")
        self.path = path
        command = [py_spy, "record", "--pid", str(pid), "--gil", "--threads", "--format", "raw"]
        command += ["--rate", str(RATE_HZ), "--output", str(path)]
        self._process = subprocess.Popen(
            command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
        )
        self._started = time.monotonic()

    def stop(self) -> Profile:
        """Stop sampling (SIGINT makes py-spy write its file) and summarise the profile.

        Raises:
            StreamerError: py-spy failed (e.g. not allowed to trace the process: ptrace).
        """
        seconds = time.monotonic() - self._started
        self._process.send_signal(signal.SIGINT)
        try:
            _, errors = self._process.communicate(timeout=_STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            self._process.kill()
            _, errors = self._process.communicate()
        if not self.path.is_file():
            raise StreamerError(f"py-spy wrote no profile: {errors.strip()[-500:]}")
        return hot_spots(self.path, seconds)


def hot_spots(path: Path, seconds: float) -> Profile:
    """Summarise a ``py-spy record --gil --threads --format raw`` file of ``seconds`` s."""
    threads: Counter[str] = Counter()
    lines: Counter[str] = Counter()
    for row in path.read_text().splitlines():
        stack, _, count = row.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        frames = stack.split(";")
        threads[frames[0].partition(": ")[2] or frames[0]] += int(count)
        lines[_deepest_own_frame(frames[1:])] += int(count)
    total = sum(threads.values())
    held = 100 * total / max(seconds * RATE_HZ, 1)
    return Profile(
        round(seconds, 3),
        total,
        round(held, 1),
        _shares(threads, total, None),
        _shares(lines, total, _TOP),
        str(path),
    )


def _deepest_own_frame(frames: list[str]) -> str:
    for frame in reversed(frames):
        if "(streamer/" in frame:
            return frame
    return "(outside streamer)"


def _shares(counts: Counter[str], total: int, top: int | None) -> tuple[HotSpot, ...]:
    return tuple(
        HotSpot(where, round(100 * n / max(total, 1), 2)) for where, n in counts.most_common(top)
    )

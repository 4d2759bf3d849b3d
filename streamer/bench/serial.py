"""``serial``: one thread doing decode → preprocess → infer → postprocess per frame.

The same work as the daemon's, in process, with no transport and no batching (batch 1):
what a program that calls the model in a loop gets.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import numpy as np

from streamer.bench.frameset import FrameSet
from streamer.bench.modes import SERIAL
from streamer.bench.stats import RunResult
from streamer.bench.work import FrameWork

__all__ = ["run_serial"]


def run_serial(
    work: FrameWork,
    frames: FrameSet,
    count: int,
    on_progress: Callable[[int], None] = lambda frames: None,
) -> RunResult:
    """Process ``count`` frames one after the other; latency is each frame's wall time.

    Args:
        work: the model and plug-ins.
        frames: the input.
        count: frames to process.
        on_progress: called with 1 after each frame.
    """
    latencies_ms: list[float] = []
    start_ns = time.monotonic_ns()
    for index in range(count):
        began_ns = time.monotonic_ns()
        _one_frame(work, frames, index)
        latencies_ms.append((time.monotonic_ns() - began_ns) / 1e6)
        on_progress(1)
    seconds = (time.monotonic_ns() - start_ns) / 1e9
    return RunResult.of(SERIAL, count, seconds, latencies_ms)


def _one_frame(work: FrameWork, frames: FrameSet, index: int) -> None:
    tensor, transform = work.preprocess(work.decode(*frames.decode_args(index)))
    work.postprocess(work.infer(np.expand_dims(tensor, 0)), [transform])

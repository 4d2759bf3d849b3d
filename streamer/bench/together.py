"""Inference timed with every replica of the model running at once.

The ``limit`` times inference alone, on one thread of an otherwise idle machine. The daemon
runs ``replicas`` sessions on each device at once (on a CPU, one per core with the default
config), and sessions running together share the caches and the memory bandwidth that one
alone has to itself. This times the same batches with one copy of the model per replica
(:meth:`~streamer.bench.work.FrameWork.replica_copies`), each on its own thread, all at
once, as the process's CPU time per frame: a part of the machine no daemon escapes, priced
by :mod:`.ceiling`.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable, Sequence

import numpy as np

from streamer.bench.clock import Cost, Stopwatch

__all__ = ["KEPT_FRAMES", "time_together"]

KEPT_FRAMES = 256
"""Frames whose model inputs the copies go round (bounded: ``--frames`` may be large)."""
_WARMUP_BATCHES = 8
"""Untimed batches each copy runs first: a new session's first runs allocate."""

Copy = Callable[[np.ndarray], object]


def time_together(
    copies: Sequence[Copy], tensors: np.ndarray, frames: int, batch_size: int
) -> Cost:
    """Each copy on its own thread, all at once, inferring about ``frames`` rows each in
    batches of ``batch_size`` rows, going round ``tensors``.

    Args:
        copies: one callable per replica, each taking a batch (batch first).
        tensors: model inputs, batch first; at least one row.
        frames: rows each copy infers, rounded up to whole batches.
        batch_size: rows per batch (a batch of all of ``tensors`` when it has fewer).

    Returns:
        CPU time of the process per row inferred (all copies' rows); wall time per row too,
        which is a throughput figure here (the copies overlap), not one row's time.
    """
    step = min(batch_size, len(tensors))
    batches = [tensors[i : i + step] for i in range(0, len(tensors) - step + 1, step)]
    calls = math.ceil(frames / step)
    rows = sum(len(batches[index % len(batches)]) for index in range(calls))

    def infer(copy: Copy, count: int) -> None:
        for index in range(count):
            copy(batches[index % len(batches)])

    for copy in copies:
        infer(copy, _WARMUP_BATCHES)
    threads = [threading.Thread(target=infer, args=(copy, calls)) for copy in copies]
    watch = Stopwatch(time.process_time_ns)
    with watch.timing(rows * len(copies)):
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    return watch.cost()

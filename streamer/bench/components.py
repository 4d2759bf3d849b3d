"""``components`` and ``limit``: what each step costs alone, and the bound that follows.

Each step runs alone on one thread over the same frames, in chunks of the largest batch
size, and is timed as CPU time and wall time per frame (:mod:`.clock`): decode, preprocess
and postprocess (on the outputs of the largest batch size, one call per batch as the dequeue
thread makes) by the calling thread's CPU time; inference at every batch size by the
process's, so that an intra-op thread pool counts (each chunk runs once per size, so every
size sees the same frames at the same moments of a noisy machine). CPU that such a pool
spends spinning after a run, while the other steps are timed, is not counted.

The ``limit`` is what no implementation on this machine can beat without doing less work:
CPU cores ÷ the CPU time per frame of decode + preprocess + inference at its cheapest batch
size + postprocess.

Inference at the round's cheapest batch size is also timed with every replica of the model
running at once (``every_replica``, :mod:`.together`; onnxruntime only), for :mod:`.ceiling`.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

import numpy as np

from streamer.bench.clock import Cost, Stopwatch
from streamer.bench.frameset import FrameSet
from streamer.bench.together import KEPT_FRAMES, time_together
from streamer.bench.work import FrameWork

__all__ = [
    "Components",
    "Limit",
    "cpu_cores",
    "find_limit",
    "measure_components",
    "mean_run_rows",
]


@dataclass(frozen=True)
class Components:
    """Per-frame cost of each step alone.

    Attributes:
        decode, preprocess, postprocess: per frame.
        inference: batch size → per-frame cost at that batch size.
        every_replica: batch size → per-frame cost of inference at that batch size with
            every replica of the model running at once (:mod:`.together`), for the batch
            sizes that were the cheapest alone in some round; empty where the backend has
            no copies to run (:func:`~streamer.bench.work.replica_sessions`).
    """

    decode: Cost
    preprocess: Cost
    inference: dict[int, Cost]
    postprocess: Cost
    every_replica: dict[int, Cost] = field(default_factory=dict)

    def cheapest(self, other: Components) -> Components:
        """Each step at the lower of its CPU costs in ``self`` and ``other`` (two rounds'
        measurements of the same steps)."""

        def lower(mine: Cost, theirs: Cost) -> Cost:
            return theirs if theirs.cpu_ms < mine.cpu_ms else mine

        together = dict(other.every_replica)
        for size, cost in self.every_replica.items():
            together[size] = lower(cost, together[size]) if size in together else cost
        return Components(
            lower(self.decode, other.decode),
            lower(self.preprocess, other.preprocess),
            {size: lower(cost, other.inference[size]) for size, cost in self.inference.items()},
            lower(self.postprocess, other.postprocess),
            together,
        )

    def best_batch_size(self) -> int:
        """The batch size with the least inference CPU time per frame."""
        return min(self.inference, key=lambda size: self.inference[size].cpu_ms)

    def inference_at(self, rows: float) -> Cost:
        """Inference cost per frame in runs of ``rows`` rows, interpolated between the
        measured batch sizes (a mean batch is fractional)."""
        sizes = sorted(self.inference)
        costs = [self.inference[size] for size in sizes]
        return Cost(
            float(np.interp(rows, sizes, [c.cpu_ms for c in costs])),
            float(np.interp(rows, sizes, [c.wall_ms for c in costs])),
            sum(c.frames for c in costs),
        )

    def inference_in_runs(self, batch: float, rows_per_run: int) -> Cost:
        """Inference cost per frame of batches of ``batch`` frames cut into runs of at most
        ``rows_per_run`` rows (0 = whole batches), as onnxruntime's ``rows_per_run`` cuts
        them: the full runs, and the rest in one shorter run."""
        if not rows_per_run or batch <= rows_per_run:
            return self.inference_at(batch)
        full = math.floor(batch / rows_per_run) * rows_per_run
        runs, rest = self.inference_at(rows_per_run), self.inference_at(batch - full)
        share = full / batch
        return Cost(
            share * runs.cpu_ms + (1 - share) * rest.cpu_ms,
            share * runs.wall_ms + (1 - share) * rest.wall_ms,
            runs.frames,
        )

    def cpu_ms_per_frame(self, batch_size: int) -> float:
        """CPU ms per frame of all four steps, inference at ``batch_size``."""
        steps = (self.decode, self.preprocess, self.inference[batch_size], self.postprocess)
        return sum(step.cpu_ms for step in steps)


@dataclass(frozen=True)
class Limit:
    """The machine's bound for one input.

    Attributes:
        fps: frames per second, ``cores * 1000 / cpu_ms_per_frame``.
        batch_size: the inference batch size it assumes (the cheapest).
        cpu_ms_per_frame: decode + preprocess + inference + postprocess, CPU ms.
        cores: CPU cores this process may run on.
    """

    fps: float
    batch_size: int
    cpu_ms_per_frame: float
    cores: int


def mean_run_rows(batch: float, rows_per_run: int) -> float:
    """Mean rows of a model run for batches of ``batch`` frames cut into runs of at most
    ``rows_per_run`` rows (0 = whole batches): 8 in runs of 3 is 3 + 3 + 2, 2.67."""
    if not rows_per_run or batch <= rows_per_run:
        return batch
    return batch / math.ceil(batch / rows_per_run)


def cpu_cores() -> int:
    """CPU cores this process may run on (its affinity mask)."""
    return len(os.sched_getaffinity(0))


def find_limit(components: Components, cores: int) -> Limit:
    """The ``limit`` of one input from its components."""
    batch_size = components.best_batch_size()
    cpu_ms = components.cpu_ms_per_frame(batch_size)
    return Limit(cores * 1000.0 / cpu_ms, batch_size, cpu_ms, cores)


def measure_components(
    work: FrameWork,
    frames: FrameSet,
    count: int,
    batch_sizes: Sequence[int],
    on_progress: Callable[[int], None] = lambda frames: None,
) -> Components:
    """Time each step alone over ``count`` frames (rounded up to whole chunks).

    Args:
        work: the model and plug-ins to time.
        frames: the input.
        count: frames to time each step over, at least 1.
        batch_sizes: inference batch sizes, ascending; the largest is the chunk size.
        on_progress: called with the frames of each chunk once it is done, then with those
            of ``every_replica`` (the timed frames once per replica).
    """
    chunk = max(batch_sizes)
    watches = _Watches(batch_sizes)
    _warm_up(work, frames, batch_sizes)
    kept: list[np.ndarray] = []  # model inputs for every_replica, at most KEPT_FRAMES
    timed = math.ceil(count / chunk) * chunk
    for start in range(0, timed, chunk):
        tensors = _time_chunk(work, frames, range(start, start + chunk), watches)
        if start < KEPT_FRAMES:
            kept.append(tensors)
        on_progress(chunk)
    alone = watches.components()
    copies = work.replica_copies()
    if not copies:
        return alone
    best = alone.best_batch_size()
    together = time_together(copies, np.concatenate(kept), timed, best)
    on_progress(timed * len(copies))
    return replace(alone, every_replica={best: together})


class _Watches:
    """One stopwatch per step and batch size."""

    def __init__(self, batch_sizes: Sequence[int]) -> None:
        self.decode = Stopwatch(time.thread_time_ns)
        self.preprocess = Stopwatch(time.thread_time_ns)
        self.postprocess = Stopwatch(time.thread_time_ns)
        self.inference = {size: Stopwatch(time.process_time_ns) for size in sorted(batch_sizes)}

    def components(self) -> Components:
        inference = {size: watch.cost() for size, watch in self.inference.items()}
        return Components(
            self.decode.cost(), self.preprocess.cost(), inference, self.postprocess.cost()
        )


def _warm_up(work: FrameWork, frames: FrameSet, batch_sizes: Sequence[int]) -> None:
    """One untimed pass of every step and batch size (first calls allocate)."""
    tensor, transform = work.preprocess(work.decode(*frames.decode_args(0)))
    for size in batch_sizes:
        outputs = work.infer(np.repeat(tensor[None], size, axis=0))
    work.postprocess(outputs, [transform])


def _time_chunk(work: FrameWork, frames: FrameSet, indices: range, watches: _Watches) -> np.ndarray:
    """Time every step over one chunk of ``max(batch_sizes)`` frames; returns the chunk's
    model inputs."""
    n = len(indices)
    with watches.decode.timing(n):
        images = [work.decode(*frames.decode_args(i)) for i in indices]
    with watches.preprocess.timing(n):
        prepared = [work.preprocess(image) for image in images]
    tensors = np.stack([tensor for tensor, _ in prepared])
    outputs: Sequence[np.ndarray] = ()
    for size, watch in watches.inference.items():  # ascending: the chunk's size comes last
        with watch.timing(n):
            for j in range(0, n, size):
                outputs = work.infer(tensors[j : j + size])
    with watches.postprocess.timing(n):
        work.postprocess(outputs, [transform for _, transform in prepared])
    return tensors

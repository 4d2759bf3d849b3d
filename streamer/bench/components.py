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

Inference at that batch size is also timed with every core running a copy of the model at
once (``every_core``; onnxruntime only, a session per core as the daemon's replicas): cores
busy together share the caches and memory bandwidth a step alone has to itself, which is
part of what :mod:`.ceiling` shows a daemon cannot escape.
"""

from __future__ import annotations

import math
import os
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

import numpy as np

from streamer.bench.clock import Cost, Stopwatch
from streamer.bench.frameset import FrameSet
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
        every_core: inference at the cheapest batch size with every core running a copy
            of the model at once, process CPU per frame; None where the backend gives no
            copies (:meth:`~streamer.bench.work.FrameWork.inference_copies`).
    """

    decode: Cost
    preprocess: Cost
    inference: dict[int, Cost]
    postprocess: Cost
    every_core: Cost | None = None

    def cheapest(self, other: Components) -> Components:
        """Each step at the lower of its CPU costs in ``self`` and ``other`` (two rounds'
        measurements of the same steps)."""

        def lower(mine: Cost, theirs: Cost) -> Cost:
            return theirs if theirs.cpu_ms < mine.cpu_ms else mine

        every_core = [c for c in (self.every_core, other.every_core) if c is not None]
        return Components(
            lower(self.decode, other.decode),
            lower(self.preprocess, other.preprocess),
            {size: lower(cost, other.inference[size]) for size, cost in self.inference.items()},
            lower(self.postprocess, other.postprocess),
            min(every_core, key=lambda cost: cost.cpu_ms, default=None),
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


_EVERY_CORE_WARMUP = 8
"""Untimed batches each copy runs before ``every_core`` is timed."""
_EVERY_CORE_KEPT = 256
"""Frames whose model inputs ``every_core`` goes round (bounded: ``--frames`` may be large)."""


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
        on_progress: called with the frames of each chunk once it is done.
    """
    chunk = max(batch_sizes)
    watches = _Watches(batch_sizes)
    _warm_up(work, frames, batch_sizes)
    kept: list[np.ndarray] = []  # model inputs for every_core, at most _EVERY_CORE_KEPT
    timed = math.ceil(count / chunk) * chunk
    for start in range(0, timed, chunk):
        tensors = _time_chunk(work, frames, range(start, start + chunk), watches)
        if start < _EVERY_CORE_KEPT:
            kept.append(tensors)
        on_progress(chunk)
    alone = watches.components()
    copies = work.inference_copies(cpu_cores())
    if not copies:
        return alone
    every_core = _time_every_core(copies, np.concatenate(kept), timed, alone.best_batch_size())
    return replace(alone, every_core=every_core)


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


def _time_every_core(
    copies: Sequence[Callable[[np.ndarray], object]],
    tensors: np.ndarray,
    frames: int,
    batch_size: int,
) -> Cost:
    """Each copy on its own thread, all at once, inferring ``frames`` rows in batches of
    ``batch_size``, going round ``tensors``: the process's CPU time per frame (each copy
    first runs :data:`_EVERY_CORE_WARMUP` batches untimed: a new session's first runs
    allocate)."""
    batches = [tensors[i : i + batch_size] for i in range(0, len(tensors), batch_size)]

    def infer(copy: Callable[[np.ndarray], object], rows: int) -> None:
        for index in range(math.ceil(rows / batch_size)):
            copy(batches[index % len(batches)])

    for copy in copies:
        infer(copy, _EVERY_CORE_WARMUP * batch_size)
    threads = [threading.Thread(target=infer, args=(copy, frames)) for copy in copies]
    per_copy = math.ceil(frames / batch_size) * batch_size
    watch = Stopwatch(time.process_time_ns)
    with watch.timing(per_copy * len(copies)):
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    return watch.cost()

"""The ``ceiling``: what any daemon could reach on this machine, with its producer and
subscriber beside it.

The ``limit`` (:mod:`.components`) prices each step alone on an otherwise idle machine. A
daemon measured here cannot have that machine: its producer and its subscriber run on the
same cores (the loopback's TCP work with them), and its inference runs on every core at
once, where copies of the model share the caches and memory bandwidth that one copy alone
has to itself. The ceiling prices those too:

    cores ÷ (decode + preprocess + postprocess, each alone
             + inference at the limit's batch size with every core busy
             + the producer's and the subscriber's CPU per frame)

A daemon with no overhead of its own would reach it; the gap between the two is the
daemon's. It is shown, not judged: the targets stay against the limit (issue 8).
"""

from __future__ import annotations

from dataclasses import dataclass

from streamer.bench.components import Components, Limit

__all__ = ["Ceiling", "find_ceiling"]


@dataclass(frozen=True)
class Ceiling:
    """The bound of one input for a daemon sharing the machine with its load.

    Attributes:
        fps: frames per second, ``cores * 1000 / cpu_ms_per_frame``.
        limit_ratio: ``fps`` ÷ the limit's.
        cpu_ms_per_frame: everything priced (module docstring), CPU ms per frame.
        inference_every_core_ms: inference at the limit's batch size, every core busy.
        inference_alone_ms: the same, one thread alone (the limit's).
        producer_cpu_ms: the producer process's CPU per frame in the daemon's run.
        subscriber_cpu_ms: the subscriber's (the benchmark process's) in that run.
    """

    fps: float
    limit_ratio: float
    cpu_ms_per_frame: float
    inference_every_core_ms: float
    inference_alone_ms: float
    producer_cpu_ms: float
    subscriber_cpu_ms: float


def find_ceiling(
    components: Components, limit: Limit, producer_cpu_ms: float, subscriber_cpu_ms: float
) -> Ceiling | None:
    """The ceiling of one input, or None without ``components.every_core`` (a backend
    with no copies of the model to run at once).

    Args:
        components: the steps alone, with ``every_core`` measured.
        limit: the input's limit, from the same components.
        producer_cpu_ms: the producer's CPU per frame, ms, in the daemon run compared.
        subscriber_cpu_ms: the subscriber's CPU per frame, ms, in that run.
    """
    if components.every_core is None:
        return None
    every_core = components.every_core.cpu_ms
    steps = (components.decode, components.preprocess, components.postprocess)
    cpu_ms = sum(s.cpu_ms for s in steps) + every_core + producer_cpu_ms + subscriber_cpu_ms
    fps = limit.cores * 1000.0 / cpu_ms
    return Ceiling(
        fps=round(fps, 1),
        limit_ratio=round(fps / limit.fps, 4),
        cpu_ms_per_frame=round(cpu_ms, 4),
        inference_every_core_ms=round(every_core, 4),
        inference_alone_ms=round(components.inference[limit.batch_size].cpu_ms, 4),
        producer_cpu_ms=producer_cpu_ms,
        subscriber_cpu_ms=subscriber_cpu_ms,
    )

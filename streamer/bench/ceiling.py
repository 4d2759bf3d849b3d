"""The ``ceiling``: the limit's work priced on the machine the daemon actually has.

The ``limit`` (:mod:`.components`) prices each step alone on an otherwise idle machine. A
daemon measured here cannot have that machine: its producer and its subscriber run on the
same cores (the loopback's TCP work with them), and its replicas infer at once, sharing the
caches and memory bandwidth that one session alone has to itself (:mod:`.together`). The
ceiling prices those too:

    cores ÷ (decode + preprocess + postprocess, each alone
             + inference with every replica at once, at the batch size where that costs
               least, and never less than the same batch alone
             + the producer's and the subscriber's CPU per frame)

Inference together is counted at no less than alone because running at once only adds
cost; a lower measurement is the noise of a shared machine. So the ceiling never exceeds
the limit. Like the limit it prices the whole work: a daemon that does less (a JPEG decoded
at reduced size) can pass it. A daemon with no overhead of its own would reach it; the gap
between the two is the daemon's. It is shown, not judged: the targets stay against the
limit (issue 8).
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
        batch_size: the batch size of the inference priced.
        inference_together_ms: inference at ``batch_size`` with every replica at once,
            CPU ms per frame, as measured.
        inference_alone_ms: inference at ``batch_size`` alone (the larger of the two is
            priced).
        producer_cpu_ms: the producer process's CPU per frame in the daemon's run.
        subscriber_cpu_ms: the subscriber's (the benchmark process's) in that run.
    """

    fps: float
    limit_ratio: float
    cpu_ms_per_frame: float
    batch_size: int
    inference_together_ms: float
    inference_alone_ms: float
    producer_cpu_ms: float
    subscriber_cpu_ms: float


def find_ceiling(
    components: Components, limit: Limit, producer_cpu_ms: float, subscriber_cpu_ms: float
) -> Ceiling | None:
    """The ceiling of one input, or None without ``components.every_replica`` (a backend
    with no copies of the model to run at once).

    Args:
        components: the steps alone, with ``every_replica`` measured.
        limit: the input's limit, from the same components.
        producer_cpu_ms: the producer's CPU per frame, ms, in the daemon run compared.
        subscriber_cpu_ms: the subscriber's CPU per frame, ms, in that run.
    """
    if not components.every_replica:
        return None

    def priced(size: int) -> float:
        return max(components.every_replica[size].cpu_ms, components.inference[size].cpu_ms)

    size = min(components.every_replica, key=priced)
    steps = (components.decode, components.preprocess, components.postprocess)
    cpu_ms = sum(s.cpu_ms for s in steps) + priced(size) + producer_cpu_ms + subscriber_cpu_ms
    fps = limit.cores * 1000.0 / cpu_ms
    return Ceiling(
        fps=round(fps, 1),
        limit_ratio=round(fps / limit.fps, 4),
        cpu_ms_per_frame=round(cpu_ms, 4),
        batch_size=size,
        inference_together_ms=round(components.every_replica[size].cpu_ms, 4),
        inference_alone_ms=round(components.inference[size].cpu_ms, 4),
        producer_cpu_ms=producer_cpu_ms,
        subscriber_cpu_ms=subscriber_cpu_ms,
    )

"""Frame records and outcome accounting.

A :class:`Frame` is created by an ingress for every message it receives and travels down the
pipeline (DESIGN.md §1) until it reaches exactly one terminal outcome: *published* (a result),
*failed* (an error result, also published) or *dropped* (counted with a reason).
:class:`OutcomeCounts` keeps the tally; once in-flight work is drained,
``received == published + failed + dropped``.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from streamer.errors import FrameError

__all__ = ["STOP", "Batch", "EndOfStream", "Frame", "OutcomeCounts", "OutcomeSnapshot"]


class _Stop:
    """Type of :data:`STOP`."""

    def __repr__(self) -> str:
        return "STOP"


STOP = _Stop()
"""In-band marker a stage puts after its last item when the pipeline shuts down."""


@dataclass(slots=True, eq=False)
class Frame:
    """One image travelling through the pipeline.

    Attributes:
        source: id of the camera or stream that sent it (header ``source``).
        seq: per-source sequence number from the producer (header ``seq``).
        received_at_ns: ``time.monotonic_ns()`` when the ingress received it.
        received_at: wall-clock Unix time (s) when the ingress received it.
        ts: the producer's capture time (Unix s), or None.
        meta: the producer's ``meta`` object, echoed back in the result.
        run: the producer's run id (header ``run``), or None; ``seq`` counts per run.
        encoding: ``jpeg`` | ``png`` | ``raw``.
        header: the parsed wire header (needed to decode ``raw`` payloads).
        payload: the encoded bytes; released once decoded.
        image: the decoded image, BGR uint8 of shape (height, width, 3); kept after
            preprocessing only while a later stage needs it.
        width, height: size of the image in pixels, from its header once the ingress checked
            it, as decoded after that (0 until then).
        tensor: the model input for this frame without the batch axis, e.g. float32
            (3, 128, 128) NCHW for BlazeFace.
        transform: maps model-input pixel coordinates back to image pixels (set by the
            preprocessor, read by the postprocessor).
        results: what the postprocessor produced, merged into the published JSON
            (e.g. ``{"detections": [...]}``).
        error: set when the frame failed; it is then published as an error result.
        model: name of the model (stage) that produced ``results``.
        prepared_at_ns, batched_at_ns, infer_start_ns, infer_end_ns: monotonic timestamps
            (ns) for the latency split: preprocessing done, enqueued in a batch, execution.
        pending: the future of the decode+preprocess job while it runs on the worker pool.
        parent: for an item of an item stage (a pyramid gear, a crop), the frame it
            belongs to; items are never published themselves.
        children: a frame's items in the stage it is in, while they run; [] when it has none
            there.
        outstanding: its items not yet back (guarded by the chain router's lock).
        handover: while it goes from a stage to the next through the ``tensor`` adapter, the
            next stage's inputs made from its batch, shared by that batch's frames (a
            :class:`~streamer.scheduling.tensor_link.Handover`); None otherwise.
        epoch, order: the source's stream epoch (a new one after its idle eviction) and the
            frame's arrival index within it, from
            :class:`~streamer.scheduling.sources.SourceTracker`; egress publishes each
            (source, epoch) in ``order``. ``order`` is -1 for frames outside any stream (a
            header too broken to name its source, a new source beyond
            ``daemon.max_sources``).
    """

    source: str
    seq: int
    received_at_ns: int
    received_at: float
    ts: float | None = None
    meta: dict[str, Any] | None = None
    run: str | None = None
    encoding: str = ""
    header: dict[str, Any] = field(default_factory=dict)
    payload: bytes | memoryview | None = None
    image: np.ndarray | None = None
    width: int = 0
    height: int = 0
    tensor: np.ndarray | None = None
    transform: Any = None
    results: dict[str, Any] = field(default_factory=dict)
    error: FrameError | None = None
    model: str = ""
    prepared_at_ns: int = 0
    batched_at_ns: int = 0
    infer_start_ns: int = 0
    infer_end_ns: int = 0
    pending: Future[Frame] | None = None
    parent: Frame | None = None
    children: list[Frame] | None = None
    outstanding: int = 0
    handover: Any = None
    epoch: int = 0
    order: int = -1

    def fail(self, error: FrameError) -> None:
        """Mark the frame failed and release its pixel buffers (it goes straight to egress)."""
        self.error = error
        self.release()

    def release(self) -> None:
        """Drop the frame's pixel buffers (payload, image, tensor)."""
        self.payload = None
        self.image = None
        self.tensor = None


@dataclass(slots=True, eq=False)
class Batch:
    """Frames flushed together by a batcher, in arrival order.

    Failed frames (bad header, decode failure) ride along in ``frames`` at their arrival
    position so that results leave in order, but take no row of the model input.

    Attributes:
        frames: every frame of the batch, in arrival order.
        good: the frames that were enqueued into the model, in row order.
        rows: the batch size the model executed (``len(good)`` plus padding rows).
    """

    frames: list[Frame]
    good: list[Frame] = field(default_factory=list)
    rows: int = 0


@dataclass(slots=True, eq=False)
class EndOfStream:
    """In-band marker: the producer of ``source`` sent end-of-stream after frame ``seq``.

    It travels the same queues as frames, so it reaches egress after every frame of that
    source received before it, and egress then publishes an ``eos`` result. ``run`` is the
    producer's run id (header ``run``), or None.
    """

    source: str
    seq: int
    received_at: float = field(default_factory=time.time)
    run: str | None = None
    epoch: int = 0
    order: int = -1


@dataclass(frozen=True)
class OutcomeSnapshot:
    """A consistent copy of the counters; ``in_flight`` = received - all terminal outcomes."""

    received: int
    published: int
    failed: dict[str, int]
    dropped: dict[str, int]

    @property
    def failed_total(self) -> int:
        return sum(self.failed.values())

    @property
    def dropped_total(self) -> int:
        return sum(self.dropped.values())

    @property
    def in_flight(self) -> int:
        return self.received - self.published - self.failed_total - self.dropped_total

    def as_log_fields(self) -> dict[str, Any]:
        """Flat key=value fields for the final log line."""
        return {
            "received": self.received,
            "published": self.published,
            "failed": self.failed_total,
            "dropped": self.dropped_total,
            "failed_by_reason": dict(self.failed),
            "dropped_by_reason": dict(self.dropped),
        }


class OutcomeCounts:
    """Thread-safe tally of frame outcomes. Any thread may call any method."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._received = 0
        self._published = 0
        self._failed: Counter[str] = Counter()
        self._dropped: Counter[str] = Counter()

    def received(self, n: int = 1) -> None:
        with self._lock:
            self._received += n

    def published(self, n: int = 1) -> None:
        """Count ``n`` frames published with a normal (non-error) result."""
        with self._lock:
            self._published += n

    def failed(self, reason: str, n: int = 1) -> None:
        """Count ``n`` frames published as error results with ``reason``."""
        with self._lock:
            self._failed[reason] += n

    def dropped(self, reason: str, n: int = 1) -> None:
        """Count ``n`` frames dropped (not published) for ``reason``."""
        with self._lock:
            self._dropped[reason] += n

    def snapshot(self) -> OutcomeSnapshot:
        with self._lock:
            return OutcomeSnapshot(
                self._received, self._published, dict(self._failed), dict(self._dropped)
            )

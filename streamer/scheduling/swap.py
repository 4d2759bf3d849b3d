"""The in-band marker that swaps a running model for a reloaded one without losing a frame."""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from streamer.frames import Frame
from streamer.runtime.base import QueueModel
from streamer.scheduling.policy import BatchPolicy

__all__ = ["Postprocess", "StageSwap"]

Postprocess = Callable[[Sequence[np.ndarray], list[Frame]], None]
"""Fills ``frame.results`` for each frame from the batch-first model outputs (rows in frame
order; padding rows after them)."""


@dataclass(eq=False)
class StageSwap:
    """Switch a stage's threads to new models at this point of the stream.

    Frames queued before the marker run on the old models, frames after it on the new ones
    (they were preprocessed for them). The batcher switches policy when it takes the marker
    and passes it to every replica; each enqueue thread switches at once, each dequeue thread
    once every batch of the old model came back. When all have, ``done`` is set and the old
    models may be closed.

    Attributes:
        models: the new models, one per replica, loaded and checked.
        policy: their batch policy.
        postprocess: their postprocessor over a batch.
        done: set once no old model has anything in flight.
    """

    models: list[QueueModel]
    policy: BatchPolicy
    postprocess: Postprocess
    done: threading.Event = field(default_factory=threading.Event)
    _switched: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def replica_switched(self) -> None:
        """Called by each dequeue thread once its old model is drained."""
        with self._lock:
            self._switched += 1
            if self._switched == len(self.models):
                self.done.set()

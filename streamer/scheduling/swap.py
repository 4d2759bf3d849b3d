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
    """Switch the batcher and the dequeue thread to ``model`` at this point of the stream.

    Frames queued before the marker run on the old model, frames after it on the new one
    (they were preprocessed for it). The batcher switches when it takes the marker, the
    dequeue thread once every batch of the old model came back; it then sets ``done`` and
    the old model may be closed.

    Attributes:
        model: the new model, loaded and checked.
        policy: its batch policy.
        postprocess: its postprocessor over a batch.
        done: set by the dequeue thread once the old model has nothing in flight.
    """

    model: QueueModel
    policy: BatchPolicy
    postprocess: Postprocess
    done: threading.Event = field(default_factory=threading.Event)

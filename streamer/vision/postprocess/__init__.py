"""Postprocessors: one batch of model outputs → one result dict per frame.

A :class:`Postprocessor` runs on a model replica's dequeue thread. Built-in plug-ins, registered
in :data:`streamer.vision.registry.POSTPROCESSORS` when this package is imported:

- ``blazeface`` (:mod:`streamer.vision.postprocess.blazeface`): MediaPipe BlazeFace face
  detections.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

from streamer.runtime.base import Tensor
from streamer.vision.preprocess import LetterboxTransform

__all__ = ["BlazeFace", "BlazeFaceParams", "Postprocessor"]


class Postprocessor(Protocol):
    """Turns one batch of model outputs into per-frame results; thread-safe.

    Attributes:
        detects: whether its results have ``detections`` (boxes a ``crops`` stage can read).
    """

    detects: bool

    def __call__(
        self, outputs: Sequence[Tensor], transforms: Sequence[LetterboxTransform]
    ) -> list[dict[str, Any]]:
        """Postprocess one batch.

        Args:
            outputs: one array per model output, in ``ModelInfo.outputs`` order, batch first;
                the batch may be padded: only the first ``len(transforms)`` rows are frames.
                Device tensors (on a backend with device memory) only for a plug-in whose
                parameters ask for them (:attr:`~streamer.vision.registry.PluginParams.
                device_outputs`); the caller releases them after the call.
            transforms: each real frame's transform from model input to image pixels.

        Returns:
            One dict per frame, in order, merged into its published result JSON (e.g.
            ``{"detections": [...]}``; coordinates in pixels of the decoded image).

        Raises:
            FrameError: ``postprocess_failed``; every frame of the batch fails with it.
        """
        ...


# Imported after the protocol so that plug-in modules may import it from here.
from streamer.vision.postprocess.blazeface import BlazeFace, BlazeFaceParams  # noqa: E402

"""The whole cascade in one call: P-Net → R-Net → O-Net on one image, in process.

The order in which a pipeline chain runs the stages (one frame at a time here, batched across
frames there), and the reference its results can be compared with.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from streamer.vision.mtcnn.pnet import PNet
from streamer.vision.mtcnn.refine import ONet, RNet

__all__ = ["Cascade", "Infer"]

Infer = Callable[[str, np.ndarray], Sequence[np.ndarray]]
"""Runs one batch through a model: ``(stage, inputs) -> outputs``; ``stage`` is ``pnet``,
``rnet`` or ``onet``, ``inputs`` the batch as the stage's ``prepare`` made it (float32, or
uint8 pixels for a model that normalises: :func:`.layout.to_input`), outputs in model order,
batch first."""


@dataclass(frozen=True)
class Cascade:
    """MTCNN's three stages, with default parameters unless given."""

    pnet: PNet = field(default_factory=PNet)
    rnet: RNet = field(default_factory=RNet)
    onet: ONet = field(default_factory=ONet)

    def detect(self, image: np.ndarray, infer: Infer) -> list[dict[str, Any]]:
        """The faces in one image.

        Args:
            image: BGR uint8 (H, W, 3).
            infer: runs a batch through the named stage's model.

        Returns:
            :meth:`ONet.finish`'s faces; empty as soon as a stage keeps no box.
        """
        tensors, transforms = self.pnet.prepare(image)
        candidates = [
            found
            for tensor, transform in zip(tensors, transforms, strict=True)
            for found in self.pnet.decode(infer("pnet", tensor[None]), [transform])
        ]
        detections = self.pnet.merge(candidates)
        for stage in (self.rnet, self.onet):
            if not detections:
                return []
            inputs, crops = stage.prepare(image, detections)
            detections = stage.finish(infer(stage.name, inputs), crops)
        return detections

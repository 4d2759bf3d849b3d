"""Item stages: models that run several inputs per frame (a pyramid, one crop per detection).

A frame enters such a stage, :meth:`ItemStage.items` turns it into *items* (one input tensor
each, without the batch axis), the items are batched across frames like frames are, and once
every item of the frame came back :meth:`ItemStage.finish` folds their outputs into the
frame's results. Selected by the model's ``postprocess.kind``; the stage prepares its own
inputs, so such a model has no ``preprocess`` table.

======================= ================================== ==================================
kind                    items of a frame                   finish
======================= ================================== ==================================
``mtcnn_pnet``          one P-Net input per pyramid gear   ``detections`` = the proposals
``mtcnn_rnet``          a 24x24 crop per detection         ``detections`` = the refined boxes
``mtcnn_onet``          a 48x48 crop per detection         ``merge = "replace"``: ``detections``
                                                           = the faces with five keypoints;
                                                           ``"attach"``: each detection gets
                                                           ``onet`` (its face, or null)
``mtcnn_classify``      the whole frame, squared and       ``face``: ``{"score", "is_face"}``
                        resized to R-Net's or O-Net's      (R-Net or O-Net as a face /
                        input                              non-face classifier)
======================= ================================== ==================================

Every MTCNN stage takes ``normalize = "host" | "model" | "device"``, the letterbox's choice
(:mod:`streamer.vision.mtcnn.layout`): the host crops and resizes, and normalises too
(``host``, default), or sends uint8 pixels that the model normalises, in the graph on
onnxruntime (``model``: the backend reads the table, :mod:`streamer.runtime.mtcnn_keys`) or
by the ``.om``'s static AIPP (``device``). Each stage checks at start-up that its model's
input takes what it sends.

MTCNN: Zhang et al. 2016, "Joint Face Detection and Alignment using Multi-task Cascaded
Convolutional Networks" (see :mod:`streamer.vision.mtcnn`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal, Protocol

import numpy as np
from pydantic import Field

from streamer.runtime.base import ModelInfo
from streamer.runtime.ops.base import Operators
from streamer.vision.crops import CropParams, Crops
from streamer.vision.mtcnn import ONet, ONetParams, PNet, PNetParams, RNet, RNetParams
from streamer.vision.mtcnn.layout import (
    LANDMARKS,
    PROBABILITY,
    REGRESSION,
    InputParams,
    check_input,
    check_outputs,
    split_outputs,
    to_input,
)
from streamer.vision.registry import Registry

__all__ = ["ITEM_STAGES", "ItemStage", "ONetStageParams"]

ItemOutputs = tuple[np.ndarray, ...]
"""One item's outputs: one array per model output, without the batch axis."""


class ItemStage(Protocol):
    """A stage that runs several items per frame. Implementations are thread-safe.

    Attributes:
        detects: whether its results have ``detections`` (boxes a ``crops`` stage can read).
        crops_upstream: whether its items are crops of the upstream stage's detections (it
            needs one: with ``input = "frame"`` it would never run).
    """

    detects: bool
    crops_upstream: bool

    def items(
        self, image: np.ndarray, results: dict[str, Any]
    ) -> tuple[list[np.ndarray], list[Any]]:
        """The inputs of one frame: tensors (no batch axis) and a transform for each.

        Args:
            image: the decoded frame, BGR uint8 (H, W, 3).
            results: the frame's results so far (the upstream stages' ``detections``).
        """

    def finish(
        self, outputs: Sequence[ItemOutputs], transforms: Sequence[Any], results: dict[str, Any]
    ) -> dict[str, Any]:
        """The frame's results once all of its items ran (``results`` updated and returned);
        for a first stage (``input = "frame"``) that had no item for the frame, called with
        none: its answer without them (P-Net: empty ``detections``)."""


def _stacked(outputs: Sequence[ItemOutputs]) -> list[np.ndarray]:
    """Per-item outputs back to batch-first arrays, one per model output."""
    return [np.stack([item[k] for item in outputs]) for k in range(len(outputs[0]))]


def _detections(results: dict[str, Any]) -> list[dict[str, Any]]:
    found = results.get("detections")
    return found if isinstance(found, list) else []


def _crop_items(
    net: RNet | ONet, image: np.ndarray, results: dict[str, Any]
) -> tuple[list[np.ndarray], list[Any]]:
    """One square crop per upstream detection, in the refining net's layout; none without."""
    found = _detections(results)
    if not found:
        return [], []
    inputs, transforms = net.prepare(image, found)
    return list(inputs), list(transforms)


class PNetStage:
    """MTCNN's P-Net over fixed pyramid gears.

    Raises:
        ConfigError: bad parameters (:class:`PNet`), the model's input does not take what
            ``normalize`` sends (:func:`.mtcnn.layout.check_input`; nor, for R-Net and O-Net,
            their crops' size), or its outputs are not the net's
            (:func:`.mtcnn.layout.check_outputs`).
    """

    detects = True
    crops_upstream = False

    def __init__(
        self, params: PNetParams, info: ModelInfo, operators: Operators | None = None
    ) -> None:
        check_input(info, params.normalize)
        check_outputs(info, (REGRESSION, PROBABILITY))
        self._pnet = PNet(params, operators)

    def items(
        self, image: np.ndarray, results: dict[str, Any]
    ) -> tuple[list[np.ndarray], list[Any]]:
        tensors, transforms = self._pnet.prepare(image)
        return list(tensors), list(transforms)

    def finish(
        self, outputs: Sequence[ItemOutputs], transforms: Sequence[Any], results: dict[str, Any]
    ) -> dict[str, Any]:
        candidates = [
            found
            for item, transform in zip(outputs, transforms, strict=True)
            for found in self._pnet.decode([o[None] for o in item], [transform])
        ]
        results["detections"] = self._pnet.merge(candidates)
        return results


class RNetStage:
    """MTCNN's R-Net on a crop of every detection; its boxes replace the detections.

    Raises:
        ConfigError: as :class:`PNetStage`.
    """

    detects = True
    crops_upstream = True

    def __init__(
        self, params: RNetParams, info: ModelInfo, operators: Operators | None = None
    ) -> None:
        check_input(info, params.normalize, RNet.size)
        check_outputs(info, (REGRESSION, PROBABILITY))
        self._rnet = RNet(params, operators)

    def items(
        self, image: np.ndarray, results: dict[str, Any]
    ) -> tuple[list[np.ndarray], list[Any]]:
        return _crop_items(self._rnet, image, results)

    def finish(
        self, outputs: Sequence[ItemOutputs], transforms: Sequence[Any], results: dict[str, Any]
    ) -> dict[str, Any]:
        results["detections"] = self._rnet.finish(_stacked(outputs), transforms)
        return results


class ONetStageParams(ONetParams):
    """O-Net's parameters, and what it does with the upstream detections.

    Attributes:
        merge: ``replace`` (MTCNN: O-Net's faces become the detections) or ``attach`` (each
            upstream detection gets ``onet``: O-Net's face for its crop, or null when O-Net
            rejects it; BlazeFace → O-Net).
    """

    merge: Literal["replace", "attach"] = "replace"


class ONetStage:
    """MTCNN's O-Net on a crop of every detection.

    Raises:
        ConfigError: as :class:`PNetStage`.
    """

    detects = True
    crops_upstream = True

    def __init__(
        self, params: ONetStageParams, info: ModelInfo, operators: Operators | None = None
    ) -> None:
        check_input(info, params.normalize, ONet.size)
        check_outputs(info, (REGRESSION, LANDMARKS, PROBABILITY))
        self._onet = ONet(ONetParams(**params.model_dump(exclude={"merge"})), operators)
        self._merge = params.merge

    def items(
        self, image: np.ndarray, results: dict[str, Any]
    ) -> tuple[list[np.ndarray], list[Any]]:
        return _crop_items(self._onet, image, results)

    def finish(
        self, outputs: Sequence[ItemOutputs], transforms: Sequence[Any], results: dict[str, Any]
    ) -> dict[str, Any]:
        if self._merge == "replace":
            results["detections"] = self._onet.finish(_stacked(outputs), transforms)
            return results
        for detection, item, transform in zip(
            _detections(results), outputs, transforms, strict=True
        ):
            faces = self._onet.finish([o[None] for o in item], [transform])
            detection["onet"] = faces[0] if faces else None
        return results


class ClassifyParams(InputParams):
    """Parameters of ``mtcnn_classify``.

    Attributes:
        threshold: face probability above which ``is_face`` is true.
        normalize: where the input normalisation happens (:class:`.mtcnn.layout.InputParams`).
    """

    threshold: float = Field(0.7, ge=0, le=1)


class FaceClassifier:
    """R-Net (or O-Net) on the whole frame as a face / non-face classifier (the frame is the
    crop: squared, resized to the model's input, MTCNN's layout).

    Raises:
        ConfigError: as :class:`PNetStage`, or the input size is unknown (:class:`Crops`).
    """

    detects = False  # a verdict on the whole frame, no boxes
    crops_upstream = False

    def __init__(self, params: ClassifyParams, info: ModelInfo) -> None:
        check_input(info, params.normalize)
        # R-Net's outputs, or O-Net's (with its landmarks, unused here)
        self._widths: tuple[int, ...] = (REGRESSION, PROBABILITY)
        if len(info.outputs) == 3:
            self._widths = (REGRESSION, LANDMARKS, PROBABILITY)
        check_outputs(info, self._widths)
        self._crops = Crops(CropParams(square=True), info)
        self._threshold = params.threshold
        self._normalize = params.normalize
        self._name = info.name

    def items(
        self, image: np.ndarray, results: dict[str, Any]
    ) -> tuple[list[np.ndarray], list[Any]]:
        height, width = image.shape[:2]
        crops, transforms = self._crops(image, [{"box": [0, 0, width, height]}])
        return list(to_input(crops, self._normalize)), transforms

    def finish(
        self, outputs: Sequence[ItemOutputs], transforms: Sequence[Any], results: dict[str, Any]
    ) -> dict[str, Any]:
        *_, probabilities = split_outputs(
            _stacked(outputs), self._widths, len(transforms), self._name
        )
        score = float(probabilities[0, 1])
        results["face"] = {"score": round(score, 4), "is_face": score > self._threshold}
        return results


ITEM_STAGES: Registry[ItemStage] = Registry("item stage")
"""Item stages by ``postprocess.kind``."""

ITEM_STAGES.register("mtcnn_pnet", PNetParams, operators=True)(PNetStage)
ITEM_STAGES.register("mtcnn_rnet", RNetParams, operators=True)(RNetStage)
ITEM_STAGES.register("mtcnn_onet", ONetStageParams, operators=True)(ONetStage)
ITEM_STAGES.register("mtcnn_classify", ClassifyParams)(FaceClassifier)

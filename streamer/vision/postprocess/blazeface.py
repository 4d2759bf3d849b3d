"""The ``blazeface`` postprocessor: MediaPipe BlazeFace outputs → face detections.

Follows MediaPipe's face detection graph (``mediapipe/modules/face_detection/``
``face_detection.pbtxt`` with the ``face_detection_short_range`` / ``_full_range`` options):

1. **Anchors** (``SsdAnchorsCalculator``): one anchor centre per cell of each feature map,
   ``((x + 0.5) / fw, (y + 0.5) / fh)``; layers that share a stride are merged, each adding
   one anchor per aspect ratio (here only 1.0) plus one more when
   ``interpolated_scale_aspect_ratio > 0``. Both models use ``fixed_anchor_size: true``, so an
   anchor's width and height are 1 and only its centre matters.

   ============ ====== ==================== ============================ ========
   model        input  strides              interpolated_scale_aspect    anchors
   ============ ====== ==================== ============================ ========
   short range  128²   8, 16, 16, 16        1.0 (default)                16²·2 + 8²·6 = 896
   full range   192²   4                    0.0                          48²·1 = 2304
   ============ ====== ==================== ============================ ========

2. **Decoding** (``TensorsToDetectionsCalculator``, ``reverse_output_order: true``,
   ``x_scale = y_scale = w_scale = h_scale =`` input size): each regressor row is
   ``[dx, dy, w, h, kx0, ky0, …, kx5, ky5]`` in model-input pixels relative to its anchor
   centre; ``score = sigmoid(clip(logit, -100, 100))`` (``score_clipping_thresh: 100``), and
   rows below ``score_threshold`` are dropped.
3. **Weighted NMS** (``NonMaxSuppressionCalculator``, ``overlap_type: INTERSECTION_OVER_UNION``,
   ``algorithm: WEIGHTED``): take the best remaining detection, gather every remaining one
   whose IoU with it is above ``iou_threshold`` (itself included), and output the
   score-weighted mean of their boxes and keypoints with the best one's score.
4. **Letterbox removal** (``DetectionLetterboxRemovalCalculator``): through the frame's
   :class:`LetterboxTransform` to pixels of the decoded image, clipped to the image.

Steps run on whole batches: with ``nms = "host"`` the candidates of every frame of a batch
are thresholded, scored, decoded and suppressed (step 3,
:func:`~streamer.vision.postprocess.weighted_nms.weighted_nms_batch`) in one call each; step 4
maps every detection of the batch in one pass, whichever the NMS.

The six keypoints are, in order: right eye, left eye, nose tip, mouth, right ear tragion,
left ear tragion (from the subject's point of view; MediaPipe ``FaceKeyPoint``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import islice
from typing import Any

import numpy as np
from pydantic import Field

from streamer.config import INT32_MAX
from streamer.errors import ConfigError, FrameError, Reason
from streamer.runtime.base import ModelInfo, Tensor
from streamer.runtime.ops.base import Operators
from streamer.vision.nms_place import NmsPlace, operators_for
from streamer.vision.postprocess.blazeface_nms import OperatorNms
from streamer.vision.postprocess.weighted_nms import Found, weighted_nms_batch
from streamer.vision.preprocess import LetterboxTransform, rows_to_image
from streamer.vision.registry import POSTPROCESSORS, PluginParams

__all__ = [
    "FULL_RANGE",
    "SHORT_RANGE",
    "AnchorConfig",
    "BlazeFace",
    "BlazeFaceParams",
    "decode_boxes",
    "ssd_anchors",
]

NUM_COORDS = 16
NUM_KEYPOINTS = 6
LABEL = "face"


@dataclass(frozen=True, slots=True)
class AnchorConfig:
    """The ``SsdAnchorsCalculator`` options of one BlazeFace variant (fixed anchor size).

    Attributes:
        name: ``short_range`` | ``full_range``.
        input_size: model input height = width, pixels.
        strides: one per layer, pixels.
        interpolated_scale_aspect_ratio: > 0 adds one anchor per layer and cell.
        default_score_threshold: the ``score_threshold`` used when the config sets none;
            chosen on streamer's acceptance images (see :class:`BlazeFaceParams`).
    """

    name: str
    input_size: int
    strides: tuple[int, ...]
    interpolated_scale_aspect_ratio: float
    default_score_threshold: float

    @property
    def num_anchors(self) -> int:
        return len(ssd_anchors(self))


SHORT_RANGE = AnchorConfig("short_range", 128, (8, 16, 16, 16), 1.0, 0.75)
FULL_RANGE = AnchorConfig("full_range", 192, (4,), 0.0, 0.5)
_VARIANTS = (SHORT_RANGE, FULL_RANGE)


def ssd_anchors(config: AnchorConfig) -> np.ndarray:
    """Anchor centres as MediaPipe's ``SsdAnchorsCalculator`` lays them out.

    Returns:
        float32 (num_anchors, 2): (x, y) centres in model-input pixels, in the order of the
        model's output rows (layer groups, then rows y, columns x, anchors of a cell).
    """
    centres = []
    strides = config.strides
    layer = 0
    while layer < len(strides):
        same = sum(1 for s in strides[layer:] if s == strides[layer])
        per_cell = same * (2 if config.interpolated_scale_aspect_ratio > 0 else 1)
        cells = math.ceil(config.input_size / strides[layer])
        grid = (np.arange(cells, dtype=np.float64) + 0.5) / cells * config.input_size
        ys, xs = np.meshgrid(grid, grid, indexing="ij")
        centres.append(np.repeat(np.stack([xs.ravel(), ys.ravel()], axis=1), per_cell, axis=0))
        layer += same
    return np.concatenate(centres).astype(np.float32)


def decode_boxes(regressors: np.ndarray, anchors: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Decode one frame's regressor rows (``TensorsToDetectionsCalculator``, fixed anchors).

    Args:
        regressors: float (N, 16) raw rows, model-input pixels relative to the anchors.
        anchors: float32 (N, 2) anchor centres, model-input pixels.

    Returns:
        boxes: float32 (N, 4) corners (x1, y1, x2, y2), model-input pixels.
        keypoints: float32 (N, 6, 2) (x, y), model-input pixels.
    """
    centre = regressors[:, 0:2] + anchors
    half = regressors[:, 2:4] / 2
    boxes = np.concatenate([centre - half, centre + half], axis=1)
    keypoints = regressors[:, 4:NUM_COORDS].reshape(-1, NUM_KEYPOINTS, 2) + anchors[:, None, :]
    return boxes.astype(np.float32, copy=False), keypoints.astype(np.float32, copy=False)


class BlazeFaceParams(PluginParams):
    """Parameters of ``blazeface``.

    Attributes:
        score_threshold: minimum face probability; None picks the variant's default, 0.75 for
            short range and 0.5 for full range. Measured with streamer's letterbox: short range
            scores carphone's face 0.87..0.97 and skimage's cat "chelsea" up to 0.49 (0.58 has
            been seen with other letterbox code); full range scores carphone 0.65..0.92 and
            chelsea 0.01, coffee 0.17 (tests/unit/vision/test_blazeface.py).
        iou_threshold: IoU above which detections merge (MediaPipe's
            ``min_suppression_threshold``: 0.3).
        max_detections: faces per frame at most.
        nms: ``host`` (weighted NMS on the host) or ``operator``: top-k, a gather of the
            candidates' regressor rows and NMS as single operators on the pipeline's backend,
            then the same weighted blend (:mod:`~streamer.vision.postprocess.blazeface_nms`);
            the model's outputs then stay in device memory on ACL.
    """

    score_threshold: float | None = Field(None, gt=0, lt=1)
    iou_threshold: float = Field(0.3, ge=0, le=1)
    max_detections: int = Field(100, ge=1, le=INT32_MAX)  # the operator's k: a C long
    nms: NmsPlace = "host"

    @property
    def device_outputs(self) -> bool:
        """``nms = "operator"`` reads the outputs where the backend left them."""
        return self.nms == "operator"


@POSTPROCESSORS.register("blazeface", BlazeFaceParams, operators=True)
class BlazeFace:
    """Face detections from a BlazeFace model (short or full range, chosen by input size).

    Thread-safe: it holds only read-only tables. Called on the dequeue thread.

    Args:
        params: validated :class:`BlazeFaceParams`.
        info: the loaded model: one 4-D input of 128² or 192² pixels (NCHW or NHWC), and two
            outputs (batch, N, 16) regressors and (batch, N, 1) logits, N = the variant's
            anchor count.
        operators: the pipeline backend's operators, for ``nms = "operator"``.

    Raises:
        ConfigError: the model's input size matches no variant, or its outputs do not have
            the shapes above for that variant; ``nms = "operator"`` without operators.
    """

    detects = True

    def __init__(
        self, params: BlazeFaceParams, info: ModelInfo, operators: Operators | None = None
    ) -> None:
        self.variant = _variant(info)
        self.anchors = ssd_anchors(self.variant)
        self._regressors, self._logits = _output_indices(info, len(self.anchors))
        threshold = params.score_threshold
        if threshold is None:
            threshold = self.variant.default_score_threshold
        self.score_threshold = threshold
        # sigmoid(x) >= t  <=>  x >= logit(t): compare logits, take sigmoids of the few kept.
        self._logit_threshold = math.log(threshold / (1 - threshold))
        self.iou_threshold = params.iou_threshold
        self.max_detections = params.max_detections
        device = operators_for(params.nms, operators)
        self._operator_nms = (
            None
            if device is None
            else OperatorNms(
                device,
                self.anchors,
                decode_boxes,
                self._logit_threshold,
                self.iou_threshold,
                self.max_detections,
            )
        )

    def __call__(
        self, outputs: Sequence[Tensor], transforms: Sequence[LetterboxTransform]
    ) -> list[dict[str, Any]]:
        """Detections for each of the ``len(transforms)`` real frames of one batch.

        Args:
            outputs: the model outputs in ``ModelInfo.outputs`` order, batch first; rows past
                ``len(transforms)`` (batch padding) are ignored. With ``nms = "operator"``
                they may be device tensors, read by the operators in place (not released).
            transforms: each frame's letterbox transform.

        Returns:
            Per frame ``{"detections": [{"box": [x, y, w, h], "score": s, "label": "face",
            "keypoints": [[x, y] × 6]}, …]}``, best first; pixels of the decoded image,
            clipped to it, rounded to 2 decimals (score to 4).

        Raises:
            FrameError: ``postprocess_failed`` when the outputs do not have the expected
                shapes for this batch.
        """
        regressors, logits = self._checked(outputs, len(transforms))
        if self._operator_nms is not None:
            found = self._operator_nms(regressors, logits, len(transforms))
        else:
            host_regressors, host_logits = _host_arrays(regressors, logits)
            found = self._host_nms(host_regressors, host_logits, len(transforms))
        return [{"detections": d} for d in _to_image(found, transforms)]

    def _checked(self, outputs: Sequence[Tensor], n: int) -> tuple[Tensor, Tensor]:
        """The (B, N, 16) regressors and (B, N, 1) logits, B >= n, as given.

        Raises:
            FrameError: ``postprocess_failed``: other shapes.
        """
        regressors, logits = outputs[self._regressors], outputs[self._logits]
        n_anchors = len(self.anchors)
        if (
            len(regressors.shape) != 3
            or regressors.shape[0] < n
            or tuple(regressors.shape[1:]) != (n_anchors, NUM_COORDS)
            or tuple(logits.shape[:2]) != tuple(regressors.shape[:2])
        ):
            raise FrameError(
                Reason.POSTPROCESS_FAILED,
                f"blazeface expects outputs ({n}+, {n_anchors}, 16) and ({n}+, {n_anchors}, 1), "
                f"got {regressors.shape} and {logits.shape}",
            )
        return regressors, logits

    def _host_nms(self, regressors: np.ndarray, logits: np.ndarray, frames: int) -> list[Found]:
        """Steps 2-3 on the host for the first ``frames`` frames of a batch.

        The batch's candidates are thresholded, scored, decoded and suppressed in one call
        each (:func:`~streamer.vision.postprocess.weighted_nms.weighted_nms_batch`).

        Args:
            regressors: float32 (B, N, 16); logits: float32 (B, N, 1); B >= ``frames``.

        Returns:
            One :data:`Found` per frame, model-input pixels.
        """
        logits = logits.reshape(logits.shape[0], len(self.anchors))[:frames]
        rows, anchors = np.nonzero(logits >= self._logit_threshold)  # sorted by frame
        scores = 1.0 / (1.0 + np.exp(-np.clip(logits[rows, anchors].astype(np.float64), -100, 100)))
        boxes, points = decode_boxes(regressors[rows, anchors], self.anchors[anchors])
        counts = np.bincount(rows, minlength=frames).tolist()
        return weighted_nms_batch(
            boxes, points, scores, counts, self.iou_threshold, self.max_detections
        )


def _host_arrays(*tensors: Tensor) -> list[np.ndarray]:
    """The host arrays the host NMS reads.

    Raises:
        FrameError: ``postprocess_failed``: a device tensor (only ``nms = "operator"`` asks
            for those).
    """
    if not all(isinstance(t, np.ndarray) for t in tensors):
        raise FrameError(Reason.POSTPROCESS_FAILED, 'device outputs need nms = "operator"')
    return [np.asarray(t) for t in tensors]


def _to_image(
    found: Sequence[Found], transforms: Sequence[LetterboxTransform]
) -> list[list[dict[str, Any]]]:
    """Step 4 for a whole batch at once: each frame's detections in image pixels.

    Every frame's (D, 4) corner boxes and (D, K, 2) keypoints (model-input pixels) go through
    its transform, are clipped to its image and rounded in one pass over the batch; boxes
    left empty by clipping are dropped.

    Args:
        found: one :data:`Found` per frame, float32, model-input pixels.
        transforms: each frame's letterbox transform.

    Returns:
        Per frame the detection dicts of :meth:`BlazeFace.__call__`, in ``found``'s order.
    """
    counts = [len(scores) for _, _, scores in found]
    if not sum(counts):
        return [[] for _ in found]
    frames = np.repeat(np.arange(len(found)), counts)
    size = np.array([(t.image_width, t.image_height) for t in transforms], np.float64)
    xy = rows_to_image(transforms, frames, _corners_and_keypoints(found))
    xy = np.clip(xy, 0, size[frames, None])
    sides = xy[:, 1] - xy[:, 0]
    kept = (sides > 0).all(axis=1)
    xywh = np.round(np.concatenate([xy[kept, 0], sides[kept]], axis=1), 2).tolist()
    points = np.round(xy[kept, 2:], 2).tolist()
    scores = np.concatenate([s for _, _, s in found])[kept].tolist()
    detections = [
        {"box": box, "score": round(score, 4), "label": LABEL, "keypoints": pts}
        for box, pts, score in zip(xywh, points, scores, strict=True)
    ]
    rest = iter(detections)
    return [list(islice(rest, n)) for n in np.bincount(frames[kept], minlength=len(found)).tolist()]


def _corners_and_keypoints(found: Sequence[Found]) -> np.ndarray:
    """Every frame's detections stacked, frame after frame: float32 (D, 2 + K, 2), each row
    its box's (x1, y1) and (x2, y2) corners, then its K keypoints (x, y)."""
    boxes = np.concatenate([b for b, _, _ in found]).reshape(-1, 2, 2)
    return np.concatenate([boxes, np.concatenate([p for _, p, _ in found])], axis=1)


def _variant(info: ModelInfo) -> AnchorConfig:
    """The BlazeFace variant whose input size the model's first input has.

    Raises:
        ConfigError: no input, or a size that is neither 128² nor 192².
    """
    if not info.inputs or len(info.inputs[0].shape) != 4:
        raise ConfigError(f"model {info.name!r}: blazeface needs one 4-D image input")
    shape = info.inputs[0].shape
    hw = shape[2:4] if shape[1] == 3 else shape[1:3]
    for variant in _VARIANTS:
        if hw == (variant.input_size, variant.input_size):
            return variant
    sizes = ", ".join(f"{v.input_size}x{v.input_size} ({v.name})" for v in _VARIANTS)
    raise ConfigError(
        f"model {info.name!r}: input {info.inputs[0].name!r} {list(shape)} fits no BlazeFace "
        f"variant; known input sizes: {sizes}"
    )


def _output_indices(info: ModelInfo, n_anchors: int) -> tuple[int, int]:
    """Indices of the (batch, N, 16) regressors and (batch, N, 1) logits in the outputs.

    Raises:
        ConfigError: the outputs are not one of each, with N = ``n_anchors`` rows.
    """
    regressors = [i for i, t in enumerate(info.outputs) if t.shape[1:] == (n_anchors, NUM_COORDS)]
    logits = [i for i, t in enumerate(info.outputs) if t.shape[1:] == (n_anchors, 1)]
    if len(info.outputs) != 2 or len(regressors) != 1 or len(logits) != 1:
        found = ", ".join(f"{t.name} {list(t.shape)}" for t in info.outputs)
        raise ConfigError(
            f"model {info.name!r}: its input size says {n_anchors} anchors, so blazeface "
            f"expects outputs [batch, {n_anchors}, 16] and [batch, {n_anchors}, 1]; "
            f"found {found}"
        )
    return regressors[0], logits[0]

"""The operator contract: single operators for post-processing, run by the pipeline's backend.

An :class:`Operators` object runs three operators and returns numpy arrays:

``nms``          ONNX ``NonMaxSuppression`` (opset 11) semantics: the selected ``[K, 3]``
                 rows, ``K`` decided by the data (a dynamic output shape)
``top_k``        ONNX ``TopK`` (opset 11), largest first, along the last axis
``gather_rows``  ONNX ``Gather`` (opset 11) along axis 0: the rows asked for, in that order

``top_k`` and ``gather_rows`` read a tensor operand (:data:`~streamer.runtime.base.Tensor`):
a host array, or, on a backend with device memory, a model output left there
(:class:`~streamer.runtime.base.DeviceTensor`), read in place, possibly with other dims
(:mod:`~streamer.runtime.ops.views`). Only their (small) results are copied to the host, so
a postprocessor can take the best rows of a large output without reading it whole. The
caller keeps owning the operand. On onnxruntime the "device" is the host: its models return
host arrays and its operators take only those.

:meth:`Operators.nms_each` batches one NMS per image into one operator call and hands every
image exactly its own kept rows back.

Implementations: :class:`streamer.runtime.ops.onnx_ops.OnnxOperators` (single-node onnxruntime
graphs) and :class:`streamer.runtime.acl.operators.AclOperators` (``acl.op`` single-operator
execution with shape inference first). A backend gives its own through
:meth:`streamer.runtime.base.Backend.operators`.

Thread rules: every method may be called from several threads at once (the dequeue threads of
the model replicas). On ACL the calling thread must have the context of its device current
(a dequeue thread has, after ``attach_thread``).
"""

from __future__ import annotations

import abc
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from streamer.lifecycle import Closing
from streamer.runtime.ops.self_test import check_operators

if TYPE_CHECKING:
    from streamer.runtime.base import Tensor

__all__ = [
    "NO_SCORE_THRESHOLD",
    "Operators",
    "check_gather_inputs",
    "check_nms_inputs",
    "check_top_k_inputs",
]

NO_SCORE_THRESHOLD = float("-inf")
"""The ``score_threshold`` that keeps every finite score (ONNX keeps ``score > threshold``)."""

_PAD_SCORE = np.float32(-np.inf)
"""Score of the padding rows :meth:`Operators.nms_each` adds: never above any threshold."""


class Operators(Closing, abc.ABC):
    """NMS and top-k as single operators on one backend."""

    name: str
    """The backend that runs them: ``onnxruntime`` or ``acl``."""
    _verified = False

    def verify(self) -> None:
        """Check, once, that the operators run and give right answers where the pipeline
        runs them (:func:`~streamer.runtime.ops.self_test.check_operators`); a postprocessor
        that uses them calls this when it is built, at load.

        Raises:
            BackendError: an operator cannot run there, or gives a wrong answer.
        """
        if not self._verified:
            self._check_each_place()
            self._verified = True

    def _check_each_place(self) -> None:
        """Run the check wherever the operators will run: on the host, the calling thread."""
        check_operators(self)

    @abc.abstractmethod
    def nms(
        self,
        boxes: np.ndarray,
        scores: np.ndarray,
        max_output_boxes_per_class: int,
        iou_threshold: float,
        score_threshold: float = NO_SCORE_THRESHOLD,
    ) -> np.ndarray:
        """Hard non-maximum suppression per batch and class (ONNX ``NonMaxSuppression``,
        opset 11, ``center_point_box = 0``).

        In each (batch, class), boxes are taken best score first (ties: lower index first);
        a box is kept when its score is ``> score_threshold`` and its IoU with every box kept
        before it is ``<= iou_threshold``, until ``max_output_boxes_per_class`` are kept.

        Args:
            boxes: float32 (B, N, 4), two opposite corners per box, pixels (IoU is the same
                for (x1, y1, x2, y2) and (y1, x1, y2, x2)).
            scores: float32 (B, C, N).
            max_output_boxes_per_class: boxes kept per (batch, class) at most, >= 0.
            iou_threshold: 0..1.
            score_threshold: :data:`NO_SCORE_THRESHOLD` keeps every finite score.

        Returns:
            int64 (K, 3): ``(batch, class, box)`` of the kept boxes, grouped by batch then
            class, each group in the order kept. ``K`` depends on the data, 0 included.

        Raises:
            ValueError: shapes or dtypes other than the above.
            FrameError: ``postprocess_failed``: the backend failed to run the operator.
        """

    @abc.abstractmethod
    def top_k(
        self, x: Tensor, k: int, shape: Sequence[int] | None = None
    ) -> tuple[np.ndarray, np.ndarray]:
        """The ``k`` largest values along the last axis, largest first (ONNX ``TopK``,
        opset 11, ``largest = 1``, ``sorted = 1``; ties: lower index first).

        Args:
            x: float32 (..., N), at least one axis: a host array, or a device tensor of this
                backend (read in place).
            k: 0 <= k <= N.
            shape: read ``x`` as these dims (:mod:`~streamer.runtime.ops.views`); None: its
                own.

        Returns:
            values: float32 (..., k); indices: int64 (..., k) into the last axis of ``x``,
            host arrays.

        Raises:
            ValueError: ``x`` is not float32 with an axis, ``k`` is out of range, ``shape``
                does not fit ``x``, or ``x`` is a tensor these operators cannot read.
            FrameError: ``postprocess_failed``: the backend failed to run the operator.
        """

    @abc.abstractmethod
    def gather_rows(
        self, x: Tensor, rows: np.ndarray, shape: Sequence[int] | None = None
    ) -> np.ndarray:
        """The rows of ``x`` at ``rows``, in that order (ONNX ``Gather``, opset 11,
        ``axis = 0``).

        Args:
            x: float32 (R, ...), at least one axis: a host array, or a device tensor of this
                backend (read in place).
            rows: int (M,), each in 0..R-1; M >= 1.
            shape: read ``x`` as these dims (:mod:`~streamer.runtime.ops.views`); None: its
                own.

        Returns:
            float32 (M, ...), a host array.

        Raises:
            ValueError: ``x`` is not float32 with an axis, ``rows`` is empty, not 1-D or
                out of range, ``shape`` does not fit ``x``, or ``x`` is a tensor these
                operators cannot read.
            FrameError: ``postprocess_failed``: the backend failed to run the operator.
        """

    @abc.abstractmethod
    def close(self) -> None:
        """Release what the operators hold (sessions, streams). Idempotent; call after every
        thread that used them has stopped."""

    def nms_each(
        self,
        boxes: Sequence[np.ndarray],
        scores: Sequence[np.ndarray],
        iou_threshold: float,
        max_per_image: int | None = None,
        score_threshold: float = NO_SCORE_THRESHOLD,
    ) -> list[np.ndarray]:
        """One NMS per image, run as a single :meth:`nms` over a padded batch.

        Image i's ``M_i`` boxes fill rows ``0 .. M_i - 1`` of batch row i; the rows past them
        are padding with a score of -inf, which no threshold keeps, so no padding row is ever
        selected.

        Args:
            boxes: per image, float (M_i, 4) corners, pixels; M_i may be 0.
            scores: per image, float (M_i,).
            iou_threshold: 0..1.
            max_per_image: boxes kept per image at most; None: all of them.
            score_threshold: a box is kept only when its score is above this.

        Returns:
            Per image, int64 (K_i,) indices into its own boxes, in the order kept (best
            first).

        Raises:
            ValueError: the lists differ in length, or an image's arrays do not match.
            FrameError: ``postprocess_failed``: the operator failed.
        """
        if len(boxes) != len(scores):
            raise ValueError(f"{len(boxes)} box arrays for {len(scores)} score arrays")
        counts = [len(b) for b in boxes]
        if any(len(s) != n for s, n in zip(scores, counts, strict=True)):
            raise ValueError("every image needs one score per box")
        width = max(counts, default=0)
        if width == 0:
            return [np.zeros(0, np.int64) for _ in counts]
        batch_boxes = np.zeros((len(counts), width, 4), np.float32)
        batch_scores = np.full((len(counts), 1, width), _PAD_SCORE, np.float32)
        for row, (b, s) in enumerate(zip(boxes, scores, strict=True)):
            batch_boxes[row, : len(b)] = np.asarray(b, np.float32).reshape(-1, 4)
            batch_scores[row, 0, : len(s)] = s
        limit = width if max_per_image is None else max_per_image
        selected = self.nms(batch_boxes, batch_scores, limit, iou_threshold, score_threshold)
        return [selected[selected[:, 0] == row, 2].astype(np.int64) for row in range(len(counts))]


def check_nms_inputs(
    boxes: np.ndarray, scores: np.ndarray, max_output_boxes_per_class: int
) -> None:
    """The checks of :meth:`Operators.nms` on its arguments.

    Raises:
        ValueError: boxes not float32 (B, N, 4), scores not float32 (B, C, N) of the same B
            and N, or a negative ``max_output_boxes_per_class``.
    """
    if boxes.dtype != np.float32 or scores.dtype != np.float32:
        raise ValueError(f"nms takes float32 boxes and scores, got {boxes.dtype}, {scores.dtype}")
    if boxes.ndim != 3 or boxes.shape[2] != 4:
        raise ValueError(f"nms boxes must be (B, N, 4), got {boxes.shape}")
    if scores.ndim != 3 or scores.shape[0] != boxes.shape[0] or scores.shape[2] != boxes.shape[1]:
        raise ValueError(
            f"nms scores must be (B, C, N) for boxes {boxes.shape}, got {scores.shape}"
        )
    if max_output_boxes_per_class < 0:
        raise ValueError(
            f"max_output_boxes_per_class must be >= 0, got {max_output_boxes_per_class}"
        )


def check_top_k_inputs(dtype: np.dtype[Any], dims: Sequence[int], k: int) -> None:
    """The checks of :meth:`Operators.top_k` on its arguments (``x`` read as ``dims``).

    Raises:
        ValueError: ``x`` is not float32 with at least one axis, or ``k`` is not in 0..N.
    """
    if dtype != np.float32 or not dims:
        raise ValueError(f"top_k takes float32 with at least one axis, got {dtype} {dims}")
    if not 0 <= k <= dims[-1]:
        raise ValueError(f"top_k: k = {k} is not in 0..{dims[-1]}")


def check_gather_inputs(dtype: np.dtype[Any], dims: Sequence[int], rows: np.ndarray) -> None:
    """The checks of :meth:`Operators.gather_rows` on its arguments (``x`` read as ``dims``):
    an index out of range is an AI Core error on a device (``GatherV2``: "Value in indices
    must be in range [0, x.shape[axis])", op proto of the CANN operator library), so it is
    refused before any operator runs.

    Raises:
        ValueError: ``x`` is not float32 with at least one axis, or ``rows`` is not a
            non-empty 1-D integer array of indices in 0..R-1.
    """
    if dtype != np.float32 or not dims:
        raise ValueError(f"gather_rows takes float32 with at least one axis, got {dtype} {dims}")
    if rows.ndim != 1 or not len(rows) or not np.issubdtype(rows.dtype, np.integer):
        raise ValueError(f"gather_rows takes non-empty 1-D int rows, got {rows.dtype} {rows.shape}")
    if rows.min() < 0 or rows.max() >= dims[0]:
        raise ValueError(f"gather_rows: rows must be in 0..{dims[0] - 1}")

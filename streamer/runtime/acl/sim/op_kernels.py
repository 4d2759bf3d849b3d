"""The single operators the simulator has: their Ascend IR signature, shape inference and
execution over onnxruntime single-node graphs (:class:`streamer.runtime.ops.OnnxOperators`).

====================== ===================================== ============================
op type                inputs → outputs (aclDataType)          shape inference
====================== ===================================== ============================
``NonMaxSuppressionV6`` boxes FLOAT [B, N, 4], scores FLOAT    selected_indices [-1, 3],
                       [B, C, N], max_output_size INT32 [1],   range of dim 0:
                       iou_threshold FLOAT [1],                [0, B·C·min(N, m)] with m
                       score_threshold FLOAT [1]               the value of
                       → selected_indices INT32 [K, 3]         max_output_size (B·C·N
                                                               without it)
``TopKV2``             x FLOAT [..., N], k INT32 []            values, indices [..., k]
                       → values FLOAT, indices INT32           with k's value; [..., -1]
                                                               with range [0, N] without
``GatherV2``           x FLOAT [R, ...], indices INT32 [...],  y [*indices, ...] with
                       axis INT32 [] (or [1]) → y FLOAT        axis's value (needed)
====================== ===================================== ============================

Signatures: Ascend IR ``REG_OP(NonMaxSuppressionV6)`` (ONNX ``NonMaxSuppression``
semantics, attrs ``center_point_box``, ``max_boxes_size``), ``REG_OP(TopKV2)`` (attrs
``sorted``, ``dim``, ``largest``) and ``REG_OP(GatherV2)`` (TensorFlow ``GatherV2``; attrs
``batch_dims``, ``is_preprocessed``, ``negative_index_support``), from the op proto headers of
the CANN operator library. The simulator implements ``center_point_box = 0``, ``sorted``,
``largest``, ``dim = -1``, and for GatherV2 ``batch_dims = 0`` without negative indices, only;
any other value is refused with ``ACL_ERROR_OP_ATTR_NOT_MATCH``. GatherV2's output shape
depends on the value of ``axis``, so ``infer_shape`` needs it (a data-dependent input); the
simulator implements ``axis = 0`` only (another is ``ACL_ERROR_OP_INPUT_NOT_MATCH``).

O8 (GatherV2's proto: "Value in indices must be in range [0, x.shape[axis])"): an index out of
that range fails the execution (on a device an AI Core error; here ``ACL_ERROR_GE_FAILURE``,
from ``synchronize_stream`` when the op ran on a stream).
"""

from __future__ import annotations

import abc
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from streamer.runtime.acl.constants import AclCode, DataType
from streamer.runtime.acl.sim.binding import SimError
from streamer.runtime.ops.onnx_ops import OnnxOperators

__all__ = ["KERNELS", "Inferred", "OpKernel"]

Shape = tuple[int, ...]
AttrValue = bool | int | float


@dataclass(frozen=True)
class Inferred:
    """One output as shape inference describes it.

    Attributes:
        dims: dims, ``-1`` where only a range is known; None for an unknown rank.
        ranges: per dim ``(min, max)``.
    """

    dims: Shape | None
    ranges: tuple[tuple[int, int], ...]

    @property
    def exact(self) -> bool:
        return self.dims is not None and all(d >= 0 for d in self.dims)


def _exact(dims: Shape) -> Inferred:
    return Inferred(dims, tuple((d, d) for d in dims))


class OpKernel(abc.ABC):
    """One op type: its signature, attributes, shape inference and execution."""

    op_type: ClassVar[str]
    inputs: ClassVar[tuple[DataType, ...]]
    outputs: ClassVar[tuple[DataType, ...]]
    value_inputs: ClassVar[tuple[int, ...]]
    """Inputs whose values shape inference reads."""
    attrs: ClassVar[dict[str, AttrValue]]
    """Attribute names and the only value the simulator implements (also the default)."""

    def __init__(self, onnx_ops: OnnxOperators) -> None:
        self._onnx = onnx_ops

    def check_attrs(self, given: Mapping[str, AttrValue]) -> None:
        """Raises: SimError: an unknown attribute, or a value not simulated (O7)."""
        for name, value in given.items():
            if name not in self.attrs:
                raise SimError(
                    AclCode.ERROR_OP_ATTR_NOT_MATCH, "O7", f"{self.op_type} has no attr {name!r}"
                )
            if value != self.attrs[name]:
                raise SimError(
                    AclCode.ERROR_OP_ATTR_NOT_MATCH,
                    "O7",
                    f"{self.op_type}.{name} = {value!r} is not simulated "
                    f"(only {self.attrs[name]!r})",
                )

    @abc.abstractmethod
    def infer(self, shapes: Sequence[Shape], values: Sequence[np.ndarray | None]) -> list[Inferred]:
        """Output shapes from input shapes and, where given, the values of ``value_inputs``.

        Raises:
            SimError: inputs that do not fit the op (``ACL_ERROR_OP_INPUT_NOT_MATCH``).
        """

    @abc.abstractmethod
    def run(self, arrays: Sequence[np.ndarray]) -> list[np.ndarray]:
        """Execute on input arrays of the op's types; outputs of the op's types."""


def _input_error(message: str) -> SimError:
    return SimError(AclCode.ERROR_OP_INPUT_NOT_MATCH, "O1", message)


def _scalar(value: np.ndarray | None) -> int | None:
    return None if value is None or value.size == 0 else int(value.reshape(-1)[0])


class NmsV6(OpKernel):
    """``NonMaxSuppressionV6``: ONNX ``NonMaxSuppression`` with int32 counts and indices."""

    op_type = "NonMaxSuppressionV6"
    inputs = (DataType.FLOAT, DataType.FLOAT, DataType.INT32, DataType.FLOAT, DataType.FLOAT)
    outputs = (DataType.INT32,)
    value_inputs = (2,)
    attrs: ClassVar[dict[str, AttrValue]] = {"center_point_box": 0, "max_boxes_size": 0}

    def infer(self, shapes: Sequence[Shape], values: Sequence[np.ndarray | None]) -> list[Inferred]:
        boxes, scores = shapes[0], shapes[1]
        if len(boxes) != 3 or boxes[2] != 4:
            raise _input_error(f"boxes must be [B, N, 4], got {list(boxes)}")
        if len(scores) != 3 or scores[0] != boxes[0] or scores[2] != boxes[1]:
            raise _input_error(f"scores must be [B, C, N] for boxes {list(boxes)}: {list(scores)}")
        if any(int(np.prod(s)) != 1 for s in shapes[2:]):
            raise _input_error(f"the last three inputs must hold one value: {list(shapes[2:])}")
        limit = _scalar(values[2])
        per_class = boxes[1] if limit is None else min(boxes[1], max(limit, 0))
        return [Inferred((-1, 3), ((0, boxes[0] * scores[1] * per_class), (3, 3)))]

    def run(self, arrays: Sequence[np.ndarray]) -> list[np.ndarray]:
        boxes, scores, limit, iou, score = arrays
        selected = self._onnx.nms(
            boxes,
            scores,
            max(int(limit.reshape(-1)[0]), 0),
            float(iou.reshape(-1)[0]),
            float(score.reshape(-1)[0]),
        )
        return [selected.astype(np.int32)]


class TopKV2(OpKernel):
    """``TopKV2``: the k largest along the last axis, sorted; int32 indices."""

    op_type = "TopKV2"
    inputs = (DataType.FLOAT, DataType.INT32)
    outputs = (DataType.FLOAT, DataType.INT32)
    value_inputs = (1,)
    attrs: ClassVar[dict[str, AttrValue]] = {"sorted": True, "largest": True, "dim": -1}

    def infer(self, shapes: Sequence[Shape], values: Sequence[np.ndarray | None]) -> list[Inferred]:
        x, k_shape = shapes
        if not x:
            raise _input_error("x needs at least one axis")
        if int(np.prod(k_shape)) != 1:
            raise _input_error(f"k must hold one value, got shape {list(k_shape)}")
        k = _scalar(values[1])
        if k is None:
            ranges = tuple((d, d) for d in x[:-1]) + ((0, x[-1]),)
            return [Inferred((*x[:-1], -1), ranges)] * 2
        if not 0 <= k <= x[-1]:
            raise _input_error(f"k = {k} is not in 0..{x[-1]}")
        return [_exact((*x[:-1], k))] * 2

    def run(self, arrays: Sequence[np.ndarray]) -> list[np.ndarray]:
        x, k = arrays
        values, indices = self._onnx.top_k(x, int(k.reshape(-1)[0]))
        return [values, indices.astype(np.int32)]


class GatherV2(OpKernel):
    """``GatherV2``, ``batch_dims = 0``, ``axis = 0``: the rows of x at int32 indices."""

    op_type = "GatherV2"
    inputs = (DataType.FLOAT, DataType.INT32, DataType.INT32)
    outputs = (DataType.FLOAT,)
    value_inputs = (2,)
    attrs: ClassVar[dict[str, AttrValue]] = {
        "batch_dims": 0,
        "is_preprocessed": False,
        "negative_index_support": False,
    }

    def infer(self, shapes: Sequence[Shape], values: Sequence[np.ndarray | None]) -> list[Inferred]:
        x, indices, axis_shape = shapes
        if not x:
            raise _input_error("x needs at least one axis")
        if int(np.prod(axis_shape)) != 1:
            raise _input_error(f"axis must hold one value, got shape {list(axis_shape)}")
        axis = _scalar(values[2])
        if axis is None:
            raise _input_error("GatherV2's output shape needs the value of axis")
        if axis not in (0, -len(x)):
            raise _input_error(f"axis = {axis}: the simulator implements axis 0 only")
        return [_exact((*indices, *x[1:]))]

    def run(self, arrays: Sequence[np.ndarray]) -> list[np.ndarray]:
        """Raises: SimError: an index out of range (O8)."""
        x, indices, _ = arrays
        if indices.size and (indices.min() < 0 or indices.max() >= len(x)):
            raise SimError(
                AclCode.ERROR_GE_FAILURE, "O8", f"GatherV2: an index is not in 0..{len(x) - 1}"
            )
        rows = indices.reshape(-1).astype(np.int64)
        gathered = self._onnx.gather_rows(x, rows) if rows.size else x[:0]
        return [np.asarray(gathered).reshape(*indices.shape, *x.shape[1:])]


KERNELS: dict[str, type[OpKernel]] = {
    kernel.op_type: kernel for kernel in (NmsV6, TopKV2, GatherV2)
}
"""Op type → kernel class."""

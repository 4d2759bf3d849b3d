"""Single-node ONNX graphs for the post-processing operators, built with ``onnx.helper``.

=========== ============================================================ ====================
graph       inputs                                                       outputs
=========== ============================================================ ====================
``nms``     boxes float32 [b, n, 4], scores float32 [b, c, n],           selected int64
            max_output_boxes_per_class int64 [1], iou_threshold float32  [k, 3]
            [1], score_threshold float32 [1]
``top_k``   x <dtype> [..., n] (any rank >= 1), k int64 [1]              values <dtype>
                                                                         [..., k], indices
                                                                         int64 [..., k]
``gather``  x <dtype> [r, ...] (any rank >= 1), rows int64 [m]           y <dtype> [m, ...]
=========== ============================================================ ====================

Operator semantics: ONNX ``NonMaxSuppression``, ``TopK`` and ``Gather`` (``axis = 0``),
opset 11 (onnx/docs/Operators.md). onnxruntime implements ``NonMaxSuppression`` for float32
only.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper

__all__ = [
    "GATHER_INPUTS",
    "NMS_INPUTS",
    "OPSET",
    "TOP_K_INPUTS",
    "gather_graph",
    "nms_graph",
    "top_k_graph",
]

OPSET = 11
"""The ONNX opset of the graphs (NonMaxSuppression-11, TopK-11, Gather-11)."""

NMS_INPUTS = ("boxes", "scores", "max_output_boxes_per_class", "iou_threshold", "score_threshold")
"""Input names of :func:`nms_graph`, in order."""

TOP_K_INPUTS = ("x", "k")
"""Input names of :func:`top_k_graph`, in order."""

GATHER_INPUTS = ("x", "rows")
"""Input names of :func:`gather_graph`, in order."""

_IR_VERSION = 8


def _model(
    node: onnx.NodeProto, inputs: list[onnx.ValueInfoProto], outputs: list[onnx.ValueInfoProto]
) -> onnx.ModelProto:
    graph = helper.make_graph([node], node.op_type, inputs, outputs)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)])
    model.ir_version = _IR_VERSION
    return model


def nms_graph() -> onnx.ModelProto:
    """``NonMaxSuppression`` (``center_point_box = 0``) over float32 boxes and scores."""
    float_in = TensorProto.FLOAT
    inputs = [
        helper.make_tensor_value_info("boxes", float_in, ["b", "n", 4]),
        helper.make_tensor_value_info("scores", float_in, ["b", "c", "n"]),
        helper.make_tensor_value_info("max_output_boxes_per_class", TensorProto.INT64, [1]),
        helper.make_tensor_value_info("iou_threshold", float_in, [1]),
        helper.make_tensor_value_info("score_threshold", float_in, [1]),
    ]
    outputs = [helper.make_tensor_value_info("selected", TensorProto.INT64, ["k", 3])]
    node = helper.make_node("NonMaxSuppression", list(NMS_INPUTS), ["selected"])
    return _model(node, inputs, outputs)


def top_k_graph(dtype: np.dtype) -> onnx.ModelProto:
    """``TopK`` along the last axis, largest first, sorted, for ``dtype`` inputs of any rank."""
    elem = helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
    inputs = [
        helper.make_tensor_value_info("x", elem, None),
        helper.make_tensor_value_info("k", TensorProto.INT64, [1]),
    ]
    outputs = [
        helper.make_tensor_value_info("values", elem, None),
        helper.make_tensor_value_info("indices", TensorProto.INT64, None),
    ]
    node = helper.make_node(
        "TopK", list(TOP_K_INPUTS), ["values", "indices"], axis=-1, largest=1, sorted=1
    )
    return _model(node, inputs, outputs)


def gather_graph(dtype: np.dtype) -> onnx.ModelProto:
    """``Gather`` along axis 0 (rows) for ``dtype`` inputs of any rank."""
    elem = helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
    inputs = [
        helper.make_tensor_value_info("x", elem, None),
        helper.make_tensor_value_info("rows", TensorProto.INT64, ["m"]),
    ]
    outputs = [helper.make_tensor_value_info("y", elem, None)]
    node = helper.make_node("Gather", list(GATHER_INPUTS), ["y"], axis=0)
    return _model(node, inputs, outputs)

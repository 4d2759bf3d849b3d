"""Single operators for post-processing (NMS, top-k, row gather) on the pipeline's backend.

Module map::

    base.py       Operators: the contract (ONNX NonMaxSuppression / TopK / Gather semantics),
                  nms_each
    views.py      how an operator reads a tensor operand (host array or device tensor) with
                  other dims
    graphs.py     the single-node ONNX graphs (onnx.helper)
    onnx_ops.py   OnnxOperators: onnxruntime sessions over those graphs

The ACL implementation, :class:`streamer.runtime.acl.operators.AclOperators`, lives with the
rest of the pyACL backend.
"""

from __future__ import annotations

from streamer.runtime.ops.base import NO_SCORE_THRESHOLD, Operators
from streamer.runtime.ops.onnx_ops import OnnxOperators

__all__ = ["NO_SCORE_THRESHOLD", "OnnxOperators", "Operators"]

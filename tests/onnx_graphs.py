"""ONNX graph pieces the tests build models from (imported by tests in any folder: pytest
puts this folder on ``sys.path`` for the root conftest)."""

from __future__ import annotations

from onnx import GraphProto, TensorProto, helper


def spin_body() -> GraphProto:
    """The body of a ``Loop`` that adds 1 to its carried float32 (1,) each turn (about 1 µs
    a turn on a CPU): a model's execution time set by its trip count, which onnxruntime can
    neither skip nor fold at load time when the carried value comes from the input."""
    return helper.make_graph(
        [
            helper.make_node("Identity", ["cond_in"], ["cond_out"]),
            helper.make_node("Add", ["v_in", "one"], ["v_out"]),
        ],
        "spin",
        [
            helper.make_tensor_value_info("i", TensorProto.INT64, []),
            helper.make_tensor_value_info("cond_in", TensorProto.BOOL, []),
            helper.make_tensor_value_info("v_in", TensorProto.FLOAT, [1]),
        ],
        [
            helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []),
            helper.make_tensor_value_info("v_out", TensorProto.FLOAT, [1]),
        ],
        [helper.make_tensor("one", TensorProto.FLOAT, [1], [1.0])],
    )

"""TFLite → ONNX conversion, and the rewrite that makes a converted model's batch dynamic.

tflite2onnx exports BlazeFace with batch 1 baked in three places: the graph's input and
output shapes, ``Reshape`` targets such as ``[1, -1, 16]``, and ``Resize`` nodes that give an
absolute output ``sizes`` of ``[1, C, H, W]``. :func:`make_batch_dynamic` rewrites all three
(Reshape targets copy the batch dim with ``0``, ONNX Reshape semantics; Resize takes the
equivalent ``scales``), so one session runs any batch size with identical numerics.
"""

from __future__ import annotations

import logging
import tempfile
from pathlib import Path

import numpy as np
import onnx
from onnx import numpy_helper, shape_inference

from streamer.errors import AssetError

__all__ = ["BATCH_DIM", "convert_tflite", "make_batch_dynamic"]

BATCH_DIM = "batch"
"""The symbolic name given to the batch dimension."""


def convert_tflite(tflite_file: Path, onnx_file: Path) -> None:
    """Convert ``tflite_file`` to ONNX with a dynamic batch dim and write ``onnx_file``.

    Raises:
        AssetError: tflite2onnx is not installed, or the conversion or rewrite failed.
    """
    try:
        import tflite2onnx
    except ImportError as exc:
        raise AssetError(
            "converting .tflite models needs tflite2onnx: pip install 'streamer[convert]'"
        ) from exc
    # tflite2onnx warns once per float16 tensor; BlazeFace's outputs match TFLite within 2e-4.
    logging.getLogger("tflite2onnx").setLevel(logging.ERROR)
    with tempfile.TemporaryDirectory() as tmp:
        raw = Path(tmp) / "raw.onnx"
        try:
            tflite2onnx.convert(str(tflite_file), str(raw))
        except Exception as exc:  # tflite2onnx raises bare Exceptions and asserts
            raise AssetError(f"tflite2onnx failed on {tflite_file.name}: {exc}") from exc
        model = make_batch_dynamic(onnx.load(str(raw)))
    onnx.save(model, str(onnx_file))


def make_batch_dynamic(model: onnx.ModelProto) -> onnx.ModelProto:
    """Return a copy of ``model`` whose leading (batch) dim is the symbolic ``batch``.

    Raises:
        AssetError: the graph hard-codes the batch in a way this rewrite does not handle.
    """
    model = onnx.ModelProto.FromString(model.SerializeToString())
    graph = model.graph
    shapes = _static_shapes(model)
    initializers = {init.name: init for init in graph.initializer}
    for node in graph.node:
        if node.op_type == "Reshape":
            _free_reshape_batch(node, initializers)
        elif node.op_type == "Resize" and len(node.input) == 4 and node.input[3]:
            _resize_sizes_to_scales(node, initializers, shapes, graph)
    for value in (*graph.input, *graph.output):
        value.type.tensor_type.shape.dim[0].dim_param = BATCH_DIM
    del graph.value_info[:]
    _drop_unused_initializers(graph)
    try:
        onnx.checker.check_model(model)
    except onnx.checker.ValidationError as exc:
        raise AssetError(f"batch rewrite produced an invalid model: {exc}") from exc
    return model


def _static_shapes(model: onnx.ModelProto) -> dict[str, list[int]]:
    inferred = shape_inference.infer_shapes(model).graph
    return {
        v.name: [d.dim_value for d in v.type.tensor_type.shape.dim]
        for v in (*inferred.value_info, *inferred.input, *inferred.output)
    }


def _free_reshape_batch(node: onnx.NodeProto, initializers: dict[str, onnx.TensorProto]) -> None:
    target = initializers.get(node.input[1])
    if target is None:
        raise AssetError(f"Reshape {node.name!r} has a computed shape; cannot free its batch")
    dims = numpy_helper.to_array(target).copy()
    if dims.size and dims[0] == 1:
        dims[0] = 0  # ONNX Reshape: 0 copies the input's dim (allowzero=0)
        target.CopyFrom(numpy_helper.from_array(dims, target.name))


def _resize_sizes_to_scales(
    node: onnx.NodeProto,
    initializers: dict[str, onnx.TensorProto],
    shapes: dict[str, list[int]],
    graph: onnx.GraphProto,
) -> None:
    sizes = initializers.get(node.input[3])
    in_shape = shapes.get(node.input[0])
    if sizes is None or not in_shape or 0 in in_shape:
        raise AssetError(f"Resize {node.name!r}: sizes or input shape unknown")
    scales = (numpy_helper.to_array(sizes) / np.asarray(in_shape)).astype(np.float32)
    name = f"{node.name}/batch_free_scales"
    graph.initializer.append(numpy_helper.from_array(scales, name))
    node.input[2] = name
    del node.input[3]


def _drop_unused_initializers(graph: onnx.GraphProto) -> None:
    used = {name for node in graph.node for name in node.input}
    keep = [init for init in graph.initializer if init.name in used]
    del graph.initializer[:]
    graph.initializer.extend(keep)

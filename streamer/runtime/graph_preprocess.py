"""Image normalisation composed into an ONNX graph at load time (issue 9, item 4).

The host then only letterboxes (resizes and pads) and sends uint8 pixels; the rewritten graph
takes them as uint8 NHWC in the decoded BGR order and computes, per model channel ``c`` with
source channel ``s(c)``::

    y[n, c, h, w] = (float(x[n, h, w, s(c)]) - offset[c]) * scale[c]       # (NCHW model)

which is the letterbox's ``(x / 255 - mean) / std`` with ``offset = 255 · mean`` and
``scale = 1 / (255 · std)``, and ACL AIPP's ``(x - mean_chn - min_chn) · var_reci_chn`` with
``offset = mean_chn + min_chn`` and ``scale = var_reci_chn`` (the AIPP formula, CANN ATC
"AIPP配置" page; the simulator uses this module to apply a manifest's ``aipp`` section).

Nodes prepended, in order: ``Cast`` (uint8 → the model input's float type), ``Gather`` on the
channel axis (only when the channel order changes), ``Sub``, ``Mul``, and ``Transpose``
(NHWC → NCHW, only when the model is NCHW). The original input keeps its name as the output
of the last node, so the rest of the graph is unchanged.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

__all__ = ["InputNormalization", "prepend_normalization"]

_PREFIX = "streamer_preprocess"


@dataclass(frozen=True)
class InputNormalization:
    """What the graph does to the uint8 pixels before the original first input.

    Attributes:
        offset: float (3,), subtracted per model channel, in 0..255 pixel levels.
        scale: float (3,), multiplied per model channel after the offset.
        swap_rb: the model's channel order is the reverse of the input's (BGR pixels in, an
            RGB model; or the reverse).
        layout: the original model input's layout, ``NCHW`` (a Transpose is added) or ``NHWC``.
    """

    offset: tuple[float, float, float]
    scale: tuple[float, float, float]
    swap_rb: bool
    layout: Literal["NCHW", "NHWC"]

    @classmethod
    def from_mean_std(
        cls,
        mean: np.ndarray,
        std: np.ndarray,
        swap_rb: bool,
        layout: Literal["NCHW", "NHWC"],
    ) -> InputNormalization:
        """From the letterbox's ``mean`` and ``std`` (float (3,), on the 0..1 scale, model
        channel order): ``(x / 255 - mean) / std``."""
        offset = tuple(float(v) for v in np.asarray(mean, np.float64) * 255.0)
        scale = tuple(float(v) for v in 1.0 / (np.asarray(std, np.float64) * 255.0))
        return cls(offset, scale, swap_rb, layout)  # type: ignore[arg-type]


def prepend_normalization(model: onnx.ModelProto, norm: InputNormalization) -> onnx.ModelProto:
    """A copy of ``model`` whose first input is uint8 NHWC pixels, normalised in the graph.

    Args:
        model: an ONNX model whose first graph input is a 4-D float tensor with 3 channels
            in ``norm.layout``.
        norm: the normalisation to compose.

    Returns:
        The rewritten model: first input ``<name>`` uint8 (N, H, W, 3), N/H/W as the original
        (symbolic dims kept); every other input and output as before.

    Raises:
        ValueError: the first input is not a 4-D float tensor with 3 channels.
    """
    out = onnx.ModelProto()
    out.CopyFrom(model)
    graph = out.graph
    original = _first_data_input(graph)
    float_type = original.type.tensor_type.elem_type
    dims = list(original.type.tensor_type.shape.dim)
    nhwc = dims if norm.layout == "NHWC" else [dims[0], dims[2], dims[3], dims[1]]
    _check_channels(original.name, nhwc[3])
    pixels = f"{original.name}"
    internal = f"{_PREFIX}/{original.name}"
    nodes, inits = _nodes(pixels, internal, float_type, norm)
    _rename_uses(graph, original.name, internal)
    rest = list(graph.node)
    del graph.node[:]
    graph.node.extend(nodes + rest)
    graph.initializer.extend(inits)
    new_input = helper.make_tensor_value_info(pixels, TensorProto.UINT8, None)
    new_input.type.tensor_type.shape.dim.extend(nhwc)
    graph.input.remove(original)
    graph.input.insert(0, new_input)
    return out


def _first_data_input(graph: onnx.GraphProto) -> onnx.ValueInfoProto:
    """The first graph input that is not an initializer.

    Raises:
        ValueError: none, or not a 4-D float tensor.
    """
    constants = {i.name for i in graph.initializer}
    inputs = [i for i in graph.input if i.name not in constants]
    if not inputs:
        raise ValueError("the model has no inputs")
    tensor = inputs[0].type.tensor_type
    floats = (TensorProto.FLOAT, TensorProto.FLOAT16, TensorProto.DOUBLE)
    if tensor.elem_type not in floats or len(tensor.shape.dim) != 4:
        raise ValueError(f"input {inputs[0].name!r} must be a 4-D float tensor to normalise")
    return inputs[0]


def _check_channels(name: str, dim: onnx.TensorShapeProto.Dimension) -> None:
    if dim.HasField("dim_value") and dim.dim_value != 3:
        raise ValueError(f"input {name!r} has {dim.dim_value} channels, expected 3")


def _nodes(
    pixels: str, result: str, float_type: int, norm: InputNormalization
) -> tuple[list[onnx.NodeProto], list[onnx.TensorProto]]:
    """Cast → [Gather] → Sub → Mul → [Transpose], from ``pixels`` to ``result``."""
    dtype = helper.tensor_dtype_to_np_dtype(float_type)
    name = f"{_PREFIX}/"
    inits = [
        numpy_helper.from_array(np.asarray(norm.offset, dtype), name + "offset"),
        numpy_helper.from_array(np.asarray(norm.scale, dtype), name + "scale"),
    ]
    nodes = [helper.make_node("Cast", [pixels], [name + "cast"], to=float_type)]
    current = name + "cast"
    if norm.swap_rb:
        inits.append(numpy_helper.from_array(np.array([2, 1, 0], np.int64), name + "order"))
        nodes.append(helper.make_node("Gather", [current, name + "order"], [name + "bgr"], axis=3))
        current = name + "bgr"
    nodes.append(helper.make_node("Sub", [current, name + "offset"], [name + "centred"]))
    last = result if norm.layout == "NHWC" else name + "scaled"
    nodes.append(helper.make_node("Mul", [name + "centred", name + "scale"], [last]))
    if norm.layout == "NCHW":
        nodes.append(helper.make_node("Transpose", [last], [result], perm=[0, 3, 1, 2]))
    return nodes, inits


def _rename_uses(graph: onnx.GraphProto, old: str, new: str) -> None:
    """Make every node of ``graph`` read ``new`` where it read ``old``.

    Raises:
        ValueError: ``old`` is also a graph output.
    """
    for node in graph.node:
        for i, name in enumerate(node.input):
            if name == old:
                node.input[i] = new
    for output in graph.output:
        if output.name == old:
            raise ValueError(f"input {old!r} is also a graph output; cannot normalise it")

"""Image normalisation composed into an ONNX graph at load time (issue 9, item 4).

The host then only letterboxes (resizes and pads) and sends uint8 pixels; the rewritten graph
takes them as uint8 NHWC in the decoded BGR order and computes, per model channel ``c`` with
source channel ``s(c)``::

    y[n, c, h, w] = (float(x[n, h, w, s(c)]) - offset[c]) * scale[c]       # (NCHW model)

which is the letterbox's ``(x / 255 - mean) / std`` with ``offset = 255 · mean`` and
``scale = 1 / (255 · std)``, and ACL AIPP's ``(x - mean_chn - min_chn) · var_reci_chn`` with
``offset = mean_chn + min_chn`` and ``scale = var_reci_chn`` (the AIPP formula, CANN ATC
"AIPP配置" page; the simulator uses this module to apply a manifest's ``aipp`` section), and
MTCNN's ``(x - 127.5) / 128`` (:data:`streamer.runtime.mtcnn_keys.MTCNN_NORMALIZATION`).

Nodes prepended, in order: ``Transpose`` (NHWC → NCHW channel planes), ``Gather`` on the
channel axis 1 (only when the channel order changes), ``Cast`` (uint8 → the model input's
float type), ``Sub``, ``Mul``, and ``Transpose`` from NCHW to the model's layout (none for
NCHW; NHWC; ``NWHC`` for MTCNN's nets, which see images transposed). The original input keeps
its name as the output of the last node, so the rest of the graph is unchanged.

The channel swap and the arithmetic run on channel planes, with the offset and the scale
shaped (3, 1, 1), because onnxruntime's CPU kernels are slow on a channel-last axis of 3:
``Gather`` on it copies one element at a time, and ``Sub`` / ``Mul`` broadcast a (3,)
operand in runs of 3 elements. Measured with onnxruntime 1.32, one thread, on BlazeFace's
128 × 128 input: 0.75 ms a frame channel-last, 60 % of the model's own 1.25 ms; 0.035 ms on
planes.

:func:`prepend_runtime_normalization` builds the same nodes with the offset, scale and channel
order as graph inputs given on every run, one offset and scale per image of the batch: the
simulator's dynamic AIPP, whose parameters arrive with each execution.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from streamer.errors import ConfigError

__all__ = [
    "Layout",
    "RUNTIME_OFFSET",
    "RUNTIME_ORDER",
    "RUNTIME_SCALE",
    "InputNormalization",
    "per_channel_mean_std",
    "prepend_normalization",
    "prepend_runtime_normalization",
]

_PREFIX = "streamer_preprocess"

RUNTIME_OFFSET = f"{_PREFIX}/offset"
"""Input of :func:`prepend_runtime_normalization`: float (N, 1, 1, 3), per image and model
channel."""
RUNTIME_SCALE = f"{_PREFIX}/scale"
"""Input of :func:`prepend_runtime_normalization`: float (N, 1, 1, 3), per image and model
channel."""
RUNTIME_ORDER = f"{_PREFIX}/order"
"""Input of :func:`prepend_runtime_normalization`: int64 (3,), the source channel of each
model channel (``[2, 1, 0]`` swaps R and B, ``[0, 1, 2]`` keeps the order)."""

Layout = Literal["NCHW", "NHWC", "NWHC"]
"""The layout of a model's float image input. ``NWHC`` is NHWC with height and width
exchanged, so an (H, W) image goes in as (W, H): MTCNN's Caffe nets, trained on MATLAB's
column-major arrays (:mod:`streamer.vision.mtcnn.layout`)."""

_TO_PLANES = [0, 3, 1, 2]
"""The permutation from the pixels' NHWC (and the runtime parameters' (N, 1, 1, 3)) to NCHW
channel planes, where the normalisation runs."""

_FROM_PLANES: dict[Layout, list[int]] = {"NHWC": [0, 2, 3, 1], "NWHC": [0, 3, 2, 1]}
"""The permutation from NCHW to each other layout."""


@dataclass(frozen=True)
class InputNormalization:
    """What the graph does to the uint8 pixels before the original first input.

    Attributes:
        offset: float (3,), subtracted per model channel, in 0..255 pixel levels.
        scale: float (3,), multiplied per model channel after the offset.
        swap_rb: the model's channel order is the reverse of the input's (BGR pixels in, an
            RGB model; or the reverse).
        layout: the original model input's :data:`Layout`; a Transpose is added unless it is
            ``NHWC``.
    """

    offset: tuple[float, float, float]
    scale: tuple[float, float, float]
    swap_rb: bool
    layout: Layout

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


def per_channel_mean_std(
    mean: float | Sequence[float], std: float | Sequence[float], where: str = ""
) -> tuple[np.ndarray, np.ndarray]:
    """The letterbox's ``mean`` and ``std`` (one value, or one per model channel, on the 0..1
    scale) as float64 (3,) arrays, checked to be usable.

    Args:
        mean, std: as configured.
        where: prefix of the key names in messages, e.g. ``"preprocess."``.

    Raises:
        ConfigError: a ``std`` is not positive, or ``(x / 255 - mean) / std`` is beyond
            float32 (about 3.4e38, the widest float a model input or a normalising graph
            computes in) for a pixel level x in 0..255.
    """
    mean_3 = np.broadcast_to(np.asarray(mean, np.float64), (3,))
    std_3 = np.broadcast_to(np.asarray(std, np.float64), (3,))
    if not (std_3 > 0).all():
        raise ConfigError(f"{where}std: must be positive, got {std}")
    with np.errstate(over="ignore"):
        extremes = (np.array([[0.0], [1.0]]) - mean_3) / std_3
    largest = float(np.abs(extremes).max())
    if not largest <= float(np.finfo(np.float32).max):
        raise ConfigError(
            f"{where}mean, {where}std: (x / 255 - mean) / std reaches {largest:.3g}, beyond float32"
        )
    return mean_3, std_3


def prepend_normalization(model: onnx.ModelProto, norm: InputNormalization) -> onnx.ModelProto:
    """A copy of ``model`` whose first input is uint8 NHWC pixels, normalised in the graph.

    Args:
        model: an ONNX model whose first graph input is a 4-D float tensor with 3 channels
            in ``norm.layout``.
        norm: the normalisation to compose.

    Returns:
        The rewritten model: first input ``<name>`` uint8 (N, H, W, 3), N/H/W as the original
        (symbolic dims kept; for ``NWHC`` the original's dims 2 and 1); every other input and
        output as before.

    Raises:
        ValueError: the first input is not a 4-D float tensor with 3 channels.
    """
    out = onnx.ModelProto()
    out.CopyFrom(model)
    float_type = _first_data_input(out.graph).type.tensor_type.elem_type
    dtype = helper.tensor_dtype_to_np_dtype(float_type)
    names = _Names(
        f"{_PREFIX}/offset", f"{_PREFIX}/scale", f"{_PREFIX}/order" if norm.swap_rb else None
    )
    inits = [
        numpy_helper.from_array(np.asarray(norm.offset, dtype).reshape(3, 1, 1), names.offset),
        numpy_helper.from_array(np.asarray(norm.scale, dtype).reshape(3, 1, 1), names.scale),
    ]
    if names.order is not None:
        inits.append(numpy_helper.from_array(np.array([2, 1, 0], np.int64), names.order))
    _prepend(out.graph, norm.layout, names)
    out.graph.initializer.extend(inits)
    return out


def prepend_runtime_normalization(model: onnx.ModelProto, layout: Layout) -> onnx.ModelProto:
    """A copy of ``model`` whose first input is uint8 NHWC pixels, normalised in the graph
    with parameters given on every run.

    Args:
        model: as for :func:`prepend_normalization`, first input in ``layout``.
        layout: the original first input's layout.

    Returns:
        The rewritten model: first input uint8 (N, H, W, 3) as for
        :func:`prepend_normalization`, then the inputs :data:`RUNTIME_OFFSET` and
        :data:`RUNTIME_SCALE` (the model's float type, (N, 1, 1, 3): image ``n`` gets
        ``(x[..., order] - offset[n]) * scale[n]``) and :data:`RUNTIME_ORDER` (int64 (3,));
        every other input and output as before.

    Raises:
        ValueError: the first input is not a 4-D float tensor with 3 channels.
    """
    out = onnx.ModelProto()
    out.CopyFrom(model)
    original = _first_data_input(out.graph)
    float_type = original.type.tensor_type.elem_type
    batch = original.type.tensor_type.shape.dim[0]
    per_image = [batch, _dim(1), _dim(1), _dim(3)]
    params = [
        _value_info(RUNTIME_OFFSET, float_type, per_image),
        _value_info(RUNTIME_SCALE, float_type, per_image),
        _value_info(RUNTIME_ORDER, TensorProto.INT64, [_dim(3)]),
    ]
    planes = _Names(f"{_PREFIX}/offset_planes", f"{_PREFIX}/scale_planes", RUNTIME_ORDER)
    to_planes = [
        helper.make_node("Transpose", [RUNTIME_OFFSET], [planes.offset], perm=_TO_PLANES),
        helper.make_node("Transpose", [RUNTIME_SCALE], [planes.scale], perm=_TO_PLANES),
    ]
    _prepend(out.graph, layout, planes, to_planes)
    for index, value in enumerate(params, start=1):
        out.graph.input.insert(index, value)
    return out


@dataclass(frozen=True)
class _Names:
    """Where the prepended nodes read the offset and the scale (shaped (3, 1, 1) or
    (N, 3, 1, 1), to broadcast over NCHW channel planes) and the channel order (None: no
    ``Gather``) from."""

    offset: str
    scale: str
    order: str | None


def _prepend(
    graph: onnx.GraphProto,
    layout: Layout,
    names: _Names,
    setup: Sequence[onnx.NodeProto] = (),
) -> None:
    """Replace the first input of ``graph`` by uint8 NHWC pixels and prepend the nodes,
    after ``setup`` (nodes that compute what ``names`` reads).

    Raises:
        ValueError: the first input is not a 4-D float tensor with 3 channels, or is also a
            graph output.
    """
    original = _first_data_input(graph)
    float_type = original.type.tensor_type.elem_type
    dims = list(original.type.tensor_type.shape.dim)
    nhwc = {
        "NHWC": dims,
        "NCHW": [dims[0], dims[2], dims[3], dims[1]],
        "NWHC": [dims[0], dims[2], dims[1], dims[3]],
    }[layout]
    _check_channels(original.name, nhwc[3])
    pixels = f"{original.name}"
    internal = f"{_PREFIX}/{original.name}"
    nodes = [*setup, *_nodes(pixels, internal, float_type, layout, names)]
    _rename_uses(graph, original.name, internal)
    rest = list(graph.node)
    del graph.node[:]
    graph.node.extend(nodes + rest)
    new_input = _value_info(pixels, TensorProto.UINT8, nhwc)
    graph.input.remove(original)
    graph.input.insert(0, new_input)


def _value_info(
    name: str, elem_type: int, dims: list[onnx.TensorShapeProto.Dimension]
) -> onnx.ValueInfoProto:
    value = helper.make_tensor_value_info(name, elem_type, None)
    value.type.tensor_type.shape.dim.extend(dims)
    return value


def _dim(size: int) -> onnx.TensorShapeProto.Dimension:
    dim = onnx.TensorShapeProto.Dimension()
    dim.dim_value = size
    return dim


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
    pixels: str, result: str, float_type: int, layout: Layout, names: _Names
) -> list[onnx.NodeProto]:
    """Transpose → [Gather] → Cast → Sub → Mul → [Transpose], from ``pixels`` to ``result``;
    the middle ones on NCHW channel planes (see the module docstring for why)."""
    name = f"{_PREFIX}/"
    nodes = [helper.make_node("Transpose", [pixels], [name + "planes"], perm=_TO_PLANES)]
    current = name + "planes"
    if names.order is not None:
        nodes.append(helper.make_node("Gather", [current, names.order], [name + "ordered"], axis=1))
        current = name + "ordered"
    nodes.append(helper.make_node("Cast", [current], [name + "cast"], to=float_type))
    nodes.append(helper.make_node("Sub", [name + "cast", names.offset], [name + "centred"]))
    perm = _FROM_PLANES.get(layout)
    last = result if perm is None else name + "scaled"
    nodes.append(helper.make_node("Mul", [name + "centred", names.scale], [last]))
    if perm is not None:
        nodes.append(helper.make_node("Transpose", [last], [result], perm=perm))
    return nodes


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

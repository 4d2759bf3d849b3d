"""A simulated offline model: an ONNX file run by onnxruntime, shaped by its manifest.

What ATC bakes into an ``.om`` and the simulator reproduces (ATC parameter pages, HA
``canncommercial/800/devaids/atc/atlasatcparam_16_0018.html``; seeds "动态Batch/动态分辨率/
动态维度"):
    - ``--input_shape`` fixes every dim, or leaves ``-1`` where one dynamic option fills it.
    - A dynamic model gets one more input, ``ascend_mbatch_shape_data`` (last), into which
      ``set_dynamic_batch_size`` / ``set_dynamic_hw_size`` / ``set_input_dynamic_dims`` write
      the chosen gear; its size comes from ``get_input_size_by_index`` like any input.
    - Input and output sizes are those of the largest gear; output dims that change with the
      gear are reported as ``-1``. Each gear's real output dims are kept for
      ``get_cur_output_dims``.
    - Resolution gears fill the H and W dims of the ``input_format`` (NCHW: 2, 3; NHWC: 1, 2);
      dims gears need ``ND``, or no format given.
    - Static AIPP (``--insert_op_conf``) turns the image input into uint8 NHWC pixels and
      normalises them on the device (manifest ``aipp``; see
      :mod:`streamer.runtime.acl.aipp_static`).
    - Dynamic AIPP (``aipp_mode: dynamic``) does too, with parameters given per execution: the
      image input takes uint8 NHWC pixels in ``max_src_image_size`` bytes, and one more input,
      ``ascend_dynamic_aipp_data`` (after the data inputs, before the gear tensor), carries
      the parameters (uint8, :func:`~streamer.runtime.acl.sim.aipp_data.aipp_data_size` of the
      largest batch). The graph takes them as inputs
      (:func:`~streamer.runtime.graph_preprocess.prepend_runtime_normalization`;
      :mod:`streamer.runtime.acl.sim.aipp_model`).
"""

from __future__ import annotations

import enum
import functools
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Literal

import numpy as np
import onnx
import onnxruntime as ort

from streamer.runtime.acl.aipp_dynamic import DynamicAippConfig
from streamer.runtime.acl.aipp_rules import AippRuleError, check_aipp_build
from streamer.runtime.acl.aipp_static import StaticAipp
from streamer.runtime.acl.constants import (
    ACL_DYNAMIC_AIPP_NAME,
    ACL_DYNAMIC_TENSOR_NAME,
    DTYPES,
    DataType,
)
from streamer.runtime.acl.sim.aipp_data import aipp_data_size
from streamer.runtime.acl.sim.aipp_model import neutral_feeds, runtime_dtype
from streamer.runtime.acl.sim.manifest import Manifest, ManifestError, onnx_path, read_manifest
from streamer.runtime.graph_preprocess import prepend_normalization, prepend_runtime_normalization

__all__ = ["DynamicKind", "ModelImage", "TensorDesc", "load_image"]

_ONNX_TYPES = {
    "tensor(float)": DataType.FLOAT,
    "tensor(float16)": DataType.FLOAT16,
    "tensor(double)": DataType.DOUBLE,
    "tensor(int8)": DataType.INT8,
    "tensor(uint8)": DataType.UINT8,
    "tensor(int16)": DataType.INT16,
    "tensor(uint16)": DataType.UINT16,
    "tensor(int32)": DataType.INT32,
    "tensor(uint32)": DataType.UINT32,
    "tensor(int64)": DataType.INT64,
    "tensor(uint64)": DataType.UINT64,
    "tensor(bool)": DataType.BOOL,
}

Shape = tuple[int, ...]
Gear = tuple[int, ...]
Feeds = Callable[[int], dict[str, np.ndarray]]
"""Extra session inputs for a batch of the given size."""


class DynamicKind(enum.Enum):
    """Which dynamic option the model was built with (one at most)."""

    STATIC = "static"
    BATCH = "batch"
    HW = "hw"
    DIMS = "dims"


@dataclass(frozen=True)
class TensorDesc:
    """One model input or output as ``acl.mdl.get_*`` reports it.

    Attributes:
        name: tensor name.
        dims: dims; ``-1`` where the gear decides.
        data_type: ``aclDataType``.
        size: bytes for the largest gear.
    """

    name: str
    dims: Shape
    data_type: DataType
    size: int

    @property
    def dtype(self) -> np.dtype[Any]:
        return DTYPES[self.data_type]


@dataclass(frozen=True)
class ModelImage:
    """An "om" the simulator can load: descriptions, gears and the onnxruntime session.

    Attributes:
        inputs: model inputs in order: the data inputs, then the dynamic AIPP input of a
            dynamic-AIPP model, then the gear tensor of a dynamic model.
        outputs: model outputs in order.
        kind: the dynamic option.
        gears: batch ``(b,)``, resolution ``(h, w)``, or every input's dims concatenated.
        om2: an OM2-format file.
        session: the onnxruntime session that executes it.
        shapes: per gear, the data inputs' shapes.
        output_shapes: per gear, the outputs' shapes.
        aipp: the ``aipp_op`` block of a dynamic-AIPP model, else None.
        static_aipp: the ``aipp_op`` block of a static-AIPP model, else None.
    """

    inputs: tuple[TensorDesc, ...]
    outputs: tuple[TensorDesc, ...]
    kind: DynamicKind
    gears: tuple[Gear, ...]
    om2: bool
    session: ort.InferenceSession = field(repr=False)
    shapes: dict[Gear, tuple[Shape, ...]] = field(repr=False)
    output_shapes: dict[Gear, tuple[Shape, ...]] = field(repr=False)
    aipp: DynamicAippConfig | None = None
    static_aipp: StaticAipp | None = None

    @property
    def largest_gear(self) -> Gear:
        """The gear with the most output bytes (the last such one): what the output sizes of
        ``get_output_size_by_index`` are for, and the dims ``get_cur_output_dims`` reports
        before any gear is set."""
        itemsizes = [t.dtype.itemsize for t in self.outputs]

        def output_bytes(gear: Gear) -> int:
            shapes = self.output_shapes[gear]
            return sum(_count(s) * size for s, size in zip(shapes, itemsizes, strict=True))

        return max(reversed(self.gears), key=output_bytes)

    @property
    def dynamic_index(self) -> int | None:
        """Index of ``ascend_mbatch_shape_data``, or None for a static model."""
        return None if self.kind == DynamicKind.STATIC else len(self.inputs) - 1

    @property
    def aipp_index(self) -> int | None:
        """Index of ``ascend_dynamic_aipp_data``, or None without dynamic AIPP."""
        return None if self.aipp is None else len(self.data_inputs)

    @property
    def data_inputs(self) -> tuple[TensorDesc, ...]:
        """The inputs that carry data (without the AIPP input and the gear tensor)."""
        extra = (self.dynamic_index is not None) + (self.aipp is not None)
        return self.inputs[: len(self.inputs) - extra]

    def run(
        self, arrays: Sequence[np.ndarray], feeds: Mapping[str, np.ndarray] | None = None
    ) -> list[np.ndarray]:
        """Execute on ``arrays`` (one per data input, shapes of one gear) and the extra session
        inputs ``feeds`` (a dynamic-AIPP model's parameters)."""
        names = [t.name for t in self.data_inputs]
        inputs = {**dict(zip(names, arrays, strict=True)), **(feeds or {})}
        return list(self.session.run(None, inputs))


def load_image(model: Path) -> ModelImage:
    """Build the image of ``model`` (``.om`` or ``.onnx``) from the ONNX file and manifest.

    Raises:
        ManifestError: no ONNX file, an invalid manifest, or one ATC would refuse.
    """
    manifest = read_manifest(model)
    onnx_file = onnx_path(model)
    if not onnx_file.is_file():
        raise ManifestError(f"no ONNX file {onnx_file} for {model}")
    session = _session(str(onnx_file), onnx_file)
    dims = _input_dims(session, manifest)
    kind, gears = _gears(manifest, dims)
    axes = _gear_axes(kind, manifest)
    if manifest.aipp is not None:
        session, dims, axes = _with_aipp(onnx_file, manifest.aipp, manifest, kind, dims)
    shapes = {gear: _shapes_for(kind, dims, gear, axes) for gear in gears}
    dynamic_aipp = manifest.aipp if isinstance(manifest.aipp, DynamicAippConfig) else None
    image = _describe(session, dims, kind, gears, shapes, manifest.om2, dynamic_aipp)
    if isinstance(manifest.aipp, StaticAipp):
        image = replace(image, static_aipp=manifest.aipp)
    return image


def _session(source: str | bytes, onnx_file: Path) -> ort.InferenceSession:
    """An onnxruntime CPU session of a model file or serialised model, one thread per run:
    the simulated device computes on the simulator's own (named) stream and model threads,
    so the host work and the device work it stands in for stay apart (``streamer bench``
    counts those threads as the device).

    Raises:
        ManifestError: onnxruntime refuses it.
    """
    options = ort.SessionOptions()
    options.log_severity_level = 3
    options.intra_op_num_threads = 1
    options.inter_op_num_threads = 1
    try:
        return ort.InferenceSession(source, options, providers=["CPUExecutionProvider"])
    except Exception as exc:  # onnxruntime raises untyped pybind errors
        raise ManifestError(f"{onnx_file}: {exc}") from exc


def _with_aipp(
    onnx_file: Path,
    aipp: StaticAipp | DynamicAippConfig,
    manifest: Manifest,
    kind: DynamicKind,
    dims: dict[str, Shape],
) -> tuple[ort.InferenceSession, dict[str, Shape], tuple[int, ...]]:
    """The session, input dims and gear axes of the model with AIPP composed in.

    The image input becomes uint8 (N, H, W, 3); resolution gears then fill dims 1 and 2.
    Static AIPP's arithmetic is baked into the graph, dynamic AIPP's takes its parameters as
    graph inputs (:func:`~streamer.runtime.graph_preprocess.prepend_runtime_normalization`).

    Raises:
        ManifestError: a combination rule is broken (the message names it, see
            :func:`~streamer.runtime.acl.aipp_rules.check_aipp_build`), more than one data
            input, static AIPP with what the simulator does not implement or a source size
            other than the model's, or dynamic AIPP on an ``ND`` input (GE ``AippOp``: the
            format must be NCHW or NHWC).
    """
    try:
        check_aipp_build(aipp, None if kind == DynamicKind.STATIC else kind.value)  # type: ignore[arg-type]
    except AippRuleError as exc:
        raise ManifestError(f"aipp: {exc}") from exc
    _require(len(dims) == 1 and aipp.related_input_rank == 0, "aipp: one data input only")
    layout: Literal["NCHW", "NHWC"] = "NHWC" if manifest.input_format == "NHWC" else "NCHW"
    ((name, shape),) = dims.items()
    _require(len(shape) == 4, f"aipp: input {name!r} of shape {list(shape)} is not an image")
    nhwc = shape if layout == "NHWC" else (shape[0], shape[2], shape[3], shape[1])
    _require(
        nhwc[3] == 3,
        f"aipp: input {name!r} of shape {list(shape)} read as {layout} (input_format) has "
        f"{nhwc[3]} channels; AIPP's images have 3, so input_format must name the model's "
        "layout",
    )
    original = onnx.load(str(onnx_file))
    if isinstance(aipp, StaticAipp):
        _check_static_aipp(aipp, name, nhwc)
        model = prepend_normalization(original, aipp.normalization(layout))
    else:
        _require(
            manifest.input_format != "ND", "aipp: dynamic AIPP needs input_format NCHW or NHWC"
        )
        model = prepend_runtime_normalization(original, layout)
    axes = (1, 2) if kind == DynamicKind.HW else _gear_axes(kind, manifest)
    return _session(model.SerializeToString(), onnx_file), {name: nhwc}, axes


def _check_static_aipp(aipp: StaticAipp, name: str, nhwc: Shape) -> None:
    """Raises: ManifestError: crop, padding or colour-space conversion (not simulated), or a
    source size other than input ``name``'s (N, H, W, 3) ``nhwc``."""
    _require(
        not (aipp.crop or aipp.padding or aipp.csc_switch),
        "aipp: the simulator does not implement crop, padding or colour-space conversion",
    )
    source = (aipp.src_image_size_h, aipp.src_image_size_w)
    _require(
        source == (0, 0) or source == nhwc[1:3],
        f"aipp: src_image_size {list(source)} (h, w) differs from input {name!r} {list(nhwc[1:3])}"
        " and the simulator has no crop or resize",
    )


def _input_dims(session: ort.InferenceSession, manifest: Manifest) -> dict[str, Shape]:
    dims: dict[str, Shape] = {}
    for arg in session.get_inputs():
        onnx_dims = tuple(d if isinstance(d, int) and d >= 0 else -1 for d in arg.shape)
        given = manifest.input_shape.get(arg.name, onnx_dims)
        if len(given) != len(onnx_dims) or any(
            o >= 0 and g >= 0 and o != g for o, g in zip(onnx_dims, given, strict=True)
        ):
            raise ManifestError(f"input_shape {arg.name}: {list(given)} vs ONNX {arg.shape}")
        dims[arg.name] = given
    unknown = set(manifest.input_shape) - set(dims)
    if unknown:
        raise ManifestError(f"input_shape names unknown inputs {sorted(unknown)}")
    return dims


def _gears(manifest: Manifest, dims: dict[str, Shape]) -> tuple[DynamicKind, tuple[Gear, ...]]:
    holes = [(name, axis) for name, shape in dims.items() for axis, d in enumerate(shape) if d < 0]
    if manifest.dynamic_batch_size is not None:
        _require(bool(holes) and all(axis == 0 for _, axis in holes), "batch needs -1 at dim 0")
        return DynamicKind.BATCH, tuple((b,) for b in manifest.dynamic_batch_size)
    if manifest.dynamic_image_size is not None:
        axes = list(_gear_axes(DynamicKind.HW, manifest))
        per_input = {name: sorted(a for n, a in holes if n == name) for name, _ in holes}
        _require(
            bool(holes) and all(a == axes for a in per_input.values()),
            f"dynamic_image_size needs -1 at dims {axes} (H, W in "
            f"{manifest.input_format or 'NCHW'}) only, input_shape has {holes}",
        )
        return DynamicKind.HW, tuple(tuple(hw) for hw in manifest.dynamic_image_size)
    if manifest.dynamic_dims is not None:
        _require(manifest.input_format in (None, "ND"), "dynamic_dims needs input_format ND")
        _require(all(len(g) == len(holes) for g in manifest.dynamic_dims), "dims per -1 dim")
        return DynamicKind.DIMS, tuple(_fill_holes(dims, g) for g in manifest.dynamic_dims)
    _require(not holes, f"dims {holes} are dynamic: set input_shape or a dynamic option")
    return DynamicKind.STATIC, ((),)


def _require(condition: bool, message: str) -> None:
    if not condition:
        raise ManifestError(message)


def _fill_holes(dims: dict[str, Shape], values: Sequence[int]) -> Gear:
    filled = iter(values)
    return tuple(d if d >= 0 else next(filled) for shape in dims.values() for d in shape)


def _gear_axes(kind: DynamicKind, manifest: Manifest) -> tuple[int, ...]:
    """The dims a batch or resolution gear fills (none for static and dims models).

    Raises:
        ManifestError: resolution gears with ``input_format`` ND.
    """
    if kind == DynamicKind.BATCH:
        return (0,)
    if kind != DynamicKind.HW:
        return ()
    _require(manifest.input_format != "ND", "dynamic_image_size needs input_format NCHW or NHWC")
    return (1, 2) if manifest.input_format == "NHWC" else (2, 3)


def _shapes_for(
    kind: DynamicKind, dims: dict[str, Shape], gear: Gear, axes: tuple[int, ...]
) -> tuple[Shape, ...]:
    if kind == DynamicKind.DIMS:
        flat, shapes = iter(gear), []
        for shape in dims.values():
            shapes.append(tuple(next(flat) for _ in shape))
        return tuple(shapes)
    fill = dict(zip(axes, gear, strict=True))
    return tuple(
        tuple(fill.get(a, d) if d < 0 else d for a, d in enumerate(s)) for s in dims.values()
    )


def _describe(
    session: ort.InferenceSession,
    dims: dict[str, Shape],
    kind: DynamicKind,
    gears: tuple[Gear, ...],
    shapes: dict[Gear, tuple[Shape, ...]],
    om2: bool,
    aipp: DynamicAippConfig | None,
) -> ModelImage:
    args = [arg for arg in session.get_inputs() if arg.name in dims]
    types = [_data_type(arg.type, arg.name) for arg in args]
    inputs = [
        TensorDesc(
            arg.name, dims[arg.name], dtype, max(_nbytes(s[i], dtype) for s in shapes.values())
        )
        for i, (arg, dtype) in enumerate(zip(args, types, strict=True))
    ]
    extra = None if aipp is None else functools.partial(neutral_feeds, dtype=runtime_dtype(session))
    names = [arg.name for arg in args]
    output_shapes = _output_shapes(session, names, types, shapes, extra)
    outputs = _output_descs(session, output_shapes)
    if aipp is not None:
        inputs[0] = replace(inputs[0], size=aipp.max_src_image_size)
        size = aipp_data_size(max(s[0][0] for s in shapes.values()))
        inputs.append(TensorDesc(ACL_DYNAMIC_AIPP_NAME, (size,), DataType.UINT8, size))
    if kind != DynamicKind.STATIC:
        width = len(gears[0])
        inputs.append(TensorDesc(ACL_DYNAMIC_TENSOR_NAME, (width,), DataType.INT64, 8 * width))
    return ModelImage(
        tuple(inputs), outputs, kind, gears, om2, session, shapes, output_shapes, aipp
    )


def _output_shapes(
    session: ort.InferenceSession,
    names: list[str],
    types: list[DataType],
    shapes: dict[Gear, tuple[Shape, ...]],
    extra: Feeds | None,
) -> dict[Gear, tuple[Shape, ...]]:
    """Per gear, the output shapes of one run on zeros (what ATC fixes for that gear), the
    data inputs ``names`` joined by the ``extra`` inputs of the gear's batch size.

    Raises:
        ManifestError: the model does not run at a gear.
    """
    found: dict[Gear, tuple[Shape, ...]] = {}
    for gear, gear_shapes in shapes.items():
        feeds = {
            n: np.zeros(s, DTYPES[t]) for n, s, t in zip(names, gear_shapes, types, strict=True)
        }
        if extra is not None:
            feeds.update(extra(gear_shapes[0][0]))
        try:
            found[gear] = tuple(tuple(out.shape) for out in session.run(None, feeds))
        except Exception as exc:  # onnxruntime raises untyped pybind errors
            raise ManifestError(f"the model does not run with inputs {gear_shapes}: {exc}") from exc
    return found


def _output_descs(
    session: ort.InferenceSession, output_shapes: dict[Gear, tuple[Shape, ...]]
) -> tuple[TensorDesc, ...]:
    descs = []
    for index, arg in enumerate(session.get_outputs()):
        per_gear = [shapes[index] for shapes in output_shapes.values()]
        merged = tuple(
            d if all(p[a] == d for p in per_gear) else -1 for a, d in enumerate(per_gear[0])
        )
        data_type = _data_type(arg.type, arg.name)
        size = max(_nbytes(p, data_type) for p in per_gear)
        descs.append(TensorDesc(arg.name, merged, data_type, size))
    return tuple(descs)


def _data_type(onnx_type: str, name: str) -> DataType:
    data_type = _ONNX_TYPES.get(onnx_type)
    if data_type is None:
        raise ManifestError(f"tensor {name!r}: {onnx_type} has no ACL data type")
    return data_type


def _nbytes(shape: Shape, data_type: DataType) -> int:
    return _count(shape) * DTYPES[data_type].itemsize


def _count(shape: Shape) -> int:
    return int(np.prod(shape, dtype=np.int64))

"""Dynamic gears (档位) of an ACL model: the kind, the gear of a batch, setting it, and the
output dims it gives.

**One kind per model.** ATC builds a model with at most one of ``--dynamic_batch_size``,
``--dynamic_image_size`` and ``--dynamic_dims`` (mutually exclusive: HA
``canncommercial/800/devaids/atc/atlasatcparam_16_0018.html``), and only one of the setters
below may be used on a model (seeds "动态Batch/动态分辨率/动态维度", 须知; reference/pyacl.md
S16). A description that reports gears of two kinds is refused at load.

**The gear of a batch** is read off its arrays, the model input dims (``get_input_dims``) having
``-1`` where the gear decides (RT ``python/docs/zh/api_ref/ge/function-get_input_dims.md``:
``[-1, 3, 224, 224]`` for a dynamic batch, ``[1, 3, -1, -1]`` for a dynamic resolution):

=========  ===============================  ==================================================
kind       gear                             setter (RT ``python/docs/zh/api_ref/ge/…``)
=========  ===============================  ==================================================
batch      ``(n,)``: dim 0                  ``set_dynamic_batch_size(id, ds, index, n)``
hw         ``(h, w)``: the two ``-1`` dims  ``set_dynamic_hw_size(id, ds, index, h, w)``
           (H, W in NCHW and in NHWC)       (``function-set_dynamic_hw_size.md``)
dims       every dim of every data input,   ``set_input_dynamic_dims(id, ds, index, dims)``,
           concatenated in input order      ``dims = {"name": "", "dimCount": n, "dims": [...]}``
                                            (``function-set_input_dynamic_dims.md``)
=========  ===============================  ==================================================

``index`` is that of ``ascend_mbatch_shape_data`` and ``ds`` the batch's input dataset. The
dims gears of ``get_input_dynamic_dims`` are whole concatenated shapes too, static dims
included (``function-get_input_dynamic_dims.md``: ``1,1,40,20,1,20,1,1`` for
``data(1,1,40,-1)``, ``label(1,-1)``, ``mask(-1,-1)``), in ATC's ``--input_shape`` order,
which streamer requires to be the model's input order (checked at load).

**Output dims.** Output buffers have ``get_output_size_by_index`` bytes, the largest gear's
(seeds page above: "建议使用该方式"). ``acl.mdl.get_cur_output_dims(desc, i)`` gives the dims of
output ``i`` for the gear last set on the model (``function-get_cur_output_dims.md``). That
"current gear" belongs to the model, not to a dataset (GE ``aclmdlGetCurOutputDims`` asks
``GeExecutor::GetCurShape(model_id)``), so the dims are read by the enqueue thread, the one
thread that sets gears, right after setting the gear of a batch: read later by the dequeue
thread, they could already be those of the next batch's gear.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from streamer.errors import ModelError
from streamer.runtime.acl.errors import check_ret
from streamer.runtime.base import DYNAMIC, Tensor, TensorInfo

__all__ = [
    "Gear",
    "GearKind",
    "GearTable",
    "current_output_shapes",
    "gear_table",
    "set_gear",
]

Gear = tuple[int, ...]
"""One gear: ``(n,)``, ``(h, w)``, or a concatenated shape (see the module docstring)."""

_HW_DIMS = 2


class GearKind(enum.Enum):
    """The dynamic option a model was built with, named after its ATC option."""

    STATIC = "static"
    BATCH = "dynamic_batch_size"
    HW = "dynamic_image_size"
    DIMS = "dynamic_dims"


@dataclass(frozen=True)
class GearTable:
    """A model's dynamic kind and its gears.

    Attributes:
        kind: the one dynamic option, or ``STATIC``.
        gears: the gears as the setter of ``kind`` takes them (module docstring); empty for a
            static model.
        inputs: the data inputs, dims with ``-1`` where the gear decides.
    """

    kind: GearKind
    gears: tuple[Gear, ...]
    inputs: tuple[TensorInfo, ...]

    def gear_of(self, shapes: Sequence[tuple[int, ...]]) -> Gear | None:
        """The gear of a batch whose data inputs have ``shapes`` (model order), or None for a
        static model or a resolution that differs between inputs."""
        if self.kind == GearKind.BATCH:
            return (shapes[0][0],)
        if self.kind == GearKind.HW:
            found = {_at_holes(t.shape, s) for t, s in zip(self.inputs, shapes, strict=True)}
            found.discard(())
            return found.pop() if len(found) == 1 else None
        if self.kind == GearKind.DIMS:
            return tuple(d for shape in shapes for d in shape)
        return None

    def problem(self, inputs: Sequence[Tensor]) -> str | None:
        """Why a batch of ``inputs`` has no gear of this model, or None (always None when the
        model is static or has batch gears: :func:`~streamer.runtime.acl.model_base.batch_problem`
        checks those)."""
        if self.kind not in (GearKind.HW, GearKind.DIMS):
            return None
        gear = self.gear_of([a.shape for a in inputs])
        if gear is not None and gear in self.gears:
            return None
        what = "resolution (h, w)" if self.kind == GearKind.HW else "dims"
        shapes = [list(a.shape) for a in inputs]
        return (
            f"input shapes {shapes} give {what} {list(gear) if gear else 'mixed'}, not one of "
            f"the model's {self.kind.value} gears {[list(g) for g in self.gears]}"
        )


def gear_table(
    name: str,
    inputs: tuple[TensorInfo, ...],
    batch: tuple[int, ...],
    hw: tuple[tuple[int, int], ...],
    dims: tuple[Gear, ...],
) -> GearTable:
    """The gear table of a model from what its description reports.

    Args:
        name: the model (stage) name, for messages.
        inputs: the data inputs (``ascend_mbatch_shape_data`` left out), dims with ``-1``.
        batch: ``get_dynamic_batch`` gears.
        hw: ``get_dynamic_hw`` gears, (height, width).
        dims: ``get_input_dynamic_dims`` gears, concatenated shapes.

    Raises:
        ModelError: gears of more than one kind; resolution gears whose inputs do not have
            exactly two adjacent ``-1`` dims; dims gears that do not split into the inputs'
            shapes in model order. The message names the model, its input shapes and the
            ATC options at fault.
    """
    reported = {
        GearKind.BATCH: tuple((b,) for b in batch),
        GearKind.HW: tuple(tuple(g) for g in hw),
        GearKind.DIMS: tuple(tuple(g) for g in dims),
    }
    kinds = {kind: gears for kind, gears in reported.items() if gears}
    if len(kinds) > 1:
        settings = "; ".join(f"--{k.value} {[list(g) for g in v]}" for k, v in kinds.items())
        raise ModelError(
            f"model {name!r}: it has gears of {len(kinds)} dynamic kinds ({settings}) for "
            f"inputs {_shapes(inputs)}; ATC's --dynamic_batch_size, --dynamic_image_size and "
            "--dynamic_dims are mutually exclusive and ACL sets one kind per model: rebuild "
            "it with one of them"
        )
    if not kinds:
        return GearTable(GearKind.STATIC, (), inputs)
    ((kind, gears),) = kinds.items()
    table = GearTable(kind, gears, inputs)
    _check_layout(name, table)
    return table


def _check_layout(name: str, table: GearTable) -> None:
    """Raises: ModelError: see :func:`gear_table`."""
    if table.kind == GearKind.HW:
        for tensor in table.inputs:
            holes = [a for a, d in enumerate(tensor.shape) if d == DYNAMIC]
            if holes and (len(holes) != _HW_DIMS or holes[1] != holes[0] + 1):
                raise ModelError(
                    f"model {name!r}: --dynamic_image_size gears {[list(g) for g in table.gears]}"
                    f" need -1 at H and W only, but input {tensor.name!r} is {list(tensor.shape)}"
                )
    if table.kind == GearKind.DIMS:
        for gear in table.gears:
            if not _fits(gear, table.inputs):
                raise ModelError(
                    f"model {name!r}: --dynamic_dims gear {list(gear)} does not split into the "
                    f"inputs {_shapes(table.inputs)} in model order; give ATC --input_shape in "
                    "the model's input order"
                )


def _fits(gear: Gear, inputs: tuple[TensorInfo, ...]) -> bool:
    """Whether ``gear`` is the inputs' shapes concatenated, with their static dims."""
    expected = [d for t in inputs for d in t.shape]
    return len(gear) == len(expected) and all(
        e in (DYNAMIC, g) for e, g in zip(expected, gear, strict=True)
    )


def _at_holes(dims: tuple[int, ...], shape: tuple[int, ...]) -> Gear:
    return tuple(s for d, s in zip(dims, shape, strict=True) if d == DYNAMIC)


def _shapes(inputs: tuple[TensorInfo, ...]) -> dict[str, list[int]]:
    return {t.name: list(t.shape) for t in inputs}


def set_gear(
    acl: Any, model_id: int, dataset: int, index: int, table: GearTable, gear: Gear
) -> None:
    """Set ``gear`` of a ``table.kind`` model in the input ``dataset`` (module docstring).

    Args:
        acl: the pyACL module.
        model_id: the loaded model.
        dataset: the batch's input dataset, which holds the gear tensor at ``index``.
        index: index of ``ascend_mbatch_shape_data``.
        table: the model's gears; ``gear`` must be one of them.
        gear: the gear of the batch.

    Raises:
        AclError: the setter failed (``ACL_ERROR_GE_DYNAMIC_BATCH_SIZE_INVALID`` for a gear the
            model lacks, GE ``GeExecutor::SetDynamic*``).
    """
    mdl = acl.mdl
    if table.kind == GearKind.BATCH:
        ret = mdl.set_dynamic_batch_size(model_id, dataset, index, gear[0])
        check_ret(ret, "acl.mdl.set_dynamic_batch_size")
    elif table.kind == GearKind.HW:
        ret = mdl.set_dynamic_hw_size(model_id, dataset, index, gear[0], gear[1])
        check_ret(ret, "acl.mdl.set_dynamic_hw_size")
    elif table.kind == GearKind.DIMS:
        dims = {"name": "", "dimCount": len(gear), "dims": list(gear)}
        ret = mdl.set_input_dynamic_dims(model_id, dataset, index, dims)
        check_ret(ret, "acl.mdl.set_input_dynamic_dims")


def current_output_shapes(acl: Any, desc: int, count: int) -> tuple[tuple[int, ...], ...]:
    """``acl.mdl.get_cur_output_dims`` of each of the ``count`` outputs: their dims for the
    gear last set on the model (call it right after :func:`set_gear`, module docstring).

    Raises:
        AclError: the query failed.
    """
    shapes = []
    for index in range(count):
        dims, ret = acl.mdl.get_cur_output_dims(desc, index)
        check_ret(ret, "acl.mdl.get_cur_output_dims")
        shapes.append(tuple(int(d) for d in dims["dims"][: dims["dimCount"]]))
    return tuple(shapes)

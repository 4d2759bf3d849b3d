"""A model description (``acl.mdl.get_desc``) read into streamer's :class:`ModelInfo`.

Dynamic models carry one extra input, ``ascend_mbatch_shape_data``, found by name
(``acl.mdl.get_input_index_by_name``; seeds "动态Batch/动态分辨率/动态维度"); it is kept out of
``ModelInfo.inputs`` because the pipeline never feeds it. Gears come from
``get_dynamic_batch`` (≤ 128, ``batchCount == 0`` for none), ``get_dynamic_hw`` and
``get_input_dynamic_dims`` (GE ``acl_mdl.h``; RT ``python/pyACL/mdl/mdl_wrap.cpp``) into a
:class:`~streamer.runtime.acl.gears.GearTable`, which refuses a model with gears of two kinds.
A model built with dynamic AIPP has one more extra input, ``ascend_dynamic_aipp_data``, also
found by name (one dynamic AIPP input: RT ``python/docs/zh/api_ref/ge/function-set_input_aipp.md``)
and kept out of ``ModelInfo.inputs``: ``acl.mdl.set_input_aipp`` fills it.
Sizes from ``get_*_size_by_index`` are those of the largest gear: buffers of that size fit
every gear (recommended on the same seeds page).

``ModelInfo.batch_gears`` is the dynamic batch gear list, or the static batch of the first
input, or, for a dims model whose first input has a ``-1`` batch dim, the batch values its
dims gears use (the batcher pads to one of them; the whole gear is checked per batch).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from streamer.errors import ModelError
from streamer.runtime.acl.constants import (
    ACL_DYNAMIC_AIPP_NAME,
    ACL_DYNAMIC_TENSOR_NAME,
    DTYPES,
    AclCode,
    DataType,
)
from streamer.runtime.acl.errors import check_ret
from streamer.runtime.acl.gears import Gear, GearKind, GearTable, gear_table
from streamer.runtime.base import DYNAMIC, ModelInfo, TensorInfo

__all__ = ["ModelDescription", "read_description"]

_ANY_INDEX = -1


@dataclass(frozen=True)
class ModelDescription:
    """What the backend needs to know about a loaded model.

    Attributes:
        info: the contract's view (data inputs only, shapes with ``-1``, gears).
        input_sizes: bytes of every model input in index order, gear tensor included.
        output_sizes: bytes of every output (largest gear).
        dynamic_index: index of ``ascend_mbatch_shape_data``, or None for a static model.
        gears: the dynamic kind and its gears.
        aipp_index: index of ``ascend_dynamic_aipp_data``, or None without dynamic AIPP.
    """

    info: ModelInfo
    input_sizes: tuple[int, ...]
    output_sizes: tuple[int, ...]
    dynamic_index: int | None
    gears: GearTable
    aipp_index: int | None = None

    @property
    def static(self) -> bool:
        """No gears and no dynamic dim: what queue mode (WithQ) requires."""
        tensors = (*self.info.inputs, *self.info.outputs)
        return self.dynamic_index is None and all(t.is_static for t in tensors)

    @property
    def data_input_indices(self) -> tuple[int, ...]:
        """Model input index of each ``info.inputs`` entry."""
        extra = (self.dynamic_index, self.aipp_index)
        return tuple(i for i in range(len(self.input_sizes)) if i not in extra)


def read_description(acl: Any, desc: int, name: str) -> ModelDescription:
    """Read a filled description.

    Args:
        acl: the pyACL module.
        desc: a handle filled by ``acl.mdl.get_desc``.
        name: the model (stage) name for :class:`ModelInfo`.

    Raises:
        AclError: a query failed.
        ModelError: a tensor has a data type without a numpy equivalent, or the gears are
            of two kinds or do not fit the inputs (:func:`~streamer.runtime.acl.gears.gear_table`).
    """
    mdl = acl.mdl
    dynamic_index = _index_by_name(acl, desc, ACL_DYNAMIC_TENSOR_NAME)
    aipp_index = _index_by_name(acl, desc, ACL_DYNAMIC_AIPP_NAME)
    n_inputs, n_outputs = mdl.get_num_inputs(desc), mdl.get_num_outputs(desc)
    inputs = tuple(
        _tensor(acl, desc, i, outputs=False)
        for i in range(n_inputs)
        if i not in (dynamic_index, aipp_index)
    )
    outputs = tuple(_tensor(acl, desc, i, outputs=True) for i in range(n_outputs))
    hw_gears, dims_gears = _hw_gears(acl, desc), _dims_gears(acl, desc)
    gears = gear_table(name, inputs, _batch_gears(acl, desc), hw_gears, dims_gears)
    info = ModelInfo(
        name,
        inputs,
        outputs,
        batch_gears=_info_batch_gears(gears),
        hw_gears=hw_gears,
        dims_gears=dims_gears,
    )
    return ModelDescription(
        info,
        tuple(int(mdl.get_input_size_by_index(desc, i)) for i in range(n_inputs)),
        tuple(int(mdl.get_output_size_by_index(desc, i)) for i in range(n_outputs)),
        dynamic_index,
        gears,
        aipp_index,
    )


def _index_by_name(acl: Any, desc: int, name: str) -> int | None:
    """The index of input ``name`` (``acl.mdl.get_input_index_by_name``), or None."""
    index, ret = acl.mdl.get_input_index_by_name(desc, name)
    return int(index) if ret == AclCode.SUCCESS else None


def _info_batch_gears(gears: GearTable) -> tuple[int, ...]:
    """``ModelInfo.batch_gears`` (module docstring)."""
    if gears.kind == GearKind.BATCH:
        return tuple(sorted(g[0] for g in gears.gears))
    static = _static_batch(gears.inputs)
    if static or gears.kind != GearKind.DIMS or not gears.inputs:
        return static
    return tuple(sorted({g[0] for g in gears.gears}))


def _tensor(acl: Any, desc: int, index: int, outputs: bool) -> TensorInfo:
    side = "output" if outputs else "input"
    dims, ret = getattr(acl.mdl, f"get_{side}_dims")(desc, index)
    check_ret(ret, f"acl.mdl.get_{side}_dims")
    name = getattr(acl.mdl, f"get_{side}_name_by_index")(desc, index)
    code = getattr(acl.mdl, f"get_{side}_data_type")(desc, index)
    try:
        dtype = DTYPES[DataType(code)]
    except ValueError:
        raise ModelError(
            f"{side} {name!r} has ACL data type {code} (no numpy equivalent)"
        ) from None
    shape = tuple(int(d) if d >= 0 else DYNAMIC for d in dims["dims"][: dims["dimCount"]])
    return TensorInfo(str(name), shape, dtype)


def _batch_gears(acl: Any, desc: int) -> tuple[int, ...]:
    batch, ret = acl.mdl.get_dynamic_batch(desc)
    check_ret(ret, "acl.mdl.get_dynamic_batch")
    return tuple(sorted(int(b) for b in batch["batch"][: batch["batchCount"]]))


def _static_batch(inputs: tuple[TensorInfo, ...]) -> tuple[int, ...]:
    first = inputs[0].shape[:1] if inputs else ()
    return first if first and first[0] != DYNAMIC else ()


def _hw_gears(acl: Any, desc: int) -> tuple[tuple[int, int], ...]:
    hw, ret = acl.mdl.get_dynamic_hw(desc, _ANY_INDEX)
    check_ret(ret, "acl.mdl.get_dynamic_hw")
    return tuple((int(h), int(w)) for h, w in hw["hw"][: hw["hwCount"]])


def _dims_gears(acl: Any, desc: int) -> tuple[Gear, ...]:
    count, ret = acl.mdl.get_input_dynamic_gear_count(desc, _ANY_INDEX)
    check_ret(ret, "acl.mdl.get_input_dynamic_gear_count")
    if not count:
        return ()
    gears, ret = acl.mdl.get_input_dynamic_dims(desc, _ANY_INDEX, count)
    check_ret(ret, "acl.mdl.get_input_dynamic_dims")
    return tuple(tuple(int(d) for d in gear["dims"][: gear["dimCount"]]) for gear in gears)

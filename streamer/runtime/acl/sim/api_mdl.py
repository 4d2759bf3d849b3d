"""The simulated ``acl.mdl`` and ``libascendcl.so``'s ``aclmdlLoadFromFileWithQ``
(pyACL formats from RT ``python/pyACL/mdl/mdl_wrap.cpp``)."""

from __future__ import annotations

import ctypes
from types import ModuleType
from typing import TYPE_CHECKING, Any

import numpy as np

from streamer.runtime.acl.constants import AclCode
from streamer.runtime.acl.sim.api_aipp import build_aipp
from streamer.runtime.acl.sim.binding import SimError
from streamer.runtime.acl.sim.cfunc import CFunction, SimLibrary
from streamer.runtime.acl.sim.image import DynamicKind, TensorDesc
from streamer.runtime.acl.sim.streams import TaskFault

if TYPE_CHECKING:
    from streamer.runtime.acl.sim.simulator import Simulator

__all__ = ["build_acl_library", "build_mdl"]

_MAX_GEAR_QUERY = 4096


def build_mdl(sim: Simulator, with_q: bool) -> ModuleType:
    """``acl.mdl``; ``load_from_file_with_q`` only when pyACL was built with ``USE_MDL``;
    the dynamic AIPP functions from :mod:`~streamer.runtime.acl.sim.api_aipp`."""
    mdl = ModuleType("acl.mdl")
    _loading(sim, mdl, with_q)
    _description(sim, mdl)
    _gears(sim, mdl)
    _datasets(sim, mdl)
    _execution(sim, mdl)
    build_aipp(sim, mdl)
    return mdl


def build_acl_library(sim: Simulator, with_q: bool) -> SimLibrary:
    """``libascendcl.so`` as ctypes sees it: exports ``aclmdlLoadFromFileWithQ`` if ``with_q``."""
    u32p = ctypes.POINTER(ctypes.c_uint32)

    def load_with_q(
        path: bytes, model_id: Any, inputs: Any, in_num: int, outputs: Any, out_num: int
    ) -> int:
        model_id.value = sim.load_with_q(
            path.decode(), _u32s(inputs, in_num), _u32s(outputs, out_num)
        )
        return 0

    argtypes = [ctypes.c_char_p, u32p, u32p, ctypes.c_size_t, u32p, ctypes.c_size_t]
    function = CFunction("aclmdlLoadFromFileWithQ", argtypes, ctypes.c_int, load_with_q, sim.binder)
    return SimLibrary("libascendcl.so", [function] if with_q else [])


def _u32s(values: Any, count: int) -> list[int]:
    if isinstance(values, ctypes.Array):
        return [int(v) for v in values[:count]]
    return [values.value] if count == 1 else []


def _loading(sim: Simulator, mdl: ModuleType, with_q: bool) -> None:
    export = sim.binder.export

    def load_from_file(path: str) -> tuple[int, int]:
        context = sim.devices.current()
        return sim.models.load(sim.models.image(path), context.handle, context.device).model_id, 0

    def load_from_file_with_q(
        path: str, inputs: int, in_num: int, outputs: int, out_num: int
    ) -> tuple[int, int]:
        return sim.load_with_q(
            path, _read_u32(sim, inputs, in_num), _read_u32(sim, outputs, out_num)
        ), 0

    def unload(model_id: int) -> int:
        model = sim.models.unload(model_id, sim.devices.current().handle)
        if model.queues is not None:
            sim.queues.unbind(model)
        return 0

    export(mdl, "acl.mdl.load_from_file", "s", "pair", load_from_file)
    if with_q:
        export(mdl, "acl.mdl.load_from_file_with_q", "skkkk", "pair", load_from_file_with_q)
    export(mdl, "acl.mdl.unload", "I", "ret", unload)


def _read_u32(sim: Simulator, ptr: int, count: int) -> list[int]:
    if count == 0:
        return []
    return [int(v) for v in np.frombuffer(sim.memory.read(ptr, 4 * count), np.uint32)]


def _description(sim: Simulator, mdl: ModuleType) -> None:
    export = sim.binder.export

    def get_desc(desc: int, model_id: int) -> int:
        sim.models.fill_desc(desc, sim.models.find(model_id))
        return 0

    def destroy_desc(desc: int) -> int:
        sim.models.destroy_desc(desc)
        return 0

    def index_by_name(desc: int, name: str) -> tuple[int, int]:
        names = [t.name for t in sim.models.desc(desc).inputs]
        if name not in names:
            raise SimError(AclCode.ERROR_INVALID_PARAM, None, f"no input {name!r}")
        return names.index(name), 0

    export(mdl, "acl.mdl.create_desc", "", "handle", sim.models.create_desc)
    export(mdl, "acl.mdl.get_desc", "kI", "ret", get_desc)
    export(mdl, "acl.mdl.destroy_desc", "k", "ret", destroy_desc)
    export(mdl, "acl.mdl.get_input_index_by_name", "ks", "pair", index_by_name)
    _tensor_queries(sim, mdl, "input")
    _tensor_queries(sim, mdl, "output")


def _tensor_queries(sim: Simulator, mdl: ModuleType, side: str) -> None:
    """``get_num_<side>s``, ``get_<side>_name_by_index``, ``_dims``, ``_data_type``,
    ``_size_by_index``: a bad description or index gives 0 / "" / -1 like the C API."""
    export = sim.binder.export

    def tensors(desc: int) -> tuple[TensorDesc, ...]:
        try:
            image = sim.models.desc(desc)
        except SimError:
            return ()
        return image.outputs if side == "output" else image.inputs

    def tensor(desc: int, index: int) -> TensorDesc | None:
        found = tensors(desc)
        return found[index] if index < len(found) else None

    def count(desc: int) -> int:
        return len(tensors(desc))

    def name(desc: int, index: int) -> str:
        found = tensor(desc, index)
        return found.name if found else ""

    def dims(desc: int, index: int) -> tuple[dict[str, Any], int]:
        found = tensor(desc, index)
        if found is None:
            raise SimError(AclCode.ERROR_INVALID_PARAM, None, f"no {side} {index}")
        return {"name": found.name, "dimCount": len(found.dims), "dims": list(found.dims)}, 0

    def data_type(desc: int, index: int) -> int:
        found = tensor(desc, index)
        return int(found.data_type) if found else -1

    def size(desc: int, index: int) -> int:
        found = tensor(desc, index)
        return found.size if found else 0

    export(mdl, f"acl.mdl.get_num_{side}s", "k", "value", count)
    export(mdl, f"acl.mdl.get_{side}_name_by_index", "kk", "value", name)
    export(mdl, f"acl.mdl.get_{side}_dims", "kk", "pair", dims)
    export(mdl, f"acl.mdl.get_{side}_data_type", "kk", "value", data_type)
    export(mdl, f"acl.mdl.get_{side}_size_by_index", "kk", "value", size)


def _gears(sim: Simulator, mdl: ModuleType) -> None:
    export = sim.binder.export

    def gears_of(desc: int, kind: DynamicKind) -> list[tuple[int, ...]]:
        image = sim.models.desc(desc)
        return list(image.gears) if image.kind == kind else []

    def get_dynamic_batch(desc: int) -> tuple[dict[str, Any], int]:
        batches = [gear[0] for gear in gears_of(desc, DynamicKind.BATCH)]
        return {"batchCount": len(batches), "batch": batches}, 0

    def get_dynamic_hw(desc: int, _index: int) -> tuple[dict[str, Any], int]:
        sizes = [list(gear) for gear in gears_of(desc, DynamicKind.HW)]
        return {"hwCount": len(sizes), "hw": sizes}, 0

    def gear_count(desc: int, _index: int) -> tuple[int, int]:
        return len(gears_of(desc, DynamicKind.DIMS)), 0

    def dynamic_dims(desc: int, _index: int, count: int) -> tuple[list[dict[str, Any]], int]:
        gears = gears_of(desc, DynamicKind.DIMS)
        if count > _MAX_GEAR_QUERY or count != len(gears):
            raise SimError(AclCode.ERROR_INVALID_PARAM, None, f"gear count {count}")
        return [{"name": "", "dimCount": len(g), "dims": list(g)} for g in gears], 0

    def set_batch(model_id: int, dataset: int, index: int, batch: int) -> int:
        model = sim.models.find(model_id)
        sim.models.set_gear(model, DynamicKind.BATCH, dataset, index, (batch,))
        return 0

    def set_hw(model_id: int, dataset: int, index: int, height: int, width: int) -> int:
        model = sim.models.find(model_id)
        sim.models.set_gear(model, DynamicKind.HW, dataset, index, (height, width))
        return 0

    def set_dims(model_id: int, dataset: int, index: int, dims: Any) -> int:
        values = _io_dims(dims)
        sim.models.set_gear(sim.models.find(model_id), DynamicKind.DIMS, dataset, index, values)
        return 0

    def cur_output_dims(desc: int, index: int) -> tuple[dict[str, Any], int]:
        name, dims = sim.models.cur_output_dims(desc, index)
        return {"name": name, "dimCount": len(dims), "dims": list(dims)}, 0

    export(mdl, "acl.mdl.get_dynamic_batch", "k", "pair", get_dynamic_batch)
    export(mdl, "acl.mdl.get_dynamic_hw", "kk", "pair", get_dynamic_hw)
    export(mdl, "acl.mdl.get_input_dynamic_gear_count", "kk", "pair", gear_count)
    export(mdl, "acl.mdl.get_input_dynamic_dims", "kkk", "pair", dynamic_dims)
    export(mdl, "acl.mdl.set_dynamic_batch_size", "IkkK", "ret", set_batch)
    export(mdl, "acl.mdl.set_dynamic_hw_size", "IkkKK", "ret", set_hw)
    export(mdl, "acl.mdl.set_input_dynamic_dims", "IkkO", "ret", set_dims)
    export(mdl, "acl.mdl.get_cur_output_dims", "kk", "pair", cur_output_dims)


def _io_dims(dims: Any) -> list[int]:
    """The values of an ``aclmdlIODims`` dict as pyACL reads it (RT ``mdl_wrap.cpp``
    ``WrapAclMdlSetInputDynamicDims``): a dict whose ``dims`` is a list, ``dimCount`` values.

    Raises:
        TypeError: not a dict, or ``dims`` is not a list (pyACL raises; no code returned).
    """
    if not isinstance(dims, dict):
        raise TypeError("argument 4 is not dict")
    values = dims.get("dims")
    if not isinstance(values, list):
        raise TypeError("The dims of parameter 4 is not a list.")
    count = dims.get("dimCount")
    if not isinstance(count, int):
        raise TypeError("acl.mdl.set_input_dynamic_dims args parse failed")
    return [int(v) for v in values[:count]]


def _datasets(sim: Simulator, mdl: ModuleType) -> None:
    export = sim.binder.export

    def add_dataset_buffer(dataset: int, buffer: int) -> tuple[int, int]:
        sim.models.add_to_dataset(dataset, buffer)
        return dataset, 0

    def destroy_dataset(dataset: int) -> int:
        sim.models.destroy_dataset(dataset)
        return 0

    export(mdl, "acl.mdl.create_dataset", "", "handle", sim.models.create_dataset)
    export(mdl, "acl.mdl.add_dataset_buffer", "kk", "pair", add_dataset_buffer)
    export(mdl, "acl.mdl.destroy_dataset", "k", "ret", destroy_dataset)


def _execution(sim: Simulator, mdl: ModuleType) -> None:
    export = sim.binder.export

    def execute(model_id: int, inputs: int, outputs: int) -> int:
        model = sim.models.get(model_id, sim.devices.current().handle)
        sim.models.check_io(model, inputs, outputs)
        with sim.models.executing(model):
            if sim.faults.execution_fails(model.device):
                raise SimError(AclCode.ERROR_GE_FAILURE, None, "injected execution failure")
            sim.models.run(model, sim.models.dataset(inputs), sim.models.dataset(outputs))
        return 0

    def execute_async(model_id: int, inputs: int, outputs: int, stream: int) -> int:
        model = sim.models.get(model_id, sim.devices.current().handle)
        target = sim.stream(stream)
        sim.models.check_io(model, inputs, outputs)
        in_buffers, out_buffers = sim.models.dataset(inputs), sim.models.dataset(outputs)
        if sim.faults.execution_fails(model.device):
            raise SimError(AclCode.ERROR_GE_FAILURE, None, "injected execution failure")
        sim.models.begin_async(model, stream)
        fails_on_device = sim.faults.task_fails()

        def task() -> None:
            try:
                if fails_on_device:
                    raise TaskFault(
                        AclCode.ERROR_RT_AICORE_EXCEPTION, None, "injected failure on the device"
                    )
                sim.models.run(model, in_buffers, out_buffers)
            finally:
                sim.models.end_async(model)

        target.submit(task, on_drop=lambda: sim.models.end_async(model))
        return 0

    export(mdl, "acl.mdl.execute", "Ikk", "ret", execute)
    export(mdl, "acl.mdl.execute_async", "Ikkk", "ret", execute_async)

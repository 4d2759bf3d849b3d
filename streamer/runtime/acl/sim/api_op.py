"""The simulated single-operator surface: ``acl.create_tensor_desc`` and its getters at the top
level, and ``acl.op`` (pyACL formats from RT ``python/pyACL/py_init_acl.cpp`` and
``python/pyACL/op/op.cpp``).

==================================== ========== =====================================
call                                 format     returns
==================================== ========== =====================================
``acl.create_tensor_desc``           ``iOi``    handle (dims: a list of int)
``acl.destroy_tensor_desc``          ``k``      None
``acl.get_tensor_desc_num_dims``     ``k``      rank, or ``ACL_UNKNOWN_RANK``
``acl.get_tensor_desc_dim_v2``       ``kk``     ``(dim, ret)``
``acl.get_tensor_desc_dim_range``    ``kkk``    ``([min, max, …], ret)``
``acl.get_tensor_desc_size``         ``k``      bytes (0 while a dim is unknown)
``acl.op.create_attr``               none       handle
``acl.op.destroy_attr``              ``k``      None
``acl.op.set_attr_bool/int/float``   ``ksB``,   ret
                                     ``ksL``,
                                     ``ksf``
``acl.op.infer_shape``               ``sOOiOk`` ret
``acl.op.execute_v2``                ``sOOOOkk`` ret
==================================== ========== =====================================

The list arguments must be lists of int handles (``ConvertPyListToPtrArray``); anything else
raises ``TypeError`` as pyACL does. The rules the calls enforce are in
:mod:`~streamer.runtime.acl.sim.single_ops` and :mod:`~streamer.runtime.acl.sim.op_handles`.
"""

from __future__ import annotations

from types import ModuleType
from typing import TYPE_CHECKING, Any

from streamer.runtime.acl.sim.single_ops import OpCall

if TYPE_CHECKING:
    from streamer.runtime.acl.sim.simulator import Simulator

__all__ = ["build_op", "build_tensor_desc"]


def _handles(api: str, value: Any) -> tuple[int, ...]:
    """A pyACL list of handles. Raises: TypeError: not a list of int."""
    if not isinstance(value, list) or not all(isinstance(v, int) for v in value):
        raise TypeError(f"{api} args parse failed")
    return tuple(value)


def build_tensor_desc(sim: Simulator, module: ModuleType) -> None:
    """The tensor description calls, on the top-level ``acl`` module."""
    export = sim.binder.export
    descs = sim.ops.descs

    def create(data_type: int, dims: Any, fmt: int) -> int:
        return descs.create(data_type, list(_handles("acl.create_tensor_desc", dims)), fmt)

    def destroy(desc: int) -> None:
        descs.destroy(desc)

    def dim_v2(desc: int, index: int) -> tuple[int, int]:
        return descs.get(desc).dim(index), 0

    def dim_range(desc: int, index: int, count: int) -> tuple[list[int], int]:
        return descs.get(desc).dim_range(index, count), 0

    export(module, "acl.create_tensor_desc", "iOi", "handle", create)
    export(module, "acl.destroy_tensor_desc", "k", "value", destroy)
    export(module, "acl.get_tensor_desc_num_dims", "k", "value", lambda d: descs.get(d).num_dims())
    export(module, "acl.get_tensor_desc_dim_v2", "kk", "pair", dim_v2)
    export(module, "acl.get_tensor_desc_dim_range", "kkk", "pair", dim_range)
    export(module, "acl.get_tensor_desc_size", "k", "value", lambda d: descs.get(d).nbytes())


def build_op(sim: Simulator) -> ModuleType:
    """``acl.op``: attributes, shape inference, execution."""
    op = ModuleType("acl.op")
    export = sim.binder.export
    attrs = sim.ops.attrs

    def setter(value_type: type) -> Any:
        def set_attr(attr: int, name: str, value: Any) -> int:
            attrs.set(attr, name, value_type(value))
            return 0

        return set_attr

    def destroy_attr(attr: int) -> None:
        attrs.destroy(attr)

    def infer_shape(
        op_type: str, in_descs: Any, inputs: Any, num_outputs: int, out_descs: Any, attr: int
    ) -> int:
        api = "acl.op.infer_shape"
        call = OpCall(
            op_type,
            _handles(api, in_descs),
            _handles(api, inputs),
            _handles(api, out_descs),
            (),
            attr,
        )
        sim.ops.infer_shape(call, num_outputs)
        return 0

    def execute_v2(
        op_type: str,
        in_descs: Any,
        inputs: Any,
        out_descs: Any,
        outputs: Any,
        attr: int,
        stream: int,
    ) -> int:
        api = "acl.op.execute_v2"
        call = OpCall(
            op_type,
            _handles(api, in_descs),
            _handles(api, inputs),
            _handles(api, out_descs),
            _handles(api, outputs),
            attr,
        )
        sim.ops.execute_v2(call, stream)
        return 0

    export(op, "acl.op.create_attr", "", "handle", attrs.create)
    export(op, "acl.op.destroy_attr", "k", "value", destroy_attr)
    export(op, "acl.op.set_attr_bool", "ksB", "ret", setter(bool))
    export(op, "acl.op.set_attr_int", "ksL", "ret", setter(int))
    export(op, "acl.op.set_attr_float", "ksf", "ret", setter(float))
    export(op, "acl.op.infer_shape", "sOOiOk", "ret", infer_shape)
    export(op, "acl.op.execute_v2", "sOOOOkk", "ret", execute_v2)
    return op

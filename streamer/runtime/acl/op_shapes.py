"""Tensor descriptions of single operators, and the output shapes to execute them with.

Dynamic-shape single operators (seeds "执行动态Shape算子示例代码"; RT ``python/docs/zh/
api_ref/ge/function-infer_shape.md``): before ``acl.op.execute_v2``, ``acl.op.infer_shape``
describes each output, and the dims to allocate and execute with are taken per output:

1. an exact dim: that dim;
2. ``-1``: the maximum of its range (``acl.get_tensor_desc_dim_range``); a range without a
   maximum (``[1, -1]``: any size) needs a configured maximum shape;
3. an unknown rank (``acl.get_tensor_desc_num_dims`` returns ``ACL_UNKNOWN_RANK``, the
   reserved scenario): the configured maximum shape.

After a synchronous execution (2 and 3) ``execute_v2`` has written the exact dims back into
the output descriptions; :func:`read_dims` reads them. An output larger than the configured
shape it was allocated for fails that execution with ``ACL_ERROR_OP_OUTPUT_NOT_MATCH`` (the
``acl.op.execute_v2`` page): the setting, not the device, is at fault (:class:`MaxShapeWrong`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

import numpy as np

from streamer.errors import ConfigError
from streamer.runtime.acl.constants import (
    ACL_FORMAT_ND,
    ACL_UNKNOWN_RANK,
    DTYPES,
    AclCode,
    DataType,
)
from streamer.runtime.acl.errors import AclError, check_handle, check_ret, code_name
from streamer.runtime.acl.teardown import Teardown

__all__ = [
    "MaxShapeMissing",
    "MaxShapeWrong",
    "OutputDims",
    "create_tensor_desc",
    "data_type",
    "execution_dims",
    "read_dims",
]

_DATA_TYPES = {dtype: data for data, dtype in DTYPES.items()}


class MaxShapeMissing(ConfigError):
    """An output's size is not bounded by shape inference and no maximum shape is configured
    (``[runtime.options] op_max_shapes``): a setting is missing."""


class MaxShapeWrong(ConfigError):
    """A configured maximum shape does not fit its output: of another rank than shape
    inference reports, or smaller than what the operator produced."""


class OutputDims(NamedTuple):
    """The dims to execute one output with, and whether its configured maximum shape gave
    any of them (so an execution that overflows them is the setting's fault)."""

    dims: tuple[int, ...]
    configured: bool


def data_type(dtype: np.dtype[Any]) -> DataType:
    """The ``aclDataType`` of a numpy dtype.

    Raises:
        ValueError: a dtype without an ``aclDataType``.
    """
    found = _DATA_TYPES.get(np.dtype(dtype))
    if found is None:
        raise ValueError(f"no aclDataType for {dtype}")
    return found


def create_tensor_desc(
    acl: Any, dtype: np.dtype[Any], dims: Sequence[int], teardown: Teardown
) -> int:
    """``acl.create_tensor_desc(data_type, dims, ACL_FORMAT_ND)``; its release goes on
    ``teardown``.

    Raises:
        AclError: a NULL handle.
    """
    desc = check_handle(
        acl.create_tensor_desc(int(data_type(dtype)), [int(d) for d in dims], ACL_FORMAT_ND),
        "acl.create_tensor_desc",
    )
    teardown.push_call(lambda: acl.destroy_tensor_desc(desc))
    return desc


def execution_dims(acl: Any, desc: int, max_shape: Sequence[int] | None) -> OutputDims:
    """The dims to execute an output with, from its inferred description (module docstring).

    Args:
        acl: the pyACL module.
        desc: the output description ``acl.op.infer_shape`` filled.
        max_shape: the configured maximum shape of this output, or None.

    Returns:
        Concrete dims, >= 0, and whether ``max_shape`` gave any of them.

    Raises:
        AclError: a getter failed.
        MaxShapeMissing: a rank or a dim is unbounded and ``max_shape`` is None.
        MaxShapeWrong: a dim is unbounded and ``max_shape`` has another rank than the output.
    """
    rank = int(acl.get_tensor_desc_num_dims(desc))
    if rank == ACL_UNKNOWN_RANK:
        if max_shape is None:
            raise MaxShapeMissing("the output rank is unknown")
        return OutputDims(tuple(int(d) for d in max_shape), configured=True)
    dims, configured = [], False
    for index in range(rank):
        dim, ret = acl.get_tensor_desc_dim_v2(desc, index)
        check_ret(ret, "acl.get_tensor_desc_dim_v2")
        if dim == -1:
            dim, from_max_shape = _range_max(acl, desc, index, rank, max_shape)
            configured = configured or from_max_shape
        dims.append(int(dim))
    return OutputDims(tuple(dims), configured)


def _range_max(
    acl: Any, desc: int, index: int, rank: int, max_shape: Sequence[int] | None
) -> tuple[int, bool]:
    """The maximum of dim ``index``'s range, or the configured one for an unbounded range;
    and whether it is the configured one."""
    dim_range, ret = acl.get_tensor_desc_dim_range(desc, index, 2)
    check_ret(ret, "acl.get_tensor_desc_dim_range")
    if dim_range[1] >= 0:
        return int(dim_range[1]), False
    if max_shape is None:
        raise MaxShapeMissing(f"dim {index} has the range {list(dim_range[:2])}")
    if len(max_shape) != rank:
        raise MaxShapeWrong(
            f"the maximum shape {list(max_shape)} has rank {len(max_shape)}, but the output "
            f"has rank {rank} (dim {index} has the range {list(dim_range[:2])})"
        )
    return int(max_shape[index]), True


def read_dims(acl: Any, desc: int) -> tuple[int, ...]:
    """The dims a description holds (after ``execute_v2``: the exact output dims).

    Raises:
        AclError: a getter failed, or the rank is still unknown.
    """
    rank = int(acl.get_tensor_desc_num_dims(desc))
    if rank == ACL_UNKNOWN_RANK:
        code = AclCode.ERROR_OP_OUTPUT_NOT_MATCH
        raise AclError(code, code_name(code), "acl.get_tensor_desc_num_dims (rank unknown)")
    dims = []
    for index in range(rank):
        dim, ret = acl.get_tensor_desc_dim_v2(desc, index)
        check_ret(ret, "acl.get_tensor_desc_dim_v2")
        dims.append(int(dim))
    return tuple(dims)

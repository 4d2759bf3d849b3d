"""Simulated ``aclTensorDesc`` and ``aclopAttr`` handles of single-operator execution.

A tensor description holds a data type, dims and a format (``acl.create_tensor_desc``, RT
``python/docs/zh/api_ref/ge/function-create_tensor_desc.md``); ``acl.op.infer_shape`` and
``acl.op.execute_v2`` write output dims, per-dim ranges or an unknown rank into the output
descriptions they are given. Rules of the getters (RT ``python/docs/zh/api_ref/ge/``
``function-get_tensor_desc_dim_v2.md``, ``function-get_tensor_desc_dim_range.md``):

- a dim of ``-1`` is dynamic; its range ``[min, max]`` comes from ``get_tensor_desc_dim_range``
  (``[1, -1]`` means any size);
- with an unknown rank, ``get_tensor_desc_num_dims`` returns ``ACL_UNKNOWN_RANK`` and neither
  ``get_tensor_desc_dim_v2`` nor ``get_tensor_desc_dim_range`` may be called
  (``ACL_ERROR_INVALID_PARAM`` here);
- ``dim_range_num`` must be at least 2 (and at most 4096: pyACL ``WrapAclGetTensorDescDimRange``).
"""

from __future__ import annotations

import itertools
import threading
from dataclasses import dataclass
from typing import Any

import numpy as np

from streamer.runtime.acl.constants import ACL_UNKNOWN_RANK, DTYPES, AclCode, DataType
from streamer.runtime.acl.sim.binding import SimError

__all__ = ["UNBOUNDED", "OpAttrs", "SimTensorDesc", "TensorDescs"]

UNBOUNDED = (1, -1)
"""The range ``get_tensor_desc_dim_range`` reports for a dim of any size."""

_MAX_DIM_RANGE_NUM = 4096


@dataclass(eq=False)
class SimTensorDesc:
    """One tensor description.

    Attributes:
        data_type: the ``aclDataType`` value it was created with.
        dims: dims, ``-1`` where dynamic; None for an unknown rank.
        ranges: per dim, ``(min, max)``; a static dim's range is ``(d, d)``.
        fmt: the ``aclFormat`` value.
    """

    data_type: int
    dims: tuple[int, ...] | None
    ranges: tuple[tuple[int, int], ...]
    fmt: int

    @property
    def dtype(self) -> np.dtype[Any] | None:
        """The numpy dtype of the data type, or None for one without a numpy equivalent."""
        try:
            return DTYPES[DataType(self.data_type)]
        except ValueError:
            return None

    @property
    def concrete(self) -> bool:
        """Every dim known (a rank, no ``-1``)."""
        return self.dims is not None and all(d >= 0 for d in self.dims)

    def nbytes(self) -> int:
        """Bytes of a tensor of these dims; 0 unless concrete with a known dtype."""
        dtype = self.dtype
        if not self.concrete or dtype is None:
            return 0
        assert self.dims is not None
        return int(np.prod(self.dims, dtype=np.int64)) * dtype.itemsize

    def set_dims(self, dims: tuple[int, ...] | None, ranges: tuple[tuple[int, int], ...]) -> None:
        """Overwrite dims and ranges (what infer_shape and execute_v2 write back)."""
        self.dims = dims
        self.ranges = ranges

    def num_dims(self) -> int:
        """``acl.get_tensor_desc_num_dims``: the rank, or ``ACL_UNKNOWN_RANK``."""
        return ACL_UNKNOWN_RANK if self.dims is None else len(self.dims)

    def dim(self, index: int) -> int:
        """``acl.get_tensor_desc_dim_v2``.

        Raises:
            SimError: unknown rank, or ``index`` past the rank (``ACL_ERROR_INVALID_PARAM``).
        """
        self._check_index(index)
        assert self.dims is not None
        return self.dims[index]

    def dim_range(self, index: int, count: int) -> list[int]:
        """``acl.get_tensor_desc_dim_range``: ``count`` values, the first two ``[min, max]``.

        Raises:
            SimError: unknown rank, ``index`` past the rank, or ``count`` not in 2..4096.
        """
        if not 2 <= count <= _MAX_DIM_RANGE_NUM:
            raise SimError(AclCode.ERROR_INVALID_PARAM, "O2", f"dim_range_num {count} < 2")
        self._check_index(index)
        low, high = self.ranges[index]
        return [low, high] + [0] * (count - 2)

    def _check_index(self, index: int) -> None:
        if self.dims is None:
            raise SimError(AclCode.ERROR_INVALID_PARAM, "O2", "the rank is unknown")
        if index >= len(self.dims):
            raise SimError(AclCode.ERROR_INVALID_PARAM, None, f"no dim {index}")


def _static_ranges(dims: tuple[int, ...]) -> tuple[tuple[int, int], ...]:
    """The ranges of dims as created: ``(d, d)``, or :data:`UNBOUNDED` for a ``-1``."""
    return tuple(UNBOUNDED if d < 0 else (d, d) for d in dims)


class TensorDescs:
    """The live tensor descriptions; thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._handles = itertools.count(0x7D00_0000_0080, 0x80)
        self._descs: dict[int, SimTensorDesc] = {}

    def create(self, data_type: int, dims: list[int], fmt: int) -> int:
        """``acl.create_tensor_desc``: a new handle (dims ``-1`` stand for dynamic dims)."""
        shape = tuple(int(d) for d in dims)
        desc = SimTensorDesc(data_type, shape, _static_ranges(shape), fmt)
        with self._lock:
            handle = next(self._handles)
            self._descs[handle] = desc
        return handle

    def get(self, handle: int) -> SimTensorDesc:
        """Raises: SimError: no such description (``ACL_ERROR_INVALID_PARAM``)."""
        with self._lock:
            desc = self._descs.get(handle)
        if desc is None:
            raise SimError(AclCode.ERROR_INVALID_PARAM, None, f"no tensor desc {handle:#x}")
        return desc

    def destroy(self, handle: int) -> None:
        """``acl.destroy_tensor_desc``. Raises: SimError: no such description."""
        with self._lock:
            if self._descs.pop(handle, None) is None:
                raise SimError(AclCode.ERROR_INVALID_PARAM, "free", f"no tensor desc {handle:#x}")

    def live(self) -> list[int]:
        """Handles not destroyed yet."""
        with self._lock:
            return list(self._descs)


class OpAttrs:
    """The live operator attribute sets (``acl.op.create_attr``); thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._handles = itertools.count(0x7E00_0000_0040, 0x40)
        self._attrs: dict[int, dict[str, bool | int | float]] = {}

    def create(self) -> int:
        """``acl.op.create_attr``: a new, empty attribute set."""
        with self._lock:
            handle = next(self._handles)
            self._attrs[handle] = {}
        return handle

    def set(self, handle: int, name: str, value: bool | int | float) -> None:
        """``acl.op.set_attr_bool`` / ``_int`` / ``_float``.

        Raises:
            SimError: no such attribute set (``ACL_ERROR_INVALID_PARAM``).
        """
        with self._lock:
            attrs = self._attrs.get(handle)
            if attrs is None:
                raise SimError(AclCode.ERROR_INVALID_PARAM, None, f"no op attr {handle:#x}")
            attrs[name] = value

    def get(self, handle: int) -> dict[str, bool | int | float]:
        """A copy of the set's values; handle 0 (NULL) is an empty set.

        Raises:
            SimError: no such attribute set.
        """
        if handle == 0:
            return {}
        with self._lock:
            attrs = self._attrs.get(handle)
            if attrs is None:
                raise SimError(AclCode.ERROR_INVALID_PARAM, None, f"no op attr {handle:#x}")
            return dict(attrs)

    def destroy(self, handle: int) -> None:
        """``acl.op.destroy_attr``. Raises: SimError: no such attribute set."""
        with self._lock:
            if self._attrs.pop(handle, None) is None:
                raise SimError(AclCode.ERROR_INVALID_PARAM, "free", f"no op attr {handle:#x}")

    def live(self) -> list[int]:
        """Handles not destroyed yet."""
        with self._lock:
            return list(self._attrs)

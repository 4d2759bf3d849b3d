"""How an operator reads a tensor operand: a host array, or a model output left in device
memory (:class:`~streamer.runtime.base.DeviceTensor`), read in place with other dims.

An operand may be read with a ``shape`` of its own: its first ``prod(shape)`` elements in C
order, taken as that shape. A batch-first output holds its frames one after the other, so the
``n`` real frames of a BlazeFace logits output ``(B, N, 1)`` are read as ``(n, N)``, and the
regressor rows of those frames, ``(B, N, 16)``, as ``(n * N, 16)``; on a device this is only
another tensor description over the same memory, nothing moves.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from streamer.runtime.base import Tensor

__all__ = ["host_view", "view_shape"]


def view_shape(x: Tensor, shape: Sequence[int] | None) -> tuple[int, ...]:
    """The dims an operator reads ``x`` with: ``shape``, or ``x``'s own when None.

    Raises:
        ValueError: a negative dim, or more elements than ``x`` holds.
    """
    if shape is None:
        return tuple(int(d) for d in x.shape)
    dims = tuple(int(d) for d in shape)
    held = int(np.prod(x.shape, dtype=np.int64))
    if any(d < 0 for d in dims) or int(np.prod(dims, dtype=np.int64)) > held:
        raise ValueError(f"cannot read {list(x.shape)} as {list(dims)}")
    return dims


def host_view(x: Tensor, dims: Sequence[int]) -> np.ndarray:
    """``x``'s first ``prod(dims)`` elements as a C-contiguous array of ``dims`` (no copy when
    ``x`` is C-contiguous).

    Raises:
        ValueError: ``x`` is not a host array (operators without device memory, onnxruntime's,
            take host arrays only).
    """
    if not isinstance(x, np.ndarray):
        raise ValueError(f"these operators read host arrays, got {type(x).__name__}")
    size = int(np.prod(dims, dtype=np.int64))
    return np.ascontiguousarray(x).reshape(-1)[:size].reshape(tuple(dims))

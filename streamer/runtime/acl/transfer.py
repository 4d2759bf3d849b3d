"""Moving tensors between numpy and ACL memory, by run mode.

The application's own memory (a ``bytes`` behind ``acl.util.bytes_to_ptr``) is host memory
under ``ACL_HOST`` and device-side memory under ``ACL_DEVICE``, so uploads use
``ACL_MEMCPY_HOST_TO_DEVICE`` or ``ACL_MEMCPY_DEVICE_TO_DEVICE`` as the samples do (SAM
``python/common/acllite/acllite_model.py``). Under ``ACL_HOST`` device memory is read by
copying it into host memory first (``ACL_MEMCPY_DEVICE_TO_HOST``); under ``ACL_DEVICE`` it is
read in place. ``acl.util.ptr_to_bytes`` copies (RT ``python/pyACL/util/bytes_convert.cpp``).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from streamer.runtime.acl.constants import MemcpyKind, RunMode
from streamer.runtime.acl.errors import check_ret

__all__ = ["Transfer", "to_array"]


class Transfer:
    """Copies for one run mode; call with the model's context current.

    Args:
        acl: the pyACL module.
        run_mode: from ``acl.rt.get_run_mode``.
    """

    def __init__(self, acl: Any, run_mode: RunMode) -> None:
        self._acl = acl
        self._host = run_mode == RunMode.HOST
        self._upload_kind = MemcpyKind.HOST_TO_DEVICE if self._host else MemcpyKind.DEVICE_TO_DEVICE

    def upload(self, dst: int, dst_size: int, array: np.ndarray) -> None:
        """Copy ``array`` (C order) to device memory ``dst`` of ``dst_size`` bytes.

        Raises:
            AclError: ``acl.rt.memcpy`` failed (e.g. the array is larger than ``dst_size``).
        """
        data = np.ascontiguousarray(array).tobytes()
        src = self._acl.util.bytes_to_ptr(data)
        ret = self._acl.rt.memcpy(dst, dst_size, src, len(data), self._upload_kind)
        check_ret(ret, "acl.rt.memcpy")

    def download(
        self, src: int, shape: tuple[int, ...], dtype: np.dtype[Any], staging: int | None
    ) -> np.ndarray:
        """Read an output of ``shape`` and ``dtype`` from device memory ``src``.

        Args:
            src: device address of the output.
            shape: its dims as executed (batch first), all known.
            dtype: its element type.
            staging: host memory of at least that many bytes, needed under ``ACL_HOST``.

        Returns:
            A writable array of ``shape`` and ``dtype``.

        Raises:
            AclError: ``acl.rt.memcpy`` failed (e.g. ``shape`` is larger than the buffer).
        """
        nbytes = _nbytes(shape, dtype)
        if self._host:
            assert staging is not None, "ACL_HOST needs a host staging buffer"
            ret = self._acl.rt.memcpy(staging, nbytes, src, nbytes, MemcpyKind.DEVICE_TO_HOST)
            check_ret(ret, "acl.rt.memcpy")
            src = staging
        return to_array(self._acl.util.ptr_to_bytes(src, nbytes), shape, dtype)


def to_array(data: bytes, shape: tuple[int, ...], dtype: np.dtype[Any]) -> np.ndarray:
    """A writable array of ``shape`` and ``dtype`` over a copy of ``data`` (C order)."""
    return np.frombuffer(bytearray(data), dtype=dtype).reshape(shape)


def _nbytes(shape: tuple[int, ...], dtype: np.dtype[Any]) -> int:
    """Bytes of a C-order array of ``shape`` and ``dtype``."""
    return int(np.prod(shape, dtype=np.int64)) * dtype.itemsize

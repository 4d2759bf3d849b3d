"""One dynamic-shape single-operator execution through pyACL, shape inference first.

The flow of the seeds page "执行动态Shape算子示例代码" (pyACL: RT ``python/docs/zh/api_ref/
ge/function-infer_shape.md``, ``function-execute_v2-1.md``)::

    create_tensor_desc (inputs)   malloc + memcpy (inputs to device memory)   create_attr
    acl.op.infer_shape            inputs in host memory under ACL_HOST, device memory under
                                  ACL_DEVICE (the infer_shape page)
    execution dims per output     op_shapes.execution_dims: inferred dim, range maximum, or
                                  the configured maximum shape
    malloc (outputs, that size)   create_tensor_desc (outputs, those dims)
    acl.op.execute_v2             on the calling thread's stream
    acl.rt.synchronize_stream     outputs valid (execute_v2 is asynchronous when the dims
                                  were exact)
    read_dims (exact dims)        copy only those bytes to the host

Everything is allocated for one call and released after it (every exit path, newest first).
An empty tensor still gets 1 byte of memory (``acl.create_tensor_desc`` page: "内存大小最小为
1Byte").

An input given as a :class:`DeviceOperand` (a model output left in device memory) is neither
allocated nor uploaded: a data buffer over its memory goes to ``execute_v2``, and its
description may read it with other dims than the model's. ``infer_shape`` reads input *values*
only where the op's output shape depends on them (TopKV2's ``k``, GatherV2's ``axis``,
NonMaxSuppressionV6's ``max_output_size``); every other input is described by its tensor
description alone, and its data is a null pointer (``OpInferShapeContextBuilder::InputTensors``,
HA ``CANNCommunityEdition/900/maintenref/basicdataapi/atlasopapi_07_00616``: "对于非数据依赖
算子，Tensor的TensorData需要设置为空指针"). So under ``ACL_HOST``, where ``infer_shape``
reads host memory, a device operand goes to it as a data buffer over no memory
(``acl.create_data_buffer(0, 0)``, which the ``create_data_buffer`` page allows) instead of a
copy to the host.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from streamer.runtime.acl.constants import AclCode, MallocPolicy, RunMode
from streamer.runtime.acl.errors import AclError, check_handle, check_ret, code_name
from streamer.runtime.acl.op_shapes import (
    MaxShapeWrong,
    OutputDims,
    create_tensor_desc,
    execution_dims,
    read_dims,
)
from streamer.runtime.acl.teardown import Teardown
from streamer.runtime.acl.transfer import Transfer

__all__ = ["DeviceOperand", "OpRequest", "SingleOpRunner"]

_SIZE_T_MAX = 2**64 - 1
"""The largest size ``acl.rt.malloc`` takes (a ``size_t``)."""

AttrValue = bool | int | float


@dataclass(frozen=True)
class DeviceOperand:
    """An op input already in device memory of the calling thread's device, read in place.

    Attributes:
        ptr: its device address.
        shape: the dims to read it with: its first ``prod(shape)`` elements, C order.
        dtype: its element type (with an ``aclDataType``).
    """

    ptr: int
    shape: tuple[int, ...]
    dtype: np.dtype[Any]

    @property
    def nbytes(self) -> int:
        return _nbytes(self.shape, self.dtype)


Operand = np.ndarray | DeviceOperand
"""One op input: a host array (uploaded for the call) or device memory (read in place)."""


@dataclass(frozen=True)
class OpRequest:
    """One operator call.

    Attributes:
        op_type: the Ascend IR op type, e.g. ``NonMaxSuppressionV6``.
        inputs: in the op's input order, C-contiguous host arrays or device operands
            (their dtypes must have an ``aclDataType``).
        output_dtypes: the numpy dtype of each output.
        attrs: attribute name → value (bool, int or float; set with ``set_attr_bool``,
            ``set_attr_int``, ``set_attr_float``).
        max_shapes: per output, the configured maximum shape, or empty.
    """

    op_type: str
    inputs: tuple[Operand, ...]
    output_dtypes: tuple[np.dtype[Any], ...]
    attrs: Mapping[str, AttrValue] = field(default_factory=dict)
    max_shapes: tuple[tuple[int, ...], ...] = ()


class SingleOpRunner:
    """Executes :class:`OpRequest` objects; thread-safe (each call owns its resources).

    Args:
        acl: the pyACL module.
        run_mode: ``ACL_HOST`` or ``ACL_DEVICE`` (where infer_shape reads its inputs, how
            data is copied).
    """

    def __init__(self, acl: Any, run_mode: RunMode) -> None:
        self._acl = acl
        self._host = run_mode == RunMode.HOST
        self._transfer = Transfer(acl, run_mode)

    def run(self, request: OpRequest, stream: int) -> list[np.ndarray]:
        """Execute ``request`` on ``stream`` (of the calling thread's current context).

        Returns:
            One array per output, of its dtype and exact dims.

        Raises:
            AclError: a call failed.
            MaxShapeMissing: an output is unbounded and has no configured maximum shape.
            MaxShapeWrong: a configured maximum shape does not fit its output.
        """
        teardown = Teardown()
        with teardown.on_error():
            outputs = self._run(request, stream, teardown)
        teardown.close()
        return outputs

    def _run(self, request: OpRequest, stream: int, teardown: Teardown) -> list[np.ndarray]:
        acl = self._acl
        in_descs = [create_tensor_desc(acl, a.dtype, a.shape, teardown) for a in request.inputs]
        in_buffers = [self._device_input(a, teardown) for a in request.inputs]
        attr = self._attr(request.attrs, teardown)
        outputs = self._infer(request, in_descs, in_buffers, attr, teardown)
        out_descs = [
            create_tensor_desc(acl, dtype, output.dims, teardown)
            for dtype, output in zip(request.output_dtypes, outputs, strict=True)
        ]
        out_buffers = [
            self._output_buffer(output, dtype, teardown)
            for output, dtype in zip(outputs, request.output_dtypes, strict=True)
        ]
        ret = acl.op.execute_v2(
            request.op_type,
            in_descs,
            [b for b, _ in in_buffers],
            out_descs,
            [b for b, _ in out_buffers],
            attr,
            stream,
        )
        _check_fit(ret, outputs)
        check_ret(ret, "acl.op.execute_v2")
        check_ret(acl.rt.synchronize_stream(stream), "acl.rt.synchronize_stream")
        return [
            self._download(ptr, desc, dtype, teardown)
            for (_, ptr), desc, dtype in zip(
                out_buffers, out_descs, request.output_dtypes, strict=True
            )
        ]

    def _infer(
        self,
        request: OpRequest,
        in_descs: list[int],
        in_buffers: list[tuple[int, int]],
        attr: int,
        teardown: Teardown,
    ) -> list[OutputDims]:
        """``acl.op.infer_shape``, then the dims to execute each output with."""
        acl = self._acl
        infer_descs = [create_tensor_desc(acl, d, [-1], teardown) for d in request.output_dtypes]
        buffers, host_data = self._infer_inputs(request.inputs, in_buffers, teardown)
        ret = acl.op.infer_shape(
            request.op_type, in_descs, buffers, len(infer_descs), infer_descs, attr
        )
        del host_data  # the memory behind the host buffers, alive until infer_shape returned
        check_ret(ret, "acl.op.infer_shape")
        return [
            execution_dims(acl, desc, _max_shape(request.max_shapes, index))
            for index, desc in enumerate(infer_descs)
        ]

    def _device_input(self, array: Operand, teardown: Teardown) -> tuple[int, int]:
        """A data buffer over device memory holding ``array``: ``(buffer, address)``; a
        device operand's own memory, or fresh memory it is uploaded to."""
        if isinstance(array, DeviceOperand):
            return self._data_buffer(array.ptr, max(array.nbytes, 1), teardown), array.ptr
        buffer, ptr = self._device_output(array.nbytes, teardown)
        if array.nbytes:
            self._transfer.upload(ptr, array.nbytes, array)
        return buffer, ptr

    def _output_buffer(
        self, output: OutputDims, dtype: np.dtype[Any], teardown: Teardown
    ) -> tuple[int, int]:
        """:meth:`_device_output` for one output's dims.

        Raises:
            MaxShapeWrong: the dims came (in part) from the configured maximum shape, and
                the device cannot allocate that much memory: the setting is at fault.
            AclError: the allocation failed otherwise.
        """
        nbytes = _nbytes(output.dims, dtype)
        if output.configured and nbytes > _SIZE_T_MAX:
            raise _too_large(output, nbytes, "more than a size_t holds")
        try:
            return self._device_output(nbytes, teardown)
        except AclError as exc:
            if exc.code != AclCode.ERROR_BAD_ALLOC or not output.configured:
                raise
            why = f"more than the device can allocate ({exc.name})"
            raise _too_large(output, nbytes, why) from exc

    def _device_output(self, nbytes: int, teardown: Teardown) -> tuple[int, int]:
        """A data buffer over ``nbytes`` (at least 1) of fresh device memory."""
        size = max(nbytes, 1)
        ptr, ret = self._acl.rt.malloc(size, MallocPolicy.NORMAL_ONLY)
        check_ret(ret, f"acl.rt.malloc of {size} bytes")
        teardown.push("acl.rt.free", self._acl.rt.free, ptr)
        return self._data_buffer(ptr, size, teardown), ptr

    def _data_buffer(self, ptr: int, size: int, teardown: Teardown) -> int:
        buffer = check_handle(self._acl.create_data_buffer(ptr, size), "acl.create_data_buffer")
        teardown.push("acl.destroy_data_buffer", self._acl.destroy_data_buffer, buffer)
        return buffer

    def _infer_inputs(
        self,
        arrays: Sequence[Operand],
        device: Sequence[tuple[int, int]],
        teardown: Teardown,
    ) -> tuple[list[int], list[bytes]]:
        """Data buffers for infer_shape, and the ``bytes`` behind them (the caller keeps them
        alive until infer_shape returned): the application's own memory under ``ACL_HOST``
        (a device operand: a buffer over no memory, module docstring), the device memory
        under ``ACL_DEVICE``."""
        if not self._host:
            return [buffer for buffer, _ in device], []
        buffers, kept = [], []
        for array in arrays:
            if isinstance(array, DeviceOperand):
                buffers.append(self._data_buffer(0, 0, teardown))
                continue
            data = np.ascontiguousarray(array).tobytes() or b"\0"
            kept.append(data)
            ptr = self._acl.util.bytes_to_ptr(data)
            buffers.append(self._data_buffer(ptr, len(data), teardown))
        return buffers, kept

    def _attr(self, attrs: Mapping[str, AttrValue], teardown: Teardown) -> int:
        """An ``aclopAttr`` with ``attrs`` set; its release goes on ``teardown``."""
        acl = self._acl
        attr = check_handle(acl.op.create_attr(), "acl.op.create_attr")
        teardown.push_call(lambda: acl.op.destroy_attr(attr))
        for name, value in attrs.items():
            if isinstance(value, bool):
                api, setter = "acl.op.set_attr_bool", acl.op.set_attr_bool
            elif isinstance(value, int):
                api, setter = "acl.op.set_attr_int", acl.op.set_attr_int
            else:
                api, setter = "acl.op.set_attr_float", acl.op.set_attr_float
            check_ret(setter(attr, name, value), api)
        return attr

    def _download(
        self, ptr: int, desc: int, dtype: np.dtype[Any], teardown: Teardown
    ) -> np.ndarray:
        """The output's exact dims, and only those bytes copied to the host."""
        dims = read_dims(self._acl, desc)
        nbytes = _nbytes(dims, dtype)
        if nbytes == 0:
            return np.zeros(dims, dtype)
        staging = None
        if self._host:
            staging, ret = self._acl.rt.malloc_host(nbytes)
            check_ret(ret, "acl.rt.malloc_host")
            teardown.push("acl.rt.free_host", self._acl.rt.free_host, staging)
        return self._transfer.download(ptr, dims, np.dtype(dtype), staging)


def _check_fit(ret: int, outputs: Sequence[OutputDims]) -> None:
    """Raises: MaxShapeWrong: ``execute_v2`` returned ``ACL_ERROR_OP_OUTPUT_NOT_MATCH`` for
    outputs allocated (in part) from their configured maximum shapes: an output did not
    fit them."""
    configured = [list(o.dims) for o in outputs if o.configured]
    if ret == AclCode.ERROR_OP_OUTPUT_NOT_MATCH and configured:
        raise MaxShapeWrong(
            f"an output does not fit the maximum shapes {configured} it was allocated for "
            f"(acl.op.execute_v2: {code_name(ret)} ({ret})): give each output its rank and "
            "a bound no output of the operator exceeds"
        )


def _too_large(output: OutputDims, nbytes: int, why: str) -> MaxShapeWrong:
    return MaxShapeWrong(
        f"the maximum shape {list(output.dims)} needs {nbytes} bytes of device memory, {why}: "
        "give a bound no output exceeds by much"
    )


def _max_shape(max_shapes: Sequence[tuple[int, ...]], index: int) -> tuple[int, ...] | None:
    return max_shapes[index] if index < len(max_shapes) else None


def _nbytes(dims: Sequence[int], dtype: np.dtype[Any]) -> int:
    """Bytes of a C-order array of ``dims``, exact (a configured bound may pass 2**63)."""
    return math.prod(dims) * np.dtype(dtype).itemsize

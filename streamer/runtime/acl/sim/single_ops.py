"""Simulated single-operator execution: ``acl.op.infer_shape`` and ``acl.op.execute_v2``.

Rules (seeds "执行动态Shape算子示例代码"; RT ``python/docs/zh/api_ref/ge/function-infer_shape.md``
and ``function-execute_v2-1.md``, the ``acl.op.execute_v2`` page; codes RT
``include/external/acl/acl_base_rt.h``):

    O1: ``infer_shape``: an unknown op type is ``ACL_ERROR_OP_NOT_FOUND``; ``out_desc_list``
        must hold ``num_outputs`` descriptions and ``in_desc_list`` one per entry of
        ``in_list`` (``ACL_ERROR_INVALID_PARAM``); inputs and outputs must fit the op's
        signature (``ACL_ERROR_OP_INPUT_NOT_MATCH`` / ``..._OUTPUT_NOT_MATCH``). The input data
        must be in host memory when the application runs on the host (``ACL_HOST``) and in
        device memory when it runs on the device; device memory under ``ACL_HOST`` is
        ``ACL_ERROR_INVALID_PARAM``.
    O2: inference writes into each output description either the exact dims, or ``-1`` for
        a dim only known to lie in a range (read with ``get_tensor_desc_dim_range``), or an
        unknown rank (the reserved scenario; ``[runtime.options.sim] unknown_rank_ops``).
    O3: ``execute_v2`` needs a current context (``ACL_ERROR_RT_CONTEXT_NULL``) and a stream of
        that context's device (``ACL_ERROR_RT_PARAM_INVALID``); stream 0 is the default
        stream, executed in the calling thread.
    O4: every input description is concrete and its data buffer holds at least its bytes
        (``ACL_ERROR_OP_INPUT_NOT_MATCH``); under ``ACL_HOST`` inputs and outputs must be
        device memory of the context's device (``ACL_ERROR_INVALID_PARAM``).
    O5: every output description is concrete, of the op's data type, and its buffer holds its
        bytes; an output the op produces larger than its description (in any dim) fails
        (``ACL_ERROR_OP_OUTPUT_NOT_MATCH``), a code returned without a broken rule: the
        output's size depends on the data.
    O6: when every output description holds the exact inferred dims, ``execute_v2`` is
        asynchronous: the op runs on the stream and its outputs are valid after
        ``synchronize_stream`` (a failure is returned there). Otherwise (dims from a range
        maximum or an estimate) it is synchronous: it waits for the stream, runs, and writes
        the exact output dims back into the output descriptions.
    O7: attributes the op does not have, or values the simulator does not implement, are
        ``ACL_ERROR_OP_ATTR_NOT_MATCH``.
    O8: input values the op's proto rules out fail the execution (GatherV2's indices out of
        range; :mod:`~streamer.runtime.acl.sim.op_kernels`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from streamer.errors import FrameError
from streamer.runtime.acl.constants import AclCode, RunMode
from streamer.runtime.acl.sim.binding import SimError
from streamer.runtime.acl.sim.devices import SimDevices
from streamer.runtime.acl.sim.memory import MemoryKind, SimMemory
from streamer.runtime.acl.sim.models import Buffer, SimModels
from streamer.runtime.acl.sim.op_handles import OpAttrs, SimTensorDesc, TensorDescs
from streamer.runtime.acl.sim.op_kernels import KERNELS, Inferred, OpKernel
from streamer.runtime.acl.sim.streams import SimStream
from streamer.runtime.ops.onnx_ops import OnnxOperators

__all__ = ["OpCall", "SimSingleOps"]


@dataclass(frozen=True)
class OpCall:
    """The handles of one ``infer_shape`` / ``execute_v2`` call.

    Attributes:
        op_type: the op type name.
        in_descs, in_buffers: input descriptions and data buffers, in the op's order.
        out_descs: output descriptions.
        out_buffers: output data buffers (``execute_v2`` only).
        attr: the ``aclopAttr`` handle, 0 for none.
    """

    op_type: str
    in_descs: tuple[int, ...]
    in_buffers: tuple[int, ...]
    out_descs: tuple[int, ...]
    out_buffers: tuple[int, ...]
    attr: int


@dataclass
class _Resolved:
    kernel: OpKernel
    inputs: list[tuple[SimTensorDesc, Buffer]]
    outputs: list[SimTensorDesc]


class SimSingleOps:
    """Tensor descriptions, attributes and the two single-operator calls; thread-safe.

    Args:
        memory: where data buffers point.
        models: owner of the data buffers.
        devices: the calling thread's context.
        stream: looks a stream handle up (raises ``SimError`` for an unknown one).
        run_mode: ``ACL_HOST`` or ``ACL_DEVICE``.
        unknown_rank_ops: op types whose inference reports an unknown rank (O2).
    """

    def __init__(
        self,
        memory: SimMemory,
        models: SimModels,
        devices: SimDevices,
        stream: Callable[[int], SimStream],
        run_mode: RunMode,
        unknown_rank_ops: Sequence[str],
    ) -> None:
        self.descs = TensorDescs()
        self.attrs = OpAttrs()
        self._memory = memory
        self._models = models
        self._devices = devices
        self._stream = stream
        self._host = run_mode == RunMode.HOST
        self._unknown_rank = frozenset(unknown_rank_ops)
        onnx_ops = OnnxOperators()
        self._kernels = {name: kernel(onnx_ops) for name, kernel in KERNELS.items()}

    def infer_shape(self, call: OpCall, num_outputs: int) -> None:
        """``acl.op.infer_shape`` (O1, O2): fill the output descriptions.

        Raises:
            SimError: a broken rule (module docstring).
        """
        if len(call.out_descs) != num_outputs:
            raise SimError(
                AclCode.ERROR_INVALID_PARAM,
                "O1",
                f"{len(call.out_descs)} output descs for num_outputs {num_outputs}",
            )
        found = self._resolve(call, "O1")
        for desc, buffer in found.inputs:
            if not desc.concrete:
                raise SimError(AclCode.ERROR_OP_INPUT_NOT_MATCH, "O1", "an input desc is dynamic")
            self._check_infer_memory(buffer, desc.nbytes())
        inferred = self._infer(found, call.op_type)
        for desc, result in zip(found.outputs, inferred, strict=True):
            desc.set_dims(result.dims, result.ranges)

    def execute_v2(self, call: OpCall, stream: int) -> None:
        """``acl.op.execute_v2`` (O3-O7).

        Raises:
            SimError: a broken rule (module docstring), or a failed synchronous execution.
        """
        target = self._target_stream(stream)
        if len(call.out_buffers) != len(call.out_descs):
            raise SimError(AclCode.ERROR_INVALID_PARAM, "O5", "one output buffer per output desc")
        found = self._resolve(call, "O4")
        for desc, buffer in found.inputs:
            self._check_execute_memory(desc, buffer, AclCode.ERROR_OP_INPUT_NOT_MATCH, "O4")
        out_buffers = [self._models.buffer(h) for h in call.out_buffers]
        for desc, buffer in zip(found.outputs, out_buffers, strict=True):
            self._check_execute_memory(desc, buffer, AclCode.ERROR_OP_OUTPUT_NOT_MATCH, "O5")
        inferred = self._kernel_infer(found)
        exact = all(
            r.exact and r.dims == d.dims for r, d in zip(inferred, found.outputs, strict=True)
        )
        task = _Task(found, out_buffers, self._memory, write_dims=not exact)
        if exact and target is not None:
            target.submit(task.run)
            return
        if target is not None and (ret := target.synchronize(-1)) != 0:
            raise SimError(ret, None, "an earlier task of the stream failed")
        task.run()

    def live(self) -> dict[str, list[int]]:
        """Tensor descriptions and attribute sets not destroyed yet."""
        return {"tensor_descs": self.descs.live(), "op_attrs": self.attrs.live()}

    def _target_stream(self, stream: int) -> SimStream | None:
        """O3: the stream to run on (None: the default stream, run in the caller)."""
        context = self._devices.current()
        if stream == 0:
            return None
        target = self._stream(stream)
        if target.device != context.device:
            raise SimError(
                AclCode.ERROR_RT_PARAM_INVALID,
                "O3",
                f"stream of device {target.device}, context on device {context.device}",
            )
        return target

    def _resolve(self, call: OpCall, rule: str) -> _Resolved:
        """The kernel and the descriptions, checked against the op's signature (O1, O7)."""
        kernel = self._kernels.get(call.op_type)
        if kernel is None:
            raise SimError(AclCode.ERROR_OP_NOT_FOUND, "O1", f"no op type {call.op_type!r}")
        if len(call.in_descs) != len(call.in_buffers):
            raise SimError(AclCode.ERROR_INVALID_PARAM, rule, "one input buffer per input desc")
        if len(call.in_descs) != len(kernel.inputs):
            raise SimError(
                AclCode.ERROR_OP_INPUT_NOT_MATCH,
                rule,
                f"{call.op_type} takes {len(kernel.inputs)} inputs, got {len(call.in_descs)}",
            )
        if len(call.out_descs) != len(kernel.outputs):
            raise SimError(
                AclCode.ERROR_OP_OUTPUT_NOT_MATCH,
                rule,
                f"{call.op_type} has {len(kernel.outputs)} outputs, got {len(call.out_descs)}",
            )
        inputs = [
            (self.descs.get(d), self._models.buffer(b))
            for d, b in zip(call.in_descs, call.in_buffers, strict=True)
        ]
        outputs = [self.descs.get(d) for d in call.out_descs]
        _check_types(kernel, [d for d, _ in inputs], outputs, rule)
        kernel.check_attrs(self.attrs.get(call.attr))
        return _Resolved(kernel, inputs, outputs)

    def _infer(self, found: _Resolved, op_type: str) -> list[Inferred]:
        if op_type in self._unknown_rank:
            return [Inferred(None, ())] * len(found.outputs)
        return self._kernel_infer(found)

    def _kernel_infer(self, found: _Resolved) -> list[Inferred]:
        """The kernel's inference from the input dims and the values it reads."""
        kernel = found.kernel
        shapes = [desc.dims or () for desc, _ in found.inputs]
        values = [
            self._value(desc, buffer) if index in kernel.value_inputs else None
            for index, (desc, buffer) in enumerate(found.inputs)
        ]
        return kernel.infer(shapes, values)

    def _value(self, desc: SimTensorDesc, buffer: Buffer) -> np.ndarray | None:
        """The input's value, or None for a NULL buffer (inference without the value)."""
        if buffer.ptr == 0:
            return None
        dtype = desc.dtype
        assert dtype is not None and desc.dims is not None
        data = self._memory.read(buffer.ptr, desc.nbytes())
        return np.frombuffer(data, dtype).reshape(desc.dims)

    def _check_infer_memory(self, buffer: Buffer, nbytes: int) -> None:
        """O1: a non-NULL buffer holds the bytes, in memory the application process can read."""
        if buffer.ptr == 0:
            return
        if buffer.size < nbytes:
            raise SimError(
                AclCode.ERROR_OP_INPUT_NOT_MATCH, "O1", f"buffer of {buffer.size} for {nbytes}"
            )
        kind, _ = self._memory.owner(buffer.ptr, max(nbytes, 1))
        if self._host and kind == MemoryKind.DEVICE:
            raise SimError(
                AclCode.ERROR_INVALID_PARAM,
                "O1",
                "infer_shape reads its inputs from host memory under ACL_HOST, got device memory",
            )

    def _check_execute_memory(
        self, desc: SimTensorDesc, buffer: Buffer, code: int, rule: str
    ) -> None:
        """O4/O5: a concrete description whose buffer holds its bytes in device memory."""
        if not desc.concrete:
            raise SimError(code, rule, f"desc dims {desc.dims} are not concrete")
        nbytes = desc.nbytes()
        if buffer.size < nbytes:
            raise SimError(code, rule, f"buffer of {buffer.size} bytes for a {nbytes}-byte desc")
        if nbytes == 0 or not self._host:
            return
        kind, device = self._memory.owner(buffer.ptr, nbytes)
        context = self._devices.current()
        if kind != MemoryKind.DEVICE or device != context.device:
            raise SimError(
                AclCode.ERROR_INVALID_PARAM,
                "O4",
                f"execute_v2 takes device memory of device {context.device}, got {kind.value}",
            )


def _check_types(
    kernel: OpKernel, inputs: Sequence[SimTensorDesc], outputs: Sequence[SimTensorDesc], rule: str
) -> None:
    """Raises: SimError: a description's data type is not the op's (O1 / O4 / O5)."""
    for index, (desc, expected) in enumerate(zip(inputs, kernel.inputs, strict=True)):
        if desc.data_type != expected:
            raise SimError(
                AclCode.ERROR_OP_INPUT_NOT_MATCH,
                rule,
                f"{kernel.op_type} input {index}: data type {desc.data_type}, takes {expected}",
            )
    for index, (desc, expected) in enumerate(zip(outputs, kernel.outputs, strict=True)):
        if desc.data_type != expected:
            raise SimError(
                AclCode.ERROR_OP_OUTPUT_NOT_MATCH,
                rule,
                f"{kernel.op_type} output {index}: data type {desc.data_type}, gives {expected}",
            )


class _Task:
    """One execution: read the inputs, run the kernel, check and write the outputs (O5, O6)."""

    def __init__(
        self,
        found: _Resolved,
        out_buffers: Sequence[Buffer],
        memory: SimMemory,
        write_dims: bool,
    ) -> None:
        self._found = found
        self._out_buffers = list(out_buffers)
        self._memory = memory
        self._write_dims = write_dims

    def run(self) -> None:
        """Raises: SimError: bad memory, a failed kernel, or an output larger than its desc."""
        arrays = [self._read(desc, buffer) for desc, buffer in self._found.inputs]
        try:
            results = self._found.kernel.run(arrays)
        except FrameError as exc:
            raise SimError(AclCode.ERROR_GE_FAILURE, None, str(exc)) from exc
        for desc, buffer, result in zip(
            self._found.outputs, self._out_buffers, results, strict=True
        ):
            _check_fits(desc, result)
            self._memory.write(buffer.ptr, np.ascontiguousarray(result).tobytes())
            if self._write_dims:
                desc.set_dims(result.shape, tuple((d, d) for d in result.shape))

    def _read(self, desc: SimTensorDesc, buffer: Buffer) -> np.ndarray[Any, Any]:
        dtype = desc.dtype
        assert dtype is not None and desc.dims is not None
        data = self._memory.read(buffer.ptr, desc.nbytes()) if desc.nbytes() else b""
        return np.frombuffer(data, dtype).reshape(desc.dims)


def _check_fits(desc: SimTensorDesc, result: np.ndarray) -> None:
    """Raises: SimError: ``result`` has another rank or a larger dim than ``desc`` (O5). The
    code is returned, not counted as a broken rule: what an op produces depends on its data,
    so no caller can foresee it where shape inference gave no exact dims (a range maximum, or
    a configured shape for an unknown rank)."""
    dims = desc.dims or ()
    if len(dims) != result.ndim or any(r > d for r, d in zip(result.shape, dims, strict=True)):
        raise SimError(
            AclCode.ERROR_OP_OUTPUT_NOT_MATCH,
            None,
            f"the op produced {list(result.shape)}, the output desc holds {list(dims)}",
        )

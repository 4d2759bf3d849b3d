"""The operators on ACL: ``acl.op`` single-operator execution, shape inference first.

===================  ==========================  ==========================================
operator             Ascend IR op type           inputs (aclDataType)
===================  ==========================  ==========================================
:meth:`nms`          ``NonMaxSuppressionV6``     boxes FLOAT [B, N, 4], scores FLOAT
                                                 [B, C, N], max_output_size INT32 [1],
                                                 iou_threshold FLOAT [1], score_threshold
                                                 FLOAT [1]; attr ``center_point_box = 0``;
                                                 → selected_indices INT32 [K, 3]
:meth:`top_k`        ``TopKV2``                  x FLOAT [..., N], k INT32 [] ; attrs
                                                 ``sorted``, ``largest``, ``dim = -1``;
                                                 → values FLOAT, indices INT32 [..., k]
:meth:`gather_rows`  ``GatherV2``                x FLOAT [R, ...], indices INT32 [M], axis
                                                 INT32 [] = 0 ; → y FLOAT [M, ...]
===================  ==========================  ==========================================

Signatures: the ``REG_OP`` prototypes of the CANN operator library (``NonMaxSuppressionV6`` is
its ONNX-compatible NMS; ``GatherV2`` its TensorFlow-compatible gather, ``batch_dims = 0``).
The ``x`` of :meth:`top_k` and :meth:`gather_rows` may be a model output left in device
memory (:class:`~streamer.runtime.acl.device_tensor.AclDeviceTensor`, of the device whose
context is current): the op reads it in place, through a tensor description of the dims
asked for, and only the op's outputs are copied to the host
(:class:`~streamer.runtime.acl.single_op.DeviceOperand`). Each call runs through
:class:`~streamer.runtime.acl.single_op.SingleOpRunner`: ``NonMaxSuppressionV6``'s output count
is only known as a range by shape inference, so its output is allocated for the range maximum
and only the exact rows are copied back; ``TopKV2``'s and ``GatherV2``'s dims are exact from
inference. ``[runtime.options.op_max_shapes]``, the maximum shapes for outputs inference
leaves unbounded, are checked against the outputs above when the options are read
(:func:`check_max_shapes`).

Threads and streams: ``acl.op.execute_v2`` must not be given one stream from several threads,
nor the default stream (``acl.op.execute_v2`` page, constraints), so every calling thread gets
its own stream, created in its current context on first use (a dequeue thread has its model's
context current). A stream outlives its thread until the next stream is created, which first
destroys, each in its own context, the streams of threads that have ended: every reload starts
new dequeue threads, and streams are a bounded device resource (``aclrtCreateStream`` fails once
a device's are used up), so keeping them to the close leaked two or more a reload.
:meth:`AclOperators.close` destroys the rest.

On a real device the three operators must be available to ``execute_v2``: built into the
operator library's dynamic-shape kernels or compiled beforehand (ATC ``--singleop``).
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import structlog

from streamer.errors import BackendError, ConfigError, FrameError, Reason
from streamer.runtime.acl.constants import RunMode
from streamer.runtime.acl.device import DeviceContext
from streamer.runtime.acl.device_tensor import AclDeviceTensor
from streamer.runtime.acl.errors import AclError, check_ret
from streamer.runtime.acl.op_shapes import MaxShapeMissing, MaxShapeWrong
from streamer.runtime.acl.single_op import DeviceOperand, Operand, OpRequest, SingleOpRunner
from streamer.runtime.acl.teardown import Teardown
from streamer.runtime.base import Tensor
from streamer.runtime.ops.base import (
    NO_SCORE_THRESHOLD,
    Operators,
    check_gather_inputs,
    check_nms_inputs,
    check_top_k_inputs,
)
from streamer.runtime.ops.self_test import check_operators
from streamer.runtime.ops.views import host_view, view_shape

__all__ = ["GATHER_OP", "NMS_OP", "TOP_K_OP", "AclOperators", "check_max_shapes"]

NMS_OP = "NonMaxSuppressionV6"
TOP_K_OP = "TopKV2"
GATHER_OP = "GatherV2"
_OUTPUTS = {NMS_OP: ("selected_indices",), TOP_K_OP: ("values", "indices"), GATHER_OP: ("y",)}
"""Each operator's outputs, in order (module docstring table)."""
_NMS_ROW = 3
"""Dims of a ``selected_indices`` row: (batch, class, box)."""
_INT32_MAX = 2**31 - 1
_log = structlog.get_logger(__name__)


def check_max_shapes(max_shapes: Mapping[str, Sequence[Sequence[int]]]) -> None:
    """Check ``[runtime.options.op_max_shapes]`` against the operators' outputs (module
    docstring table): an op type they run, one maximum shape per output, each with at least
    one dim; ``NonMaxSuppressionV6``'s of rank 2 with 3 columns (``[K, 3]``); ``TopKV2``'s
    two of one rank (values and indices are both ``[..., k]``).

    Raises:
        ConfigError: the first op type whose shapes are wrong; the message names
            ``runtime.options.op_max_shapes.<op type>`` and says what is wrong.
    """
    for op_type, shapes in max_shapes.items():
        problem = _max_shapes_problem(op_type, [list(s) for s in shapes])
        if problem is not None:
            raise ConfigError(f"runtime.options.op_max_shapes.{op_type}: {problem}")


def _max_shapes_problem(op_type: str, shapes: list[list[int]]) -> str | None:
    outputs = _OUTPUTS.get(op_type)
    if outputs is None:
        return f"not an operator of the ACL backend (it runs {', '.join(sorted(_OUTPUTS))})"
    if len(shapes) != len(outputs):
        return (
            f"one maximum shape per output, {len(outputs)} ({', '.join(outputs)}), "
            f"got {len(shapes)}: {shapes}"
        )
    if not all(shapes):
        return f"every output has at least one dim, got {shapes}"
    if op_type == NMS_OP and (len(shapes[0]) != 2 or shapes[0][1] != _NMS_ROW):
        return f"selected_indices is [K, {_NMS_ROW}] (batch, class, box), got {shapes[0]}"
    if op_type == TOP_K_OP and len(shapes[0]) != len(shapes[1]):
        return f"values and indices are both [..., k], of one rank, got {shapes}"
    return None


class AclOperators(Operators):
    """NMS and top-k as ACL single operators.

    Args:
        acl: the pyACL module.
        run_mode: ``ACL_HOST`` or ``ACL_DEVICE``.
        max_shapes: op type → per output the maximum shape to allocate where shape
            inference gives no bound (``[runtime.options] op_max_shapes``).
        devices: the opened devices, where :meth:`verify` runs the operators.
    """

    name = "acl"

    def __init__(
        self,
        acl: Any,
        run_mode: RunMode,
        max_shapes: Mapping[str, Sequence[Sequence[int]]],
        devices: Sequence[DeviceContext] = (),
    ) -> None:
        self._acl = acl
        self._devices = tuple(devices)
        self._runner = SingleOpRunner(acl, run_mode)
        self._max_shapes = {
            op: tuple(tuple(s) for s in shapes) for op, shapes in max_shapes.items()
        }
        self._local = threading.local()
        self._lock = threading.Lock()
        self._streams: list[_ThreadStream] = []
        self._unreleased: list[_ThreadStream] = []  # a destroy failed; tried again at close
        self._closed = False

    def nms(
        self,
        boxes: np.ndarray,
        scores: np.ndarray,
        max_output_boxes_per_class: int,
        iou_threshold: float,
        score_threshold: float = NO_SCORE_THRESHOLD,
    ) -> np.ndarray:
        check_nms_inputs(boxes, scores, max_output_boxes_per_class)
        inputs = (
            np.ascontiguousarray(boxes),
            np.ascontiguousarray(scores),
            np.array([min(max_output_boxes_per_class, _INT32_MAX)], np.int32),
            np.array([iou_threshold], np.float32),
            np.array([score_threshold], np.float32),
        )
        (selected,) = self._execute(NMS_OP, inputs, (np.dtype(np.int32),), {"center_point_box": 0})
        return selected.astype(np.int64).reshape(-1, 3)

    def top_k(
        self, x: Tensor, k: int, shape: Sequence[int] | None = None
    ) -> tuple[np.ndarray, np.ndarray]:
        dims = view_shape(x, shape)
        check_top_k_inputs(x.dtype, dims, k)
        inputs = (_operand(x, dims), np.array(k, np.int32))
        attrs = {"sorted": True, "largest": True, "dim": -1}
        values, indices = self._execute(
            TOP_K_OP, inputs, (np.dtype(np.float32), np.dtype(np.int32)), attrs
        )
        return values, indices.astype(np.int64)

    def gather_rows(
        self, x: Tensor, rows: np.ndarray, shape: Sequence[int] | None = None
    ) -> np.ndarray:
        dims = view_shape(x, shape)
        check_gather_inputs(x.dtype, dims, rows)
        inputs = (_operand(x, dims), rows.astype(np.int32), np.array(0, np.int32))
        (gathered,) = self._execute(GATHER_OP, inputs, (np.dtype(np.float32),), {})
        return gathered

    def _check_each_place(self) -> None:
        """Run the check on every device, in its context (the operators run in the dequeue
        threads of models on all of them); the calling thread's context is current again
        afterwards.

        Raises:
            ConfigError: an operator cannot run for want of a setting (the message names the
                device and the setting).
            BackendError: an operator cannot run on a device (the message names it).
            AclError: a context could not be made current.
        """
        previous, ret = self._acl.rt.get_context()
        try:
            for device in self._devices:
                device.activate()
                try:
                    check_operators(self)
                except ConfigError as exc:
                    raise ConfigError(f"device {device.device_id}: {exc}") from exc
                except BackendError as exc:
                    raise BackendError(f"device {device.device_id}: {exc}") from exc
        finally:
            if ret == 0:
                check_ret(self._acl.rt.set_context(previous), "acl.rt.set_context")

    def close(self) -> None:
        """Destroy every stream made for a thread, each in its own context. Idempotent.

        Raises:
            AclError: a release failed (all of them are attempted).
        """
        with self._lock:
            if self._closed:
                return
            self._closed = True
            streams, self._streams = [*self._unreleased, *self._streams], []
            self._unreleased = []
        teardown = Teardown()
        for entry in streams:
            teardown.push("acl.rt.destroy_stream", self._acl.rt.destroy_stream, entry.stream)
            teardown.push("acl.rt.set_context", self._acl.rt.set_context, entry.context)
        teardown.close()

    def _execute(
        self,
        op_type: str,
        inputs: tuple[Operand, ...],
        output_dtypes: tuple[np.dtype[Any], ...],
        attrs: Mapping[str, bool | int | float],
    ) -> list[np.ndarray]:
        """Run one op on the calling thread's stream.

        Raises:
            FrameError: ``postprocess_failed``: an ACL call failed, or an output has no bound
                or does not fit its configured one.
        """
        request = OpRequest(
            op_type, inputs, output_dtypes, attrs, self._max_shapes.get(op_type, ())
        )
        try:
            return self._runner.run(request, self._stream())
        except AclError as exc:
            raise FrameError(Reason.POSTPROCESS_FAILED, f"operator {op_type}: {exc}") from exc
        except MaxShapeMissing as exc:
            raise FrameError(
                Reason.POSTPROCESS_FAILED,
                f"operator {op_type}: {exc}; set runtime.options.op_max_shapes.{op_type}",
            ) from exc
        except MaxShapeWrong as exc:
            raise FrameError(
                Reason.POSTPROCESS_FAILED,
                f"operator {op_type}: runtime.options.op_max_shapes.{op_type}: {exc}",
            ) from exc

    def _stream(self) -> int:
        """The calling thread's stream in its current context, created on first use.

        Raises:
            AclError: no current context, or the stream cannot be created.
            FrameError: the operators are closed.
        """
        context, ret = self._acl.rt.get_context()
        check_ret(ret, "acl.rt.get_context")
        streams: dict[int, int] = self._local.__dict__.setdefault("streams", {})
        stream = streams.get(context)
        if stream is not None:
            return stream
        with self._lock:
            if self._closed:
                raise FrameError(Reason.POSTPROCESS_FAILED, "the ACL operators are closed")
            self._release_ended(context)
            stream, ret = self._acl.rt.create_stream()
            check_ret(ret, "acl.rt.create_stream")
            owner = weakref.ref(threading.current_thread())
            self._streams.append(_ThreadStream(owner, int(context), int(stream)))
        streams[context] = int(stream)
        _log.info("acl_operator_stream_created", thread=threading.current_thread().name)
        return int(stream)

    def _release_ended(self, context: int) -> None:
        """Destroy the streams of threads that have ended, each in its own context, then make
        ``context`` (the calling thread's) current again. A stream that cannot be destroyed is
        logged and tried again at :meth:`close`. Called with the lock held.

        Raises:
            AclError: ``context`` could not be made current again.
        """
        ended = [entry for entry in self._streams if not entry.owner_alive()]
        if not ended:
            return
        self._streams = [entry for entry in self._streams if entry.owner_alive()]
        released = 0
        for entry in ended:
            try:
                check_ret(self._acl.rt.set_context(entry.context), "acl.rt.set_context")
                check_ret(self._acl.rt.destroy_stream(entry.stream), "acl.rt.destroy_stream")
                released += 1
            except AclError as exc:
                self._unreleased.append(entry)
                _log.error("acl_operator_stream_release_failed", error=str(exc))
        _log.info("acl_operator_streams_released", streams=released, of_ended_threads=len(ended))
        check_ret(self._acl.rt.set_context(context), "acl.rt.set_context")


@dataclass(frozen=True)
class _ThreadStream:
    """A stream made for one thread, in ``context``."""

    owner: weakref.ref[threading.Thread]
    context: int
    stream: int

    def owner_alive(self) -> bool:
        thread = self.owner()
        return thread is not None and thread.is_alive()


def _operand(x: Tensor, dims: tuple[int, ...]) -> Operand:
    """``x`` read as ``dims``: a device tensor of this backend in place, a host array as is
    (uploaded for the call).

    Raises:
        ValueError: a device tensor of another backend.
    """
    if isinstance(x, AclDeviceTensor):
        return DeviceOperand(x.ptr, dims, x.dtype)
    return host_view(x, dims)

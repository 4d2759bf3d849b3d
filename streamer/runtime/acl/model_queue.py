"""Queue mode: a model bound to tdt queues (``aclmdlLoadFromFileWithQ``); static shapes only.

(HA ``…/appdevg/acldevg/aclcppdevg_000035.html``; seeds "队列方式模型推理".) The enqueue
thread puts each input into its queue with ``acltdtEnqueueData`` (ACL runs the model when every
input queue has an item: no execute call); the dequeue thread takes each output from its
queue with ``acltdtDequeueData`` into memory allocated once per output, sized by
``get_output_size_by_index`` (host memory under ``ACL_HOST``, device memory under
``ACL_DEVICE``, as the official sample does). All enqueues come from one thread and all
dequeues from one other thread (same page).

Queue full / empty (or the driver's wait timeout) are backpressure: the enqueue retries every
``queue_poll_ms`` until there is room, the dequeue returns None when ``timeout_ms`` passes.

One batch is in flight at a time, whatever ``max_in_flight`` says. A tdt queue carries only
bytes (the docs do not say that an input's user data reaches the outputs), so an output can
be told apart from the next batch's only by order; with two batches in flight, an execution
that failed on the device without stopping the model would shift every later output onto
the wrong batch (one camera's detections published on another's frames), undetected while
traffic never pauses. With one in flight, a batch whose output does not come within
``result_timeout_ms`` makes the model raise :class:`~streamer.errors.OutputLostError`, and
nothing can be misattributed. Replicas (each with its own queues) keep the device busy meanwhile.

Recovery. After a lost output the model cannot go on as it is: a late output of the lost
batch would be taken for the next batch's. :meth:`QueueModeModel.reload` puts it in the one
state where no later output can be misattributed: the model unloaded, its queues destroyed,
new queues (of new names) created and the model loaded again bound to them
(:mod:`~streamer.runtime.acl.queue_binding`); the output memory is kept. The unload waits
for the model's executions, so it runs as a close's releases do: on a thread of its own,
for at most ``result_timeout_ms``, past which the device is marked hung (where the unload
holds the GIL, as pyACL's does, the wait cannot end early: a hung execution then stops the
process until the watchdog ends it). The caller keeps the enqueue thread out of the model
meanwhile.

Chains (the ``tensor`` adapter; :mod:`~streamer.runtime.acl.device_tensor`). Nothing in the
seeds' multi-model chaining page ("多模型串联推理": load each model, execute each model) nor in
the ``aclmdlLoadFromFileWithQ`` or tdt queue pages says that one queue may be bound to two
models, as the output of one and the input of the next (the simulator refuses a queue bound
twice), and handing the runtime's mbuf from queue to queue (``acltdtEnqueue`` /
``acltdtDequeue`` with an ``acltdtBuf``) is unsupported on every listed product (S29). So a
model loaded with ``device_outputs`` relays: its dequeue thread takes each output with
``acltdtDequeueData`` into device memory (the call accepts host or device memory) from a pool
of ``max_in_flight`` sets of segments, and the next model's enqueue thread puts it into its
own input queue with ``acltdtEnqueueData`` straight from there (which copies it into the
queue), then releases it. The bytes move from queue to device memory to queue on the device,
never through the host. ``acltdtBindQueueRoutes`` forwards a queue into others inside the
runtime, but then no host thread sees the batch between the models, and the pipeline matches
each output to its frames by the order it enqueued them.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from streamer.errors import (
    BackendError,
    EnqueueInterruptedError,
    FrameError,
    ModelError,
    OutputLostError,
)
from streamer.runtime.acl.allocators import DeviceAllocator, readable_allocator
from streamer.runtime.acl.constants import RunMode
from streamer.runtime.acl.device_tensor import AclDeviceTensor, HandedOut
from streamer.runtime.acl.errors import QUEUE_WAIT_CODES, AclError, check_ret
from streamer.runtime.acl.loaded import LoadedModel
from streamer.runtime.acl.model_base import (
    AclModel,
    ModelParts,
    batch_problem,
    device_problem,
    inference_error,
)
from streamer.runtime.acl.pool import BlockAllocator, MemoryPool, Segment, footprint
from streamer.runtime.acl.queue_binding import QueueBinding
from streamer.runtime.acl.tdt import TdtQueueApi
from streamer.runtime.acl.transfer import to_array
from streamer.runtime.base import InferenceOutputs, Tensor, release_inputs

__all__ = ["QueueModeModel"]

_POLL_S = 0.05


@dataclass(frozen=True)
class _Ticket:
    """The ledger entry of one enqueued batch: when, and its error if it never ran."""

    start_ns: int
    error: FrameError | None = None


class QueueModeModel(AclModel):
    """Feeds and drains a queue-bound model.

    Args:
        parts: as :class:`AclModel`.
        max_in_flight: sets of device output memory handed to the next model at most
            (chains); one batch is in flight at a time (module docstring).
        tdt: the queue API.
        binding: the model and its queues, bound (``parts.loaded`` is its model), released
            by ``parts.teardown`` and replaced by :meth:`reload`.

    Raises:
        AclError: the output memory could not be allocated.
    """

    mode = "queue"

    def __init__(
        self,
        parts: ModelParts,
        max_in_flight: int,
        tdt: TdtQueueApi,
        binding: QueueBinding,
    ) -> None:
        super().__init__(parts)
        acl, device, loaded, teardown = parts.acl, parts.device, parts.loaded, parts.teardown
        self._tdt = tdt
        self._binding = binding
        self._inputs, self._outputs = binding.queues
        self._sizes = loaded.description.output_sizes
        self._device_outputs = parts.device_outputs
        self._handed = HandedOut()
        if self._device_outputs:  # a set of device segments per batch, held downstream
            allocator: BlockAllocator = DeviceAllocator(acl)
            self._pool = MemoryPool(allocator, footprint(self._sizes), max_in_flight)
            self._buffers: list[Segment] = []
        else:  # one set of buffers, read back after each batch
            allocator = readable_allocator(acl, device.run_mode)
            self._pool = MemoryPool(allocator, footprint(self._sizes))
            segments = self._pool.try_alloc(self._sizes)
            assert segments is not None, "a pool sized by footprint() holds its segments"
            self._buffers = segments
        teardown.push_call(self._pool.close)
        self._min_timeout_ms = 1 if device.run_mode == RunMode.HOST else 0
        self._slots = threading.Semaphore(1)
        self._tickets: deque[_Ticket] = deque()
        self._received: list[int] = []

    def enqueue(self, inputs: Sequence[Tensor]) -> None:
        """Put one batch into the input queues, waiting while they are full; a device input
        (the previous model's output) is enqueued from its device memory, then released.

        Raises:
            AclError: a queue call failed with something other than full.
            EnqueueInterruptedError: the model was closed or interrupted before it took the
                whole batch (before or while waiting); the inputs are not released.
        """
        kept = False
        try:
            self._enqueue(inputs)
        except EnqueueInterruptedError:
            kept = True
            raise
        finally:
            if not kept:
                release_inputs(inputs)

    def _enqueue(self, inputs: Sequence[Tensor]) -> None:
        problem = batch_problem(self.info, inputs) or device_problem(
            self.info, self.device_id, inputs
        )
        if problem is not None:
            self._tickets.append(_Ticket(time.monotonic_ns(), inference_error(problem)))
            return
        self._raise_if_interrupted()
        while not self._slots.acquire(timeout=_POLL_S):
            self._raise_if_interrupted()
        # The result timeout counts from here: the wait for the slot is the previous batch's.
        start_ns = time.monotonic_ns()
        for qid, tensor in zip(self._inputs, inputs, strict=True):
            if isinstance(tensor, AclDeviceTensor):
                self._send(qid, tensor.ptr, _nbytes(tensor))
            else:
                data = np.ascontiguousarray(tensor).tobytes()
                self._send(qid, self._acl.util.bytes_to_ptr(data), len(data))
        self._tickets.append(_Ticket(start_ns))

    def dequeue(self, timeout_ms: int) -> InferenceOutputs | None:
        """The oldest batch's outputs, or None when they did not all arrive in ``timeout_ms``.

        Raises:
            AclError: a queue call failed with something other than empty.
            OutputLostError: the oldest batch got no output within ``result_timeout_ms``;
                that batch is given up, and the model takes none until :meth:`reload`.
        """
        if self._tickets and self._tickets[0].error is not None:
            ticket = self._tickets.popleft()
            return InferenceOutputs(None, ticket.error, ticket.start_ns, time.monotonic_ns())
        if not self._receive(time.monotonic() + timeout_ms / 1000):
            return None
        received, self._received = self._received, []
        if not self._tickets:
            raise BackendError(f"model {self.info.name!r}: an output arrived for no batch")
        ticket = self._tickets.popleft()
        self._slots.release()
        return self._result(ticket, received)

    def _send(self, qid: int, ptr: int, size: int) -> None:
        """``acltdtEnqueueData`` of ``size`` bytes at ``ptr`` (it copies them into the queue),
        retrying while the queue is full."""
        while True:
            ret = self._tdt.enqueue(qid, ptr, size, self._options.queue_poll_ms)
            if ret not in QUEUE_WAIT_CODES:
                check_ret(ret, "acltdtEnqueueData")
                return
            self._raise_if_interrupted()

    def _receive(self, deadline: float) -> bool:
        """Dequeue the outputs still missing; False when ``deadline`` passed first."""
        if not self._buffers and not self._take_buffers(deadline):
            return False
        while len(self._received) < len(self._outputs):
            index = len(self._received)
            buffer = self._buffers[index]
            remaining_ms = int((deadline - time.monotonic()) * 1000)
            timeout_ms = max(min(remaining_ms, self._options.queue_poll_ms), self._min_timeout_ms)
            ret, size = self._tdt.dequeue(
                self._outputs[index], buffer.ptr, buffer.nbytes, timeout_ms
            )
            if ret in QUEUE_WAIT_CODES:
                self._raise_if_lost()
                if remaining_ms <= 0:
                    return False
                continue
            check_ret(ret, "acltdtDequeueData")
            self._received.append(size)
        return True

    def _take_buffers(self, deadline: float) -> bool:
        """Device outputs: device segments for the next batch's outputs, waiting until
        ``deadline`` while the next model still holds all of them; False if it passed."""
        while (segments := self._pool.try_alloc(self._sizes)) is None:
            self._raise_if_closed()
            if time.monotonic() >= deadline:
                return False
            time.sleep(_POLL_S)
        self._buffers = segments
        return True

    def _result(self, ticket: _Ticket, received: list[int]) -> InferenceOutputs:
        end_ns = time.monotonic_ns()
        buffers = self._buffers
        if self._device_outputs:
            self._buffers = []
        for size, tensor in zip(received, self.info.outputs, strict=True):
            if size != tensor.nbytes():
                if self._device_outputs:
                    self._pool.free(buffers)
                detail = f"output {tensor.name!r}: {size} bytes, expected {tensor.nbytes()}"
                return InferenceOutputs(None, inference_error(detail), ticket.start_ns, end_ns)
        outputs = self._hand_out(buffers) if self._device_outputs else self._read(buffers)
        return InferenceOutputs(outputs, None, ticket.start_ns, end_ns)

    def _read(self, buffers: Sequence[Segment]) -> tuple[np.ndarray, ...]:
        """The outputs copied from the (host-readable) buffers they were dequeued into."""
        return tuple(
            to_array(self._acl.util.ptr_to_bytes(b.ptr, t.nbytes()), t.shape, t.dtype)
            for b, t in zip(buffers, self.info.outputs, strict=True)
        )

    def _hand_out(self, buffers: list[Segment]) -> tuple[AclDeviceTensor, ...]:
        """The outputs left in the device segments they were dequeued into, for the next
        model; the segments go back to the pool once it released them all."""
        hold = self._handed.hold(len(buffers), lambda: self._pool.free(buffers))
        return tuple(
            AclDeviceTensor(b.ptr, b.nbytes, t.shape, t.dtype, self.device_id, 0, hold)
            for b, t in zip(buffers, self.info.outputs, strict=True)
        )

    def _raise_if_lost(self) -> None:
        if not self._tickets:
            return
        waited_ms = (time.monotonic_ns() - self._tickets[0].start_ns) / 1e6
        if waited_ms > self._options.result_timeout_ms:
            self._tickets.popleft()  # its slot stays taken: reload() makes a new one
            self._received = []
            raise OutputLostError(
                f"model {self.info.name!r}: no output for a batch enqueued {waited_ms:.0f} ms ago "
                f"(its execution failed on the device, or runs past result_timeout_ms = "
                f"{self._options.result_timeout_ms}); queue mode cannot attribute later outputs"
            )

    def reload(self) -> None:
        """Unload the model and destroy its queues, then create new queues and load the
        model again bound to them (module docstring, "Recovery"); it then takes batches
        again, one in flight, an :meth:`interrupt` over.

        Thread rules: the dequeue thread's, after :meth:`dequeue` raised
        :class:`OutputLostError`, while the enqueue thread is kept out of :meth:`enqueue`:
        neither touches the old queues meanwhile.

        Raises:
            BackendError: the model is closed; its unload did not end within
                ``result_timeout_ms`` (the device is then marked hung, and the model is
                abandoned at its close); a release or the new load failed (what the load
                created is released first); or the file now loads with other inputs or
                outputs (changed on disk since the start).
        """
        self._raise_if_closed()
        try:
            if not self._release(self._binding.unbind):
                self._device.hung = True
                raise BackendError(
                    f"model {self.info.name!r} on device {self.device_id}: its unload did not "
                    f"end within result_timeout_ms ({self._options.result_timeout_ms} ms): its "
                    "work on the device did not finish"
                )
            loaded = self._binding.bind()
        except (AclError, ModelError) as exc:
            raise BackendError(f"model {self.info.name!r}: reload failed: {exc}") from exc
        self._check_same(loaded)
        self._loaded = loaded
        self._inputs, self._outputs = self._binding.queues
        self._slots = threading.Semaphore(1)
        self._interrupted.clear()

    def _check_same(self, loaded: LoadedModel) -> None:
        """Unbind and raise BackendError unless ``loaded`` has the tensors loaded at first."""
        info = loaded.description.info
        if (info.inputs, info.outputs) == (self.info.inputs, self.info.outputs):
            return
        self._binding.unbind()
        raise BackendError(
            f"model {self.info.name!r}: reload failed: its file now loads with other inputs "
            "or outputs than at the start (changed on disk)"
        )

    def _raise_if_closed(self) -> None:
        if self._closed.is_set():
            raise BackendError(f"model {self.info.name!r} is closed")

    def _raise_if_interrupted(self) -> None:
        """For the enqueue's waits: the batch is not taken, its inputs are kept.

        Raises:
            EnqueueInterruptedError: the model was closed or interrupted.
        """
        try:
            super()._raise_if_interrupted()
        except BackendError as exc:
            raise EnqueueInterruptedError(str(exc)) from None

    def _stop(self) -> bool:
        self._tickets.clear()
        self._received = []
        self._handed.release_all()
        # The model's executions end with its unload, which waits for them holding the GIL.
        return True


def _nbytes(tensor: AclDeviceTensor) -> int:
    """The bytes of ``tensor`` at its shape (its memory may be larger)."""
    return int(np.prod(tensor.shape, dtype=np.int64)) * tensor.dtype.itemsize

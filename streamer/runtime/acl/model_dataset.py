"""The part of async and sync mode that builds datasets for each batch.

Per batch (SAM ``python/common/acllite/acllite_model.py``; seeds "多Batch模型推理" and
"动态Batch"): segments for every model input and output from the memory pool (a full pool
blocks the enqueue thread: backpressure), inputs copied in, an input and an output dataset over
the segments, and for a dynamic model the batch's gear set through the input
``ascend_mbatch_shape_data`` (``set_dynamic_batch_size`` / ``set_dynamic_hw_size`` /
``set_input_dynamic_dims``, see :mod:`~streamer.runtime.acl.gears`; the gear tensor gets its own
segment of ``get_input_size_by_index`` bytes and the runtime fills it), then the output dims of
that gear read with ``acl.mdl.get_cur_output_dims``; for a dynamic-AIPP model the AIPP
parameters are written into its ``ascend_dynamic_aipp_data`` input with
``acl.mdl.set_input_aipp`` (:mod:`~streamer.runtime.acl.aipp_set`; that input also gets its
own segment, which the runtime fills). A batch whose shapes are no gear of the
model fails alone and is never executed, so no setter is ever called with a gear the model
lacks. Input and output segments have ``get_*_size_by_index`` bytes, the largest gear's size;
the dequeue thread reads each output at its recorded dims, so the arrays have the executed
shape. Then the datasets are destroyed and the segments freed. Batches come out in the order
they went in.

In a ``tensor`` chain (:mod:`~streamer.runtime.acl.device_tensor`): a model loaded with
``device_outputs`` returns its outputs where they are instead of reading them, and keeps the
batch (datasets, data buffers, segments) until the next model released them; an input given
as a device tensor gets no segment and no upload: its data buffer goes into the input dataset
as it is, and it is released with the batch, after the dataset is destroyed.
"""

from __future__ import annotations

import abc
import threading
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from streamer.errors import BackendError, FrameError
from streamer.runtime.acl.allocators import DeviceAllocator, HostAllocator
from streamer.runtime.acl.constants import RunMode
from streamer.runtime.acl.dataset import create_dataset
from streamer.runtime.acl.device_tensor import AclDeviceTensor, HandedOut
from streamer.runtime.acl.gears import current_output_shapes, set_gear
from streamer.runtime.acl.model_base import (
    AclModel,
    ModelParts,
    batch_problem,
    device_problem,
    inference_error,
)
from streamer.runtime.acl.pool import MemoryPool, Segment, footprint
from streamer.runtime.acl.teardown import Teardown
from streamer.runtime.acl.transfer import Transfer
from streamer.runtime.base import InferenceOutputs, Tensor, release_inputs

__all__ = ["Batch", "DatasetModel"]

_POLL_S = 0.05


@dataclass(eq=False)
class Batch:
    """One batch in flight.

    Attributes:
        size: the batch size.
        start_ns: ``time.monotonic_ns()`` when it was enqueued.
        teardown: releases its datasets, data buffers and segments (and the device inputs
            it took over).
        segments: model inputs (index order), then outputs; None for an input that is
            another model's output in device memory (its own memory is used).
        input_dataset, output_dataset: the dataset handles.
        output_buffers: the data buffers of the output dataset, in order.
        output_shapes: the dims of each output as executed (its gear's).
        error: set when it failed; its outputs are not read.
        end_ns: when it finished.
        done: finished (successfully or not); guarded by the model's condition.
        covered: async: a callback (or a flush) will report it; one covered that is not done
            ``result_timeout_ms`` after its enqueue is settled by a stream synchronisation.
    """

    size: int
    start_ns: int
    teardown: Teardown = field(default_factory=Teardown)
    segments: list[Segment | None] = field(default_factory=list)
    input_dataset: int = 0
    output_dataset: int = 0
    output_buffers: list[int] = field(default_factory=list)
    output_shapes: tuple[tuple[int, ...], ...] = ()
    error: FrameError | None = None
    end_ns: int = 0
    done: bool = False
    covered: bool = False

    def fail(self, error: FrameError) -> None:
        """Mark failed and finished now."""
        self.error = error
        self.end_ns = time.monotonic_ns()
        self.done = True


class DatasetModel(AclModel):
    """Datasets per batch over pool segments; subclasses submit the execution.

    Args:
        parts: as :class:`AclModel`.
        max_in_flight: batches enqueued and not dequeued; the pool holds exactly this many.
    """

    def __init__(self, parts: ModelParts, max_in_flight: int) -> None:
        super().__init__(parts)
        acl, device, teardown = parts.acl, parts.device, parts.teardown
        description = parts.loaded.description
        self._n_inputs = len(description.input_sizes)
        self._sizes = [*description.input_sizes, *description.output_sizes]
        self._pool = MemoryPool(DeviceAllocator(acl), footprint(self._sizes), max_in_flight)
        teardown.push_call(self._pool.close)
        self._device_outputs = parts.device_outputs
        self._handed = HandedOut()
        sizes = [] if self._device_outputs else description.output_sizes
        self._staging = self._host_staging(sizes, teardown)
        self._transfer = Transfer(acl, device.run_mode)
        self._cond = threading.Condition()
        self._in_flight: deque[Batch] = deque()
        self._aipp = parts.aipp

    def enqueue(self, inputs: Sequence[Tensor]) -> None:
        """Copy one batch in (device inputs are used where they are, and released once the
        batch is done) and submit it; blocks while the pool is full.

        Raises:
            AclError: a memory or dataset call failed (the model is unusable).
            BackendError: the model was closed or interrupted while waiting for memory.
        """
        problem = (
            batch_problem(self.info, inputs)
            or self._loaded.description.gears.problem(inputs)
            or device_problem(self.info, self.device_id, inputs)
        )
        if problem is not None:
            release_inputs(inputs)
            batch = Batch(0, time.monotonic_ns())
            batch.fail(inference_error(problem))
            self._push(batch)
            return
        self._submit(self._prepare(inputs))

    def dequeue(self, timeout_ms: int) -> InferenceOutputs | None:
        """The oldest batch once finished, or None after ``timeout_ms`` ms.

        Raises:
            AclError: reading the outputs or releasing the batch failed.
        """
        batch = self._wait_done(timeout_ms)
        if batch is None:
            return None
        if batch.error is None and self._device_outputs:
            return InferenceOutputs(self._hand_out(batch), None, batch.start_ns, batch.end_ns)
        try:
            outputs = None if batch.error is not None else self._read(batch)
        finally:
            batch.teardown.close()
        return InferenceOutputs(outputs, batch.error, batch.start_ns, batch.end_ns)

    @abc.abstractmethod
    def _submit(self, batch: Batch) -> None:
        """Execute ``batch`` (or fail it) and :meth:`_push` it, in enqueue order."""

    def _flush_due(self, head: Batch) -> bool:
        """Whether the dequeue thread must synchronise to finish ``head`` (async only)."""
        return False

    def _flush(self, head: Batch, timeout_ms: int) -> None:
        """Settle ``head`` (and the batches in flight with it) by synchronising the stream,
        waiting at most ``timeout_ms`` (async only)."""

    def _check_health(self) -> None:
        """Raise if the mode can no longer produce results (async: callback thread died)."""

    def _push(self, batch: Batch) -> None:
        with self._cond:
            self._in_flight.append(batch)
            self._cond.notify_all()

    def _finish(self, batches: Sequence[Batch]) -> None:
        """Mark the batches of ``batches`` not done yet finished successfully."""
        now = time.monotonic_ns()
        with self._cond:
            for batch in batches:
                if not batch.done:
                    batch.end_ns = now
                    batch.done = True
            self._cond.notify_all()

    def _fail_all(self, batches: Sequence[Batch], error: FrameError) -> None:
        """Mark the batches of ``batches`` not done yet failed with ``error``."""
        with self._cond:
            for batch in batches:
                if not batch.done:
                    batch.fail(error)
            self._cond.notify_all()

    def _unsettled(self) -> list[Batch]:
        """The batches in flight not done yet, oldest first."""
        with self._cond:
            return [batch for batch in self._in_flight if not batch.done]

    def _prepare(self, inputs: Sequence[Tensor]) -> Batch:
        batch = Batch(int(inputs[0].shape[0]), time.monotonic_ns())
        indices = self._loaded.description.data_input_indices
        fed = {i: t for i, t in zip(indices, inputs, strict=True) if isinstance(t, AclDeviceTensor)}
        for tensor in fed.values():  # released after the datasets that use them
            batch.teardown.push_call(tensor.release)
        with batch.teardown.on_error():
            segments = self._alloc(batch, set(fed))
            for index, array in zip(indices, inputs, strict=True):
                if isinstance(array, np.ndarray):
                    self._transfer.upload(*_place(segments[index]), array)
            entries = [_entry(fed[i]) if i in fed else _place(s) for i, s in enumerate(segments)]
            batch.input_dataset, _ = create_dataset(
                self._acl, entries[: self._n_inputs], batch.teardown
            )
            batch.output_dataset, batch.output_buffers = create_dataset(
                self._acl, entries[self._n_inputs :], batch.teardown
            )
            batch.output_shapes = self._set_gear(batch, inputs)
            if self._aipp is not None:
                self._aipp.apply(batch.input_dataset)
        return batch

    def _alloc(self, batch: Batch, fed: set[int]) -> list[Segment | None]:
        """Pool segments for every model input and output but the inputs in ``fed`` (device
        inputs: their own memory is used), freed with the batch."""
        wanted = [i for i in range(len(self._sizes)) if i not in fed]
        sizes = [self._sizes[i] for i in wanted]
        try:
            allocated = self._pool.alloc(sizes, cancelled=self._interrupted)
        except BackendError:
            self._raise_if_interrupted()  # says why: closed, or interrupted
            raise
        batch.teardown.push_call(lambda: self._pool.free(allocated))
        batch.segments = [None] * len(self._sizes)
        for index, segment in zip(wanted, allocated, strict=True):
            batch.segments[index] = segment
        return batch.segments

    def _hand_out(self, batch: Batch) -> tuple[AclDeviceTensor, ...]:
        """A finished batch's outputs left in device memory for the next model; the batch
        is released once that model released them all (:mod:`~streamer.runtime.acl.
        device_tensor`)."""
        hold = self._handed.hold(len(self.info.outputs), batch.teardown.close)
        tensors = []
        for index, tensor in enumerate(self.info.outputs):
            segment = batch.segments[self._n_inputs + index]
            assert segment is not None, "outputs always get segments"
            tensors.append(
                AclDeviceTensor(
                    segment.ptr,
                    segment.nbytes,
                    batch.output_shapes[index],
                    tensor.dtype,
                    self.device_id,
                    batch.output_buffers[index],
                    hold,
                )
            )
        return tuple(tensors)

    def _set_gear(self, batch: Batch, inputs: Sequence[Tensor]) -> tuple[tuple[int, ...], ...]:
        """Set the gear of ``batch`` if the model is dynamic; the dims its outputs will have.

        Runs in the enqueue thread, the only one that sets gears, so the model's current gear
        read back by ``get_cur_output_dims`` is this batch's (:mod:`~streamer.runtime.acl.gears`).

        Raises:
            AclError: the setter or ``get_cur_output_dims`` failed.
        """
        description = self._loaded.description
        if description.dynamic_index is None:
            return tuple(tensor.shape for tensor in self.info.outputs)
        gears = description.gears
        gear = gears.gear_of([array.shape for array in inputs])
        assert gear is not None, "enqueue() checked the gear"
        set_gear(
            self._acl,
            self._loaded.model_id,
            batch.input_dataset,
            description.dynamic_index,
            gears,
            gear,
        )
        return current_output_shapes(self._acl, self._loaded.desc, len(self.info.outputs))

    def _wait_done(self, timeout_ms: int) -> Batch | None:
        deadline = time.monotonic() + timeout_ms / 1000
        while True:
            with self._cond:
                self._check_health()
                if self._in_flight and self._in_flight[0].done:
                    return self._in_flight.popleft()
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return None
                head = self._in_flight[0] if self._in_flight else None
                if head is None or not self._flush_due(head):
                    self._cond.wait(min(remaining, _POLL_S))
                    continue
            self._flush(head, max(1, int(remaining * 1000)))

    def _read(self, batch: Batch) -> tuple[np.ndarray, ...]:
        outputs = []
        for index, tensor in enumerate(self.info.outputs):
            segment = batch.segments[self._n_inputs + index]
            assert segment is not None, "outputs always get segments"
            staging = self._staging[index].ptr if self._staging else None
            shape = batch.output_shapes[index]
            outputs.append(self._transfer.download(segment.ptr, shape, tensor.dtype, staging))
        return tuple(outputs)

    def _release_in_flight(self) -> None:
        """Free the batches in flight and the outputs still handed out (the model closes)."""
        with self._cond:
            batches, self._in_flight = list(self._in_flight), deque()
        for batch in batches:
            batch.teardown.abort()
        self._handed.release_all()

    def _host_staging(self, sizes: Sequence[int], teardown: Teardown) -> list[Segment]:
        """Under ``ACL_HOST``: host segments the dequeue thread copies outputs into (none
        for a model whose outputs stay in device memory: ``sizes`` empty)."""
        if self._device.run_mode != RunMode.HOST or not sizes:
            return []
        pool = MemoryPool(HostAllocator(self._acl), footprint(sizes))
        teardown.push_call(pool.close)
        segments = pool.try_alloc(sizes)
        assert segments is not None, "a pool sized by footprint() holds its segments"
        return segments


def _entry(tensor: AclDeviceTensor) -> tuple[int, int] | int:
    """A device input's dataset entry: its data buffer, reused, or a new one over its memory
    (queue mode outputs have none)."""
    return tensor.data_buffer or (tensor.ptr, tensor.nbytes)


def _place(segment: Segment | None) -> tuple[int, int]:
    """A pool segment's dataset entry: a new data buffer over it."""
    assert segment is not None, "only device inputs go without a segment"
    return segment.ptr, segment.nbytes

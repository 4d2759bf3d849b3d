"""The part of async and sync mode that builds datasets for each batch.

Per batch (SAM ``python/common/acllite/acllite_model.py``; seeds "多Batch模型推理" and
"动态Batch"): segments for every model input and output from the memory pool (a full pool
blocks the enqueue thread: backpressure), inputs copied in, an input and an output dataset over
the segments, and for a dynamic model the batch's gear set through the input
``ascend_mbatch_shape_data`` (``set_dynamic_batch_size`` / ``set_dynamic_hw_size`` /
``set_input_dynamic_dims``, see :mod:`~streamer.runtime.acl.gears`; the gear tensor gets its own
segment of ``get_input_size_by_index`` bytes and the runtime fills it), then the output dims of
that gear read with ``acl.mdl.get_cur_output_dims``. A batch whose shapes are no gear of the
model fails alone and is never executed, so no setter is ever called with a gear the model
lacks. Input and output segments have ``get_*_size_by_index`` bytes, the largest gear's size;
the dequeue thread reads each output at its recorded dims, so the arrays have the executed
shape. Then the datasets are destroyed and the segments freed. Batches come out in the order
they went in.
"""

from __future__ import annotations

import abc
import threading
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from streamer.errors import FrameError
from streamer.runtime.acl.allocators import DeviceAllocator, HostAllocator
from streamer.runtime.acl.constants import RunMode
from streamer.runtime.acl.dataset import create_dataset
from streamer.runtime.acl.gears import current_output_shapes, set_gear
from streamer.runtime.acl.model_base import AclModel, ModelParts, batch_problem, inference_error
from streamer.runtime.acl.pool import MemoryPool, Segment, footprint
from streamer.runtime.acl.teardown import Teardown
from streamer.runtime.acl.transfer import Transfer
from streamer.runtime.base import InferenceOutputs

__all__ = ["Batch", "DatasetModel"]

_POLL_S = 0.05


@dataclass(eq=False)
class Batch:
    """One batch in flight.

    Attributes:
        size: the batch size.
        start_ns: ``time.monotonic_ns()`` when it was enqueued.
        teardown: releases its datasets, data buffers and segments.
        segments: model inputs (index order), then outputs.
        input_dataset, output_dataset: the dataset handles.
        output_shapes: the dims of each output as executed (its gear's).
        error: set when it failed; its outputs are not read.
        end_ns: when it finished.
        done: finished (successfully or not); guarded by the model's condition.
        covered: async: a callback (or a flush) will report it.
    """

    size: int
    start_ns: int
    teardown: Teardown = field(default_factory=Teardown)
    segments: list[Segment] = field(default_factory=list)
    input_dataset: int = 0
    output_dataset: int = 0
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
        self._staging = self._host_staging(description.output_sizes, teardown)
        self._transfer = Transfer(acl, device.run_mode)
        self._cond = threading.Condition()
        self._in_flight: deque[Batch] = deque()

    def enqueue(self, inputs: Sequence[np.ndarray]) -> None:
        """Copy one batch in and submit it; blocks while the pool is full.

        Raises:
            AclError: a memory or dataset call failed (the model is unusable).
            BackendError: the model was closed while waiting for memory.
        """
        problem = batch_problem(self.info, inputs) or self._loaded.description.gears.problem(inputs)
        if problem is not None:
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

    def _flush(self, timeout_ms: int) -> None:
        """Finish uncovered batches by synchronising the stream (async only)."""

    def _check_health(self) -> None:
        """Raise if the mode can no longer produce results (async: callback thread died)."""

    def _push(self, batch: Batch) -> None:
        with self._cond:
            self._in_flight.append(batch)
            self._cond.notify_all()

    def _finish(self, batches: Sequence[Batch]) -> None:
        now = time.monotonic_ns()
        with self._cond:
            for batch in batches:
                batch.end_ns = now
                batch.done = True
            self._cond.notify_all()

    def _prepare(self, inputs: Sequence[np.ndarray]) -> Batch:
        batch = Batch(int(inputs[0].shape[0]), time.monotonic_ns())
        segments = self._pool.alloc(self._sizes, cancelled=self._closed)
        batch.teardown.push_call(lambda: self._pool.free(segments))
        batch.segments = segments
        with batch.teardown.on_error():
            description = self._loaded.description
            for index, array in zip(description.data_input_indices, inputs, strict=True):
                self._transfer.upload(segments[index].ptr, segments[index].nbytes, array)
            batch.input_dataset = create_dataset(
                self._acl, [(s.ptr, s.nbytes) for s in segments[: self._n_inputs]], batch.teardown
            )
            batch.output_dataset = create_dataset(
                self._acl, [(s.ptr, s.nbytes) for s in segments[self._n_inputs :]], batch.teardown
            )
            batch.output_shapes = self._set_gear(batch, inputs)
        return batch

    def _set_gear(self, batch: Batch, inputs: Sequence[np.ndarray]) -> tuple[tuple[int, ...], ...]:
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
            self._flush(max(1, int(remaining * 1000)))

    def _read(self, batch: Batch) -> tuple[np.ndarray, ...]:
        outputs = []
        for index, tensor in enumerate(self.info.outputs):
            segment = batch.segments[self._n_inputs + index]
            staging = self._staging[index].ptr if self._staging else None
            shape = batch.output_shapes[index]
            outputs.append(self._transfer.download(segment.ptr, shape, tensor.dtype, staging))
        return tuple(outputs)

    def _release_in_flight(self) -> None:
        with self._cond:
            batches, self._in_flight = list(self._in_flight), deque()
        for batch in batches:
            batch.teardown.abort()

    def _host_staging(self, sizes: Sequence[int], teardown: Teardown) -> list[Segment]:
        """Under ``ACL_HOST``: host segments the dequeue thread copies outputs into."""
        if self._device.run_mode != RunMode.HOST:
            return []
        pool = MemoryPool(HostAllocator(self._acl), footprint(sizes))
        teardown.push_call(pool.close)
        segments = pool.try_alloc(sizes)
        assert segments is not None, "a pool sized by footprint() holds its segments"
        return segments

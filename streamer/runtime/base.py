"""The backend contract: a queue-bound model (DESIGN.md §4).

A :class:`Backend` owns a runtime (onnxruntime, or pyACL's device/context/stream) and loads
models into :class:`QueueModel` objects. A queue-bound model is fed by exactly one *enqueue
thread* and drained by exactly one *dequeue thread*, in FIFO order: the shape of ACL's
queue mode (``aclmdlLoadFromFileWithQ`` + ``acltdtEnqueueData`` / ``acltdtDequeueData``, whose
docs require all enqueues of a model from one thread and all dequeues from one other thread),
used for every backend so the pipeline never branches on the backend.

The pipeline keeps its own ledger of what it enqueued (a tdt queue carries only buffers), so
:meth:`QueueModel.dequeue` returns only tensors, or the error of that batch, in the same order.

Lifecycle (every exit path)::

    backend = open_backend(...)          # e.g. acl.init, set_device, create_context
    model = backend.load(spec)           # in the thread that will own the model's context
    model.attach_thread()                # in the enqueue thread, then in the dequeue thread
    model.enqueue(...) / model.dequeue(...)
    model.close()                        # before the backend
    backend.close()
"""

from __future__ import annotations

import abc
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from streamer.config import PluginConfig, RuntimeConfig
from streamer.errors import BackendError, FrameError
from streamer.lifecycle import Closing
from streamer.runtime.ops.base import Operators

__all__ = [
    "Backend",
    "DeviceTensor",
    "InferenceOutputs",
    "ModelInfo",
    "ModelSpec",
    "QueueModel",
    "Tensor",
    "TensorInfo",
    "release_inputs",
]

DYNAMIC = -1
"""A dimension whose size is chosen per execution (ONNX symbolic dim, ACL ``-1``)."""


@dataclass(frozen=True)
class TensorInfo:
    """Name, shape and dtype of one model input or output.

    Attributes:
        name: tensor name in the model.
        shape: dimensions, batch first; ``-1`` marks a dynamic dimension.
        dtype: numpy dtype of the elements.
    """

    name: str
    shape: tuple[int, ...]
    dtype: np.dtype[Any]

    @property
    def is_static(self) -> bool:
        return all(d >= 0 for d in self.shape)

    def nbytes(self, batch: int | None = None) -> int:
        """Size in bytes with the batch dim set to ``batch`` (or as declared).

        Raises:
            ValueError: a dimension other than the batch is dynamic.
        """
        dims = list(self.shape)
        if batch is not None and dims:
            dims[0] = batch
        if any(d < 0 for d in dims):
            raise ValueError(f"tensor {self.name!r} has dynamic dims {self.shape}")
        return int(np.prod(dims, dtype=np.int64)) * self.dtype.itemsize


class DeviceTensor(abc.ABC):
    """One batch-first model output left in a backend's device memory, so the next model of
    a ``:tensor`` chain on the same device takes it as an input without a copy to the host.

    Ownership: the model that produced it owns the memory until :meth:`release`. A model
    whose :meth:`QueueModel.enqueue` is given device tensors takes that ownership over on
    every path (also when it refuses the batch or raises) and releases them once the
    execution that reads them is done; a pipeline that drops a batch without enqueueing it
    releases them itself (:func:`release_inputs`). Releasing twice is harmless.

    Attributes:
        shape: dims as executed, batch first.
        dtype: element type.
        device: the device id whose memory holds it.
    """

    shape: tuple[int, ...]
    dtype: np.dtype[Any]
    device: int

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @abc.abstractmethod
    def release(self) -> None:
        """Give the memory back to the model that produced it; idempotent, any thread.

        Raises:
            BackendError: the backend failed to release it.
        """


Tensor = np.ndarray | DeviceTensor
"""A model input or output: a host array, or (``ModelSpec.device_outputs``) device memory."""


def release_inputs(inputs: Sequence[Tensor]) -> None:
    """Release the device tensors among ``inputs``: a batch dropped without being enqueued."""
    for tensor in inputs:
        if isinstance(tensor, DeviceTensor):
            tensor.release()


@dataclass(frozen=True)
class ModelInfo:
    """What a loaded model accepts and produces.

    Attributes:
        name: the configured model (stage) name.
        inputs, outputs: tensors in the model's order.
        batch_gears: batch sizes the model can execute. For a static model this is the one
            declared batch, e.g. ``(1,)``; for a dynamic batch it is the ACL gear list
            (``acl.mdl.get_dynamic_batch``) or, on onnxruntime, the configured gears.
            Empty means any batch size is accepted.
        hw_gears: (height, width) resolution gears (``acl.mdl.get_dynamic_hw``), or empty.
        dims_gears: dynamic-dims gears (``acl.mdl.get_input_dynamic_dims``), or empty.
    """

    name: str
    inputs: tuple[TensorInfo, ...]
    outputs: tuple[TensorInfo, ...]
    batch_gears: tuple[int, ...] = ()
    hw_gears: tuple[tuple[int, int], ...] = ()
    dims_gears: tuple[tuple[int, ...], ...] = ()

    @property
    def dynamic_batch(self) -> bool:
        return bool(self.inputs) and self.inputs[0].shape[:1] == (DYNAMIC,)

    @property
    def max_batch_size(self) -> int | None:
        """Largest batch one execution takes, or None when unbounded."""
        return max(self.batch_gears) if self.batch_gears else None

    def describe(self) -> list[str]:
        """Human-readable lines, one per tensor (used by ``streamer check``)."""
        lines = [f"model {self.name}: batch gears {list(self.batch_gears) or 'any'}"]
        if self.hw_gears:
            lines.append(f"  resolution gears (h, w): {[list(g) for g in self.hw_gears]}")
        if self.dims_gears:
            lines.append(f"  dims gears: {[list(g) for g in self.dims_gears]}")
        for kind, tensors in (("input", self.inputs), ("output", self.outputs)):
            lines += [f"  {kind} {t.name}: {list(t.shape)} {t.dtype}" for t in tensors]
        return lines


@dataclass(frozen=True)
class ModelSpec:
    """What to load and where.

    Attributes:
        name: the model (stage) name from the config, used in logs and results.
        path: the model file (.onnx for onnxruntime and the simulator, .om for ACL).
        device: device id (ACL device, CUDA device) or 0 on the CPU.
        mode: execution mode; ACL: ``auto`` | ``queue`` | ``async`` | ``sync``.
        max_in_flight: batches that may be enqueued and not yet dequeued; enqueue blocks
            beyond it (backpressure).
        batch_gears: batch sizes to allow when the model's batch dim is dynamic.
        options: backend-specific settings (e.g. onnxruntime ``intra_op_threads``).
        preprocess: the table (``kind`` and parameters) of the plug-in that prepares the
            model's inputs: its ``[models.preprocess]``, or an item stage's
            ``[models.postprocess]`` (an MTCNN stage crops and resizes its own inputs), for a
            backend that composes the preprocessing into the model (onnxruntime with
            ``normalize = "model"``); None for stages fed by another stage's tensors.
        device_outputs: the outputs feed the next model of a ``:tensor`` chain, or the
            single operators of the postprocessor (``nms = "operator"``): a backend with
            device memory (ACL) leaves them there and :meth:`QueueModel.dequeue` returns
            :class:`DeviceTensor` objects; onnxruntime returns its arrays as always (host
            memory is what the next session and its operators read).
    """

    name: str
    path: Path
    device: int = 0
    mode: str = "auto"
    max_in_flight: int = 2
    batch_gears: tuple[int, ...] = ()
    options: Mapping[str, Any] = field(default_factory=dict)
    preprocess: PluginConfig | None = None
    device_outputs: bool = False


@dataclass(slots=True)
class InferenceOutputs:
    """The result of one enqueued batch, returned by :meth:`QueueModel.dequeue`.

    Attributes:
        outputs: one array per model output, in ``ModelInfo.outputs`` order, batch first,
            batch size as enqueued (:class:`DeviceTensor` objects for a model loaded with
            ``device_outputs`` on a backend with device memory); None when ``error`` is set.
        error: why this batch failed (reason ``inference_failed``); the frames of this batch
            get error results and the pipeline goes on.
        start_ns, end_ns: ``time.monotonic_ns()`` around the execution, for the latency split.
    """

    outputs: tuple[Tensor, ...] | None
    error: FrameError | None = None
    start_ns: int = 0
    end_ns: int = 0


class QueueModel(Closing, abc.ABC):
    """A loaded model fed through an input queue and drained through an output queue.

    Thread rules: :meth:`enqueue` only from one thread (the batcher), :meth:`dequeue` only from
    one other thread; each of them calls :meth:`attach_thread` first. :meth:`close` from the
    thread that loaded the model, after both threads have stopped.
    """

    info: ModelInfo

    def attach_thread(self) -> None:  # noqa: B027 - optional hook, empty by default
        """Prepare the calling thread to enqueue or dequeue (ACL: ``acl.rt.set_context``)."""

    @abc.abstractmethod
    def enqueue(self, inputs: Sequence[Tensor]) -> None:
        """Submit one batch.

        Args:
            inputs: one C-contiguous array per model input, in ``ModelInfo.inputs`` order,
                batch first; the batch size must be one of ``info.batch_gears`` (if any).
                An input may be a :class:`DeviceTensor` of the same backend and device (the
                previous model's output in a ``:tensor`` chain); the model then owns it,
                unless it raises :class:`~streamer.errors.EnqueueInterruptedError`.

        Blocks while ``max_in_flight`` batches are outstanding (backpressure). A failure of
        this batch alone is reported by :meth:`dequeue` in this batch's position.

        Raises:
            EnqueueInterruptedError: interrupted (:meth:`interrupt`) or closed before the
                model took the batch; the caller keeps the inputs, to run elsewhere or to
                release.
            BackendError: the backend can no longer execute anything.
        """

    @abc.abstractmethod
    def interrupt(self) -> None:
        """Make an :meth:`enqueue` waiting for room, and every later one until a
        :meth:`reload`, raise :class:`BackendError`; from any thread, idempotent.

        For a pipeline that gives up draining: nothing dequeues any more, so an enqueue
        blocked at ``max_in_flight`` would wait until :meth:`close`, which must come after
        the enqueue thread has ended.
        """

    def reload(self) -> None:
        """Release the loaded model and load it again afresh, after :meth:`dequeue` raised
        :class:`~streamer.errors.OutputLostError` (the only models that raise it implement
        this); it then takes batches again, an earlier :meth:`interrupt` over.

        Thread rules: from the dequeue thread, while the enqueue thread is kept out of
        :meth:`enqueue`.

        Raises:
            BackendError: this model cannot be reloaded, or the reload failed (what it
                half-created is released first).
        """
        raise BackendError(f"model {self.info.name!r} cannot be reloaded")

    @abc.abstractmethod
    def dequeue(self, timeout_ms: int) -> InferenceOutputs | None:
        """Take the oldest finished batch, waiting up to ``timeout_ms`` ms; None on timeout.

        Raises:
            BackendError: the backend can no longer execute anything.
        """

    @abc.abstractmethod
    def close(self) -> None:
        """Release the model's resources. Idempotent."""


class Backend(Closing, abc.ABC):
    """An inference runtime that loads models into :class:`QueueModel` objects.

    Attributes:
        name: the ``runtime.backend`` value.
        result_timeout_s: longest a batch can go without a result before the backend
            fails it (s), or None where a failed execution is reported at once; the
            pipeline's reorder timeout waits longer by default.
        device_memory: a model loaded with ``device_outputs`` returns
            :class:`DeviceTensor` objects, in the memory of its device: a ``tensor`` stage
            runs each batch on the device that made its inputs. False where outputs are host
            arrays that a model on any device takes.
    """

    name: str
    result_timeout_s: float | None = None
    device_memory: bool = False

    @classmethod
    @abc.abstractmethod
    def check_options(cls, config: RuntimeConfig) -> None:
        """Validate ``config.options`` for this backend without opening it.

        Raises:
            ConfigError: an option is unknown or invalid, named as ``runtime.options.<key>``.
        """

    @abc.abstractmethod
    def load(self, spec: ModelSpec) -> QueueModel:
        """Load ``spec.path`` on ``spec.device``.

        Raises:
            ModelError: the file is missing or invalid, or does not fit ``spec``.
            BackendError: the runtime itself failed.
        """

    @abc.abstractmethod
    def operators(self) -> Operators:
        """The backend's single operators for post-processing (NMS, top-k): the same object
        on every call, released by :meth:`close`."""

    @abc.abstractmethod
    def close(self) -> None:
        """Release the runtime (after every model is closed). Idempotent."""

"""Simulated model management: loaded models, descriptions, datasets, data buffers, execution.

Rules (reference/pyacl.md §2 and §9):
    S9: ``create_data_buffer(0, n > 0)`` returns 0; ``create_data_buffer(0, 0)`` succeeds.
    S11: a model is executed and unloaded in the context that loaded it; from another context
        it does not exist (``ACL_ERROR_INVALID_MODEL_ID``).
    S13: one model id never executes concurrently: not on two streams, and not by two threads
        at once (``acl.mdl.execute_async`` page: threads sharing a model id lock around the
        I/O refresh and the execution); the simulator returns ``ACL_ERROR_FAILURE``.
    S14: ``get_dynamic_batch`` reports at most 128 gears; ``batchCount == 0`` without gears.
    S15: a gear is set only through the ``ascend_mbatch_shape_data`` input index and only to
        one of the model's gears (``ACL_ERROR_GE_DYNAMIC_BATCH_SIZE_INVALID`` for batch,
        resolution and dims alike: GE ``GeExecutor::SetDynamicBatchSize`` /
        ``SetDynamicImageSize`` / ``SetDynamicDims``); an execution whose gear tensor holds no
        valid gear fails the same way. A zero height or width, or dims with ``dimCount`` 0,
        are ``ACL_ERROR_INVALID_PARAM`` (GE ``aclmdlSetDynamicHWSize`` /
        ``aclmdlSetInputDynamicDims``); dims whose count differs from the inputs' dims, or
        whose static dims differ from the model's, are ``ACL_ERROR_GE_DYNAMIC_INPUT_LENGTH_INVALID``
        (GE ``GeExecutor::GetCurDynamicDims``).
    S16: one dynamic kind per model: the setter of another kind returns
        ``ACL_ERROR_MODEL_NOT_DYNAMIC``.
    Execution memory: every data buffer of an execution's input and output datasets points
        into device memory of the model's device; ``malloc_host`` memory counts only when the
        application runs on the device (``aclmdlExecute`` constraints, HA ``canncommercial/
        850/API/appdevgapi/aclcppdevg_03_0298``: the memory of model inputs and outputs is
        Device memory, and ``aclrtMallocHost`` gives Device memory only there). The page gives
        no code; the simulator returns ``ACL_ERROR_INVALID_PARAM``. A data buffer may sit in
        several datasets (the next model of a chain reads the previous one's output buffer).
    Secondary allocation (seeds "内存二次分配管理"): pieces an application carves out of one
        ``malloc`` block each take ``ALIGN_UP(len, 32) + 32`` bytes and start on a 64-byte
        boundary, "otherwise memory is easily overrun" (the runtime itself does not check).
        So every data buffer of an execution starts on a 64-byte boundary, and two of them in
        one allocation lie at least ``ALIGN_UP(len, 32) + 32`` bytes apart; the simulator
        refuses the execution with ``ACL_ERROR_MEMORY_ADDRESS_UNALIGNED`` (rule
        ``secondary-allocation``) rather than let a pool bug pass unseen.

Dynamic AIPP: ``set_input_aipp`` checks an ``aclmdlAIPP`` against the model and writes it into
the dataset's ``ascend_dynamic_aipp_data`` buffer; each execution reads it back from there
(:mod:`~streamer.runtime.acl.sim.aipp_model`: the checks, error codes and what is simulated).
An index that is not the model's dynamic AIPP input is ``ACL_ERROR_INVALID_PARAM`` (GE
``CheckAippDataIndex``); a buffer too small for the parameters is
``ACL_ERROR_GE_DYNAMIC_INPUT_LENGTH_INVALID``.

The gear last set on a model is its *current gear* (model state, not dataset state: GE
``GraphExecutor::SetDynamicSize(model_id, …)``); ``get_cur_output_dims`` reports the output
dims of that gear, or of the largest gear before any is set, or the static dims (RT
``python/docs/zh/api_ref/ge/function-get_cur_output_dims.md``).
"""

from __future__ import annotations

import contextlib
import itertools
import threading
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from streamer.runtime.acl.constants import AclCode
from streamer.runtime.acl.pool import ALIGN_MODEL, segment_bytes
from streamer.runtime.acl.sim.aipp_data import AippParameters, decode, encode
from streamer.runtime.acl.sim.aipp_model import check_parameters, parameter_feeds, runtime_dtype
from streamer.runtime.acl.sim.binding import SimError
from streamer.runtime.acl.sim.faults import Faults
from streamer.runtime.acl.sim.image import DynamicKind, Gear, ModelImage, load_image
from streamer.runtime.acl.sim.manifest import ManifestError, onnx_path
from streamer.runtime.acl.sim.memory import MemoryKind, SimMemory

__all__ = ["Buffer", "LoadedModel", "SimModels"]


@dataclass(frozen=True)
class Buffer:
    """A data buffer: ``size`` bytes at ``ptr``."""

    ptr: int
    size: int


@dataclass(eq=False)
class LoadedModel:
    """A model id and its state.

    Attributes:
        stream: the stream its unfinished ``execute_async`` tasks run on.
        pending: ``execute_async`` tasks not finished.
        busy: an ``execute`` is running.
        device: the device of its context.
        queues: input and output queue ids of a WithQ model.
        input_producer, output_consumer: the host threads feeding / draining its queues.
        stopped: set by ``unload`` (stops a WithQ model's scheduler).
        gear: the current gear (last set), or None.
    """

    model_id: int
    image: ModelImage
    context: int
    device: int = -1
    stream: int | None = None
    pending: int = 0
    busy: bool = False
    queues: tuple[tuple[int, ...], tuple[int, ...]] | None = None
    input_producer: int | None = None
    output_consumer: int | None = None
    stopped: threading.Event = field(default_factory=threading.Event)
    gear: Gear | None = None


class SimModels:
    """Models, descriptions, datasets and data buffers of the simulator; thread-safe.

    Args:
        memory: the simulated memory (inputs are read from it, outputs written to it).
        faults: injected execution failures and delays.
        log_problem: records why a model could not be loaded (the real runtime logs it).
    """

    def __init__(
        self,
        memory: SimMemory,
        faults: Faults,
        log_problem: Callable[[str], None],
        *,
        host_is_device: bool,
    ) -> None:
        self._memory = memory
        self._host_is_device = host_is_device
        self._faults = faults
        self._log_problem = log_problem
        self._lock = threading.Lock()
        self._ids = itertools.count(1)
        self._handles = itertools.count(0x5A00_0000_0040, 0x40)
        self._images: dict[Path, ModelImage] = {}
        self._loaded: dict[int, LoadedModel] = {}
        self._descs: dict[int, ModelImage | None] = {}
        self._desc_models: dict[int, int] = {}
        self._buffers: dict[int, Buffer] = {}
        self._datasets: dict[int, list[int]] = {}

    # Models ---------------------------------------------------------------------------------

    def image(self, path: str) -> ModelImage:
        """The image of ``path``, built once per file.

        Raises:
            SimError: no such file (``ACL_ERROR_GE_EXEC_MODEL_PATH_INVALID``) or an image ATC
                would not have built (``ACL_ERROR_GE_PARAM_INVALID``).
        """
        model = Path(path)
        if not model.is_file() and not onnx_path(model).is_file():
            raise SimError(AclCode.ERROR_GE_EXEC_MODEL_PATH_INVALID, None, f"no model {path}")
        key = model.absolute()
        with self._lock:
            cached = self._images.get(key)
        if cached is not None:
            return cached
        try:
            image = load_image(model)
        except ManifestError as exc:
            self._log_problem(f"{path}: {exc}")
            raise SimError(AclCode.ERROR_GE_PARAM_INVALID, None, str(exc)) from exc
        with self._lock:
            return self._images.setdefault(key, image)

    def load(self, image: ModelImage, context: int, device: int) -> LoadedModel:
        """Register a loaded model in ``context`` of ``device``."""
        with self._lock:
            model = LoadedModel(next(self._ids), image, context, device)
            self._loaded[model.model_id] = model
            return model

    def find(self, model_id: int) -> LoadedModel:
        """The loaded model ``model_id``, whatever the context.

        Raises:
            SimError: unknown id.
        """
        with self._lock:
            model = self._loaded.get(model_id)
        if model is None:
            raise SimError(AclCode.ERROR_INVALID_MODEL_ID, None, f"no model {model_id}")
        return model

    def get(self, model_id: int, context: int) -> LoadedModel:
        """The model ``model_id`` as seen from ``context``.

        Raises:
            SimError: unknown id, or loaded in another context (S11).
        """
        model = self.find(model_id)
        if model.context != context:
            raise SimError(AclCode.ERROR_INVALID_MODEL_ID, "S11", "model loaded in another context")
        return model

    def loaded_on(self, device: int) -> list[int]:
        """The ids of the models loaded on ``device`` and not unloaded."""
        with self._lock:
            return [m.model_id for m in self._loaded.values() if m.device == device]

    def unload(self, model_id: int, context: int) -> LoadedModel:
        """Raises: SimError: as :meth:`get`."""
        model = self.get(model_id, context)
        with self._lock:
            del self._loaded[model_id]
        model.stopped.set()
        return model

    # Descriptions ---------------------------------------------------------------------------

    def create_desc(self) -> int:
        with self._lock:
            handle = next(self._handles)
            self._descs[handle] = None
            return handle

    def fill_desc(self, desc: int, model: LoadedModel) -> None:
        """Raises: SimError: unknown description."""
        with self._lock:
            if desc not in self._descs:
                raise SimError(AclCode.ERROR_INVALID_PARAM, None, f"no description {desc:#x}")
            self._descs[desc] = model.image
            self._desc_models[desc] = model.model_id

    def destroy_desc(self, desc: int) -> None:
        """Raises: SimError: unknown description."""
        with self._lock:
            if self._descs.pop(desc, False) is False:
                raise SimError(AclCode.ERROR_INVALID_PARAM, None, f"no description {desc:#x}")
            self._desc_models.pop(desc, None)

    def desc(self, desc: int) -> ModelImage:
        """The image a filled description describes.

        Raises:
            SimError: unknown or never filled by ``get_desc``.
        """
        with self._lock:
            image = self._descs.get(desc)
        if image is None:
            raise SimError(AclCode.ERROR_INVALID_PARAM, None, f"no filled description {desc:#x}")
        return image

    # Data buffers and datasets -------------------------------------------------------------

    def create_buffer(self, ptr: int, size: int) -> int:
        """A data buffer handle, or 0 for ``ptr == 0`` with ``size > 0`` (S9)."""
        if ptr == 0 and size > 0:
            return 0
        with self._lock:
            handle = next(self._handles)
            self._buffers[handle] = Buffer(ptr, size)
            return handle

    def destroy_buffer(self, handle: int) -> None:
        """Raises: SimError: unknown buffer."""
        with self._lock:
            if self._buffers.pop(handle, None) is None:
                raise SimError(AclCode.ERROR_INVALID_PARAM, None, f"no data buffer {handle:#x}")

    def buffer(self, handle: int) -> Buffer:
        """The data buffer ``handle``.

        Raises:
            SimError: unknown buffer (``ACL_ERROR_INVALID_PARAM``).
        """
        with self._lock:
            found = self._buffers.get(handle)
        if found is None:
            raise SimError(AclCode.ERROR_INVALID_PARAM, None, f"no data buffer {handle:#x}")
        return found

    def create_dataset(self) -> int:
        with self._lock:
            handle = next(self._handles)
            self._datasets[handle] = []
            return handle

    def add_to_dataset(self, dataset: int, buffer: int) -> None:
        """Raises: SimError: unknown dataset or buffer."""
        with self._lock:
            if dataset not in self._datasets or buffer not in self._buffers:
                raise SimError(AclCode.ERROR_INVALID_PARAM, None, "unknown dataset or buffer")
            self._datasets[dataset].append(buffer)

    def destroy_dataset(self, dataset: int) -> None:
        """Raises: SimError: unknown dataset."""
        with self._lock:
            if self._datasets.pop(dataset, None) is None:
                raise SimError(AclCode.ERROR_INVALID_PARAM, None, f"no dataset {dataset:#x}")

    def dataset(self, dataset: int) -> list[Buffer]:
        """The buffers of a dataset, in order.

        Raises:
            SimError: unknown dataset, or one of its buffers was destroyed.
        """
        with self._lock:
            handles = self._datasets.get(dataset)
            if handles is None or any(h not in self._buffers for h in handles):
                raise SimError(AclCode.ERROR_INVALID_PARAM, None, f"bad dataset {dataset:#x}")
            return [self._buffers[h] for h in handles]

    # Gears and execution --------------------------------------------------------------------

    def set_gear(
        self, model: LoadedModel, kind: DynamicKind, dataset: int, index: int, gear: Sequence[int]
    ) -> None:
        """Write ``gear`` into the model's gear tensor in ``dataset`` and make it the model's
        current gear (S15, S16).

        Raises:
            SimError: another dynamic kind, not the gear tensor's index, a malformed gear, a
                gear the model does not have, or no usable buffer at ``index``.
        """
        image = model.image
        if image.kind != kind:
            raise SimError(AclCode.ERROR_MODEL_NOT_DYNAMIC, "S16", f"model is {image.kind.value}")
        if index != image.dynamic_index:
            raise SimError(
                AclCode.ERROR_INVALID_PARAM, "S15", f"index {index} is not the gear input"
            )
        _check_gear_form(image, tuple(gear))
        if tuple(gear) not in image.gears:
            code = AclCode.ERROR_GE_DYNAMIC_BATCH_SIZE_INVALID
            raise SimError(
                code, "S15", f"gear {list(gear)} not in {[list(g) for g in image.gears]}"
            )
        self._write_gear(dataset, index, gear)
        with self._lock:
            model.gear = tuple(gear)

    def cur_output_dims(self, desc: int, index: int) -> tuple[str, tuple[int, ...]]:
        """Name and dims of output ``index`` at the current gear of the described model.

        Raises:
            SimError: unknown description or output index (``ACL_ERROR_INVALID_PARAM``), or
                the model was unloaded (``ACL_ERROR_INVALID_MODEL_ID``).
        """
        image = self.desc(desc)
        if index >= len(image.outputs):
            raise SimError(AclCode.ERROR_INVALID_PARAM, None, f"no output {index}")
        with self._lock:
            model = self._loaded.get(self._desc_models.get(desc, -1))
        if model is None:
            raise SimError(AclCode.ERROR_INVALID_MODEL_ID, None, "the model was unloaded")
        gear = model.gear if model.gear is not None else image.largest_gear
        return image.outputs[index].name, image.output_shapes[gear][index]

    def _write_gear(self, dataset: int, index: int, gear: Sequence[int]) -> None:
        """Raises: SimError: no buffer at ``index``, or one too small for the gear."""
        buffers = self.dataset(dataset)
        if index >= len(buffers):
            raise SimError(AclCode.ERROR_GE_DYNAMIC_INPUT_ADDR_INVALID, "S15", "no gear buffer")
        target = buffers[index]
        data = np.asarray(gear, dtype=np.int64).tobytes()
        if target.size < len(data):
            raise SimError(
                AclCode.ERROR_GE_DYNAMIC_INPUT_LENGTH_INVALID, "S15", "gear buffer small"
            )
        self._memory.write(target.ptr, data)

    def set_input_aipp(
        self, model: LoadedModel, dataset: int, index: int, params: AippParameters
    ) -> None:
        """Check ``params`` against the model and write them into its dynamic AIPP input in
        ``dataset`` (module docstring).

        Raises:
            SimError: ``index`` is not the dynamic AIPP input, the parameters do not fit the
                model, or ``dataset`` has no buffer large enough at ``index``.
        """
        image = model.image
        if image.aipp_index is None or index != image.aipp_index:
            raise SimError(
                AclCode.ERROR_INVALID_PARAM,
                "AIPP",
                f"index {index} is not the dynamic AIPP input of the model ({image.aipp_index})",
            )
        check_parameters(image, params)
        buffers = self.dataset(dataset)
        if index >= len(buffers):
            raise SimError(AclCode.ERROR_INVALID_PARAM, "AIPP", f"no data buffer at {index}")
        data = encode(params)
        if buffers[index].size < len(data):
            raise SimError(
                AclCode.ERROR_GE_DYNAMIC_INPUT_LENGTH_INVALID,
                "AIPP",
                f"AIPP input of {buffers[index].size} bytes for {len(data)}",
            )
        self._memory.write(buffers[index].ptr, data)

    def check_io(self, model: LoadedModel, inputs: int, outputs: int) -> None:
        """The datasets have one buffer per model input and output, each in device memory of
        the model's device (module docstring).

        Raises:
            SimError: ``ACL_ERROR_MODEL_INPUT_NOT_MATCH`` / ``..._OUTPUT_NOT_MATCH``,
                ``ACL_ERROR_INVALID_PARAM`` for a buffer elsewhere, or
                ``ACL_ERROR_MEMORY_ADDRESS_UNALIGNED`` for buffers laid out against the
                secondary allocation rule.
        """
        if len(self.dataset(inputs)) != len(model.image.inputs):
            raise SimError(AclCode.ERROR_MODEL_INPUT_NOT_MATCH, "dataset", "input count")
        if len(self.dataset(outputs)) != len(model.image.outputs):
            raise SimError(AclCode.ERROR_MODEL_OUTPUT_NOT_MATCH, "dataset", "output count")
        used = [b for b in [*self.dataset(inputs), *self.dataset(outputs)] if b.size]
        for buffer in used:
            self._check_device_memory(model, buffer)
        self._check_layout(used)

    def _check_layout(self, buffers: Sequence[Buffer]) -> None:
        """Raises: SimError: the buffers break the secondary allocation rule (module
        docstring)."""
        pieces: dict[int, list[tuple[int, int]]] = {}
        for buffer in buffers:
            if buffer.ptr % ALIGN_MODEL:
                raise SimError(
                    AclCode.ERROR_MEMORY_ADDRESS_UNALIGNED,
                    "secondary-allocation",
                    f"data buffer at {buffer.ptr:#x} does not start on a {ALIGN_MODEL}-byte "
                    "boundary",
                )
            start = self._memory.allocation_start(buffer.ptr, buffer.size)
            end = buffer.ptr + segment_bytes(buffer.size)
            pieces.setdefault(start, []).append((buffer.ptr, end))
        for spans in pieces.values():
            for (first, end), (second, _) in itertools.pairwise(sorted(spans)):
                if second < end:
                    raise SimError(
                        AclCode.ERROR_MEMORY_ADDRESS_UNALIGNED,
                        "secondary-allocation",
                        f"data buffers at {first:#x} and {second:#x} of one allocation are "
                        "closer than ALIGN_UP(len, 32) + 32 bytes",
                    )

    def _check_device_memory(self, model: LoadedModel, buffer: Buffer) -> None:
        """Raises: SimError: ``buffer`` is not device memory of the model's device."""
        kind, device = self._memory.owner(buffer.ptr, buffer.size)
        if kind == MemoryKind.DEVICE and device == model.device:
            return
        if kind == MemoryKind.HOST and self._host_is_device:
            return
        where = f"device {device}" if kind == MemoryKind.DEVICE else f"{kind.value} memory"
        raise SimError(
            AclCode.ERROR_INVALID_PARAM,
            "execute-memory",
            f"data buffer at {buffer.ptr:#x} is in {where}; the model runs on device "
            f"{model.device} and reads and writes device memory only",
        )

    @contextlib.contextmanager
    def executing(self, model: LoadedModel) -> Iterator[None]:
        """Mark a synchronous execution of ``model`` (S13).

        Raises:
            SimError: the model is already executing (another thread, or a stream).
        """
        with self._lock:
            if model.busy or model.pending:
                raise SimError(AclCode.ERROR_FAILURE, "S13", "model is already executing")
            model.busy = True
        try:
            yield
        finally:
            with self._lock:
                model.busy = False

    def begin_async(self, model: LoadedModel, stream: int) -> None:
        """Count an ``execute_async`` of ``model`` on ``stream`` (S13).

        Raises:
            SimError: the model is executing synchronously or has work on another stream.
        """
        with self._lock:
            if model.busy or (model.pending and model.stream != stream):
                raise SimError(AclCode.ERROR_FAILURE, "S13", "model is executing elsewhere")
            model.stream = stream
            model.pending += 1

    def end_async(self, model: LoadedModel) -> None:
        """An ``execute_async`` task of ``model`` finished."""
        with self._lock:
            model.pending -= 1

    def run(self, model: LoadedModel, inputs: Sequence[Buffer], outputs: Sequence[Buffer]) -> None:
        """One execution: read the gear, the inputs and a dynamic-AIPP model's parameters from
        memory, run, write the outputs.

        Raises:
            SimError: no valid gear, no or unusable AIPP parameters, a buffer smaller than its
                tensor, or bad memory.
        """
        image = model.image
        shapes = image.shapes[self._gear(image, inputs)]
        arrays = []
        for desc, shape, buffer in zip(
            image.data_inputs, shapes, inputs[: len(shapes)], strict=True
        ):
            nbytes = int(np.prod(shape, dtype=np.int64)) * desc.dtype.itemsize
            _require_room(buffer, nbytes, desc.name)
            data = self._memory.read(buffer.ptr, nbytes)
            arrays.append(np.frombuffer(data, desc.dtype).reshape(shape))
        feeds = self._aipp_feeds(image, inputs, shapes[0])
        self._faults.delay_execution()
        results = image.run(arrays, feeds)
        for result, buffer, desc in zip(results, outputs, image.outputs, strict=True):
            _require_room(buffer, result.nbytes, desc.name)
            self._memory.write(buffer.ptr, np.ascontiguousarray(result).tobytes())

    def live(self) -> dict[str, list[int]]:
        """Models, descriptions, datasets and data buffers not released."""
        with self._lock:
            return {
                "models": list(self._loaded),
                "descs": list(self._descs),
                "datasets": list(self._datasets),
                "data_buffers": list(self._buffers),
            }

    def _aipp_feeds(
        self, image: ModelImage, inputs: Sequence[Buffer], pixels: tuple[int, ...]
    ) -> dict[str, np.ndarray] | None:
        """The AIPP parameters in the dataset as graph inputs for images of shape ``pixels``,
        or None for a model without dynamic AIPP.

        Raises:
            SimError: none were written (``ACL_ERROR_GE_AIPP_NOT_EXIST``), or they do not fit
                the images.
        """
        index = image.aipp_index
        if index is None:
            return None
        size = image.inputs[index].size
        _require_room(inputs[index], size, image.inputs[index].name)
        params = decode(self._memory.read(inputs[index].ptr, size))
        if params is None:
            raise SimError(
                AclCode.ERROR_GE_AIPP_NOT_EXIST,
                "AIPP",
                "the dynamic AIPP input holds no parameters: acl.mdl.set_input_aipp was not "
                "called on this dataset",
            )
        return parameter_feeds(params, pixels, runtime_dtype(image.session))

    def _gear(self, image: ModelImage, inputs: Sequence[Buffer]) -> tuple[int, ...]:
        index = image.dynamic_index
        if index is None:
            return ()
        width = len(image.gears[0])
        _require_room(inputs[index], 8 * width, "ascend_mbatch_shape_data")
        raw = self._memory.read(inputs[index].ptr, 8 * width)
        gear = tuple(int(v) for v in np.frombuffer(raw, np.int64))
        if gear not in image.gears:
            raise SimError(AclCode.ERROR_GE_DYNAMIC_BATCH_SIZE_INVALID, "S15", "no gear was set")
        return gear


def _check_gear_form(image: ModelImage, gear: Gear) -> None:
    """The checks GE makes before looking the gear up (module docstring, S15).

    Raises:
        SimError: ``ACL_ERROR_INVALID_PARAM`` for a zero height/width or an empty dims gear;
            ``ACL_ERROR_GE_DYNAMIC_INPUT_LENGTH_INVALID`` for dims of the wrong count or with
            static dims that differ from the model's.
    """
    if image.kind == DynamicKind.HW and 0 in gear:
        raise SimError(AclCode.ERROR_INVALID_PARAM, "S15", f"height/width {list(gear)} with 0")
    if image.kind != DynamicKind.DIMS:
        return
    if not gear:
        raise SimError(AclCode.ERROR_INVALID_PARAM, "S15", "dimCount is 0")
    expected = [d for t in image.data_inputs for d in t.dims]
    if len(gear) != len(expected) or any(
        e >= 0 and e != g for e, g in zip(expected, gear, strict=True)
    ):
        raise SimError(
            AclCode.ERROR_GE_DYNAMIC_INPUT_LENGTH_INVALID,
            "S15",
            f"dims {list(gear)} do not match the inputs' dims {expected}",
        )


def _require_room(buffer: Buffer, nbytes: int, name: str) -> None:
    if buffer.size < nbytes:
        raise SimError(
            AclCode.ERROR_GE_EXEC_MODEL_DATA_SIZE_INVALID,
            "dataset",
            f"{name}: buffer of {buffer.size} bytes for {nbytes}",
        )

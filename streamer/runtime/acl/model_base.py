"""What the three ACL execution modes share: context, loaded model, batch checks, close.

Thread rules (DESIGN.md §2, §4): one enqueue thread and one dequeue thread per model, each
calling :meth:`AclModel.attach_thread` first, which makes the model's context current
(``acl.rt.set_context``: every thread that touches ACL needs a context). :meth:`close` runs in
the thread that loaded the model, after both have stopped.
"""

from __future__ import annotations

import abc
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import structlog

from streamer.errors import BackendError, FrameError, Reason
from streamer.release import abandon
from streamer.runtime.acl.aipp_set import AippSet
from streamer.runtime.acl.device import DeviceContext
from streamer.runtime.acl.device_tensor import AclDeviceTensor
from streamer.runtime.acl.loaded import LoadedModel
from streamer.runtime.acl.options import ModelOptions
from streamer.runtime.acl.teardown import Teardown
from streamer.runtime.base import DYNAMIC, DeviceTensor, ModelInfo, QueueModel, Tensor

__all__ = ["ModelParts", "AclModel", "batch_problem", "device_problem", "inference_error"]

_log = structlog.get_logger(__name__)


def inference_error(detail: str) -> FrameError:
    """The per-batch error of a failed execution (reason ``inference_failed``)."""
    return FrameError(Reason.INFERENCE_FAILED, detail)


def batch_problem(info: ModelInfo, inputs: Sequence[Tensor]) -> str | None:
    """Why ``inputs`` cannot be executed as one batch of ``info``'s model, or None.

    Checks the count, dtypes, the static dims, one batch size for all inputs, and that the
    batch size is one of ``info.batch_gears`` (when it has any). A dims-gear model's inputs
    may differ in dim 0 (a gear sets every dim of every input; the gear itself is checked by
    :meth:`~streamer.runtime.acl.gears.GearTable.problem`).
    """
    if len(inputs) != len(info.inputs):
        return f"{len(inputs)} inputs for a model with {len(info.inputs)}"
    batch = inputs[0].shape[0] if inputs[0].ndim else None
    for array, tensor in zip(inputs, info.inputs, strict=True):
        expected = tensor.shape
        if array.dtype != tensor.dtype:
            return f"input {tensor.name!r}: dtype {array.dtype}, model takes {tensor.dtype}"
        if array.ndim != len(expected) or any(
            e not in (DYNAMIC, a) for a, e in zip(array.shape, expected, strict=True)
        ):
            return f"input {tensor.name!r}: shape {array.shape}, model takes {list(expected)}"
        if array.shape[0] != batch and not info.dims_gears:
            return f"input {tensor.name!r}: batch {array.shape[0]}, first input has {batch}"
    if info.batch_gears and batch not in info.batch_gears:
        return f"batch {batch} is not one of the model's gears {list(info.batch_gears)}"
    return None


def device_problem(info: ModelInfo, device_id: int, inputs: Sequence[Tensor]) -> str | None:
    """Why a device input (the previous model's output in a ``tensor`` chain) cannot be read
    by a model on ``device_id``, or None: it must be ACL memory of that device, whose one
    context loaded both models (S11)."""
    for tensor, expected in zip(inputs, info.inputs, strict=True):
        if not isinstance(tensor, DeviceTensor):
            continue
        if not isinstance(tensor, AclDeviceTensor) or tensor.device != device_id:
            return (
                f"input {expected.name!r} is in the memory of device {tensor.device} "
                f"({type(tensor).__name__}); model {info.name!r} runs on device {device_id}"
            )
    return None


@dataclass(frozen=True)
class ModelParts:
    """What every executor is built from.

    Attributes:
        acl: the pyACL module.
        device: the device the model was loaded on.
        loaded: model id and description.
        options: per-model options.
        teardown: every release acquired while loading; :meth:`AclModel.close` runs it.
        on_close: called once when the model is closed (the backend forgets it).
        aipp: the filled ``aclmdlAIPP`` of a dynamic-AIPP model, applied to every batch's
            input dataset; None for other models.
        device_outputs: leave the outputs in device memory for the next model of a
            ``tensor`` chain (:mod:`~streamer.runtime.acl.device_tensor`).
    """

    acl: Any
    device: DeviceContext
    loaded: LoadedModel
    options: ModelOptions
    teardown: Teardown
    on_close: Callable[[AclModel], None]
    aipp: AippSet | None = None
    device_outputs: bool = False


class AclModel(QueueModel):
    """Base of the queue, async and sync executors.

    Args:
        parts: the pyACL module, device, loaded model, options, teardown and close hook.
    """

    mode: str

    def __init__(self, parts: ModelParts) -> None:
        self.info = parts.loaded.description.info
        self._acl = parts.acl
        self._device = parts.device
        self._loaded = parts.loaded
        self._options = parts.options
        self._teardown = parts.teardown
        self._on_close = parts.on_close
        self._closed = threading.Event()
        # Set by interrupt() and by close(): enqueues waiting for room give up.
        self._interrupted = threading.Event()
        self._close_lock = threading.Lock()

    @property
    def device_id(self) -> int:
        """The device the model runs on."""
        return self._device.device_id

    @property
    def model_id(self) -> int:
        """The id ACL gave the loaded model; it tells replicas apart in logs."""
        return self._loaded.model_id

    def attach_thread(self) -> None:
        """Make the model's context current in the calling thread (``acl.rt.set_context``).

        Raises:
            AclError: ``set_context`` failed.
        """
        self._device.activate()

    def interrupt(self) -> None:
        """Make an enqueue waiting for room (a slot, queue space, pool memory), and every
        later one, raise BackendError (see :meth:`QueueModel.interrupt`)."""
        self._interrupted.set()

    def _raise_if_interrupted(self) -> None:
        """For an enqueue's waits.

        Raises:
            BackendError: the model was closed or interrupted.
        """
        if self._closed.is_set():
            raise BackendError(f"model {self.info.name!r} is closed")
        if self._interrupted.is_set():
            raise BackendError(f"model {self.info.name!r}: enqueue interrupted")

    def close(self) -> None:
        """Stop the mode's work, then release everything in reverse order. Idempotent.

        Raises:
            AclError: a release failed (every release is still attempted).
            BackendError: the model's work did not finish, so it was abandoned.
        """
        with self._close_lock:
            if self._closed.is_set():
                return
            self._closed.set()
            self._interrupted.set()
        idle = True
        try:
            self._device.activate()
            # On a device already found hung its releases would wait out the timeout again.
            idle = not self._device.hung and self._stop()
        finally:
            self._on_close(self)
            if idle and self._release(self._teardown.close):
                _log.info("acl_model_closed", model=self.info.name, mode=self.mode)
            else:
                self._abandon()

    def _release(self, release: Callable[[], None]) -> bool:
        """Run ``release`` (the model's releases, or some of them) on a thread of its own,
        with the device's context, waiting ``result_timeout_ms`` for it. The wait can end
        only while the releasing thread is in a call that releases the GIL: a tdt queue
        call through ctypes. ``acl.mdl.unload`` (which waits for the model's executions),
        ``acl.rt.free`` and the other pyACL releases hold it (RT
        ``python/pyACL/mdl/mdl_wrap.cpp``), so one of them that hangs stops every Python
        thread until it returns, this wait included; the systemd watchdog then ends the
        process.

        Returns:
            False when they did not end in time (the thread is left in the hung call).

        Raises:
            AclError: a release failed (every release is still attempted).
        """
        failure: list[BaseException] = []

        def run() -> None:
            try:
                self._device.activate()
                release()
            except BaseException as exc:  # noqa: BLE001 - raised on the closing thread
                failure.append(exc)

        thread = threading.Thread(target=run, name=f"release-{self.info.name}", daemon=True)
        thread.start()
        thread.join(self._options.result_timeout_ms / 1000)
        if thread.is_alive():
            return False
        if failure:
            raise failure[0]
        return True

    def _abandon(self) -> None:
        """Leave the model, its stream and its memory to the device reset at process exit:
        its work still runs on the device (a hung execution), and freeing what that work
        reads and writes would be a use-after-free, or its releases hang. The device is
        marked hung, so it is not synchronised (which would wait without end) nor reset
        either.

        Raises:
            BackendError: always, once abandoned: the model could not be released.
        """
        self._device.hung = True
        abandon(f"model {self.info.name!r} on device {self.device_id}")
        dropped = self._teardown.discard()
        _log.error(
            "acl_model_abandoned",
            model=self.info.name,
            mode=self.mode,
            device=self.device_id,
            releases=dropped,
        )
        raise BackendError(
            f"model {self.info.name!r} on device {self.device_id} abandoned: its work on the "
            "device did not finish"
        )

    @abc.abstractmethod
    def _stop(self) -> bool:
        """Finish or give up the work in flight; free per-batch resources unless some of
        that work may still run on the device.

        Returns:
            True when none of the model's work runs on the device any more; False when
            some may (the model is then abandoned, not released).
        """

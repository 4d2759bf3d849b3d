"""Model outputs kept in device memory for the next model of a ``tensor`` chain, or for the
single operators of a postprocessor (``nms = "operator"``; the operators read them in place
and the stage releases them after its postprocessor): no copy.

A model loaded with ``device_outputs`` (:class:`~streamer.runtime.base.ModelSpec`) does not
read its outputs back to the host. In ``sync`` and ``async`` mode each output of a batch is a
segment of the model's memory pool with an ``aclDataBuffer`` over it (in the batch's output
dataset); :meth:`dequeue` returns one :class:`AclDeviceTensor` per output, and the next model,
on the same device and so in the same context, adds that very data buffer to its input
dataset. A data buffer may sit in several datasets: ``acl.mdl.destroy_dataset`` leaves the
buffers to whoever created them (SAM ``python/common/acllite/acllite_model.py`` destroys them
one by one before the dataset). In ``queue`` mode the outputs are dequeued
(``acltdtDequeueData``, into device memory, which the call accepts) into segments of a pool,
and the next model enqueues them from there, or wraps them in a data buffer of its own.
Either way no byte goes to the host between the two models.

Ownership (:class:`~streamer.runtime.base.DeviceTensor`): the outputs of one batch form an
:class:`OutputHold`, owned by the model that made them. The next model takes each tensor over
when its ``enqueue`` is given it, and releases it once the execution that reads it is done: in
its dequeue thread, after that execution's outputs were read (sync and async mode), or as soon
as ``acltdtEnqueueData`` has copied it into the queue (queue mode). Once every tensor of a hold
was released, the hold runs the upstream batch's release (its datasets and data buffers
destroyed, its segments back in the pool), exactly once. Closing the upstream model releases
whatever it still holds out: the pipeline closes the downstream model first.

Rules the simulator checks on the way: model inputs and outputs live in device memory
(``aclmdlExecute`` constraints, HA ``canncommercial/850/API/appdevgapi/aclcppdevg_03_0298``), of
the device whose context loaded the model (S11), and memory and data buffers are freed once.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from streamer.runtime.base import DeviceTensor

__all__ = ["AclDeviceTensor", "HandedOut", "OutputHold"]


class OutputHold:
    """The device outputs of one batch, released when each of its tensors has been.

    Args:
        count: the tensors that share it.
        release: frees the batch's memory (its teardown); run once, on the last drop.
        forget: called once released (the model stops tracking it).
    """

    def __init__(
        self, count: int, release: Callable[[], None], forget: Callable[[OutputHold], None]
    ) -> None:
        self._lock = threading.Lock()
        self._left = count
        self._release = release
        self._forget = forget
        self._done = False

    def drop(self) -> None:
        """One tensor is released; the last one releases the batch. Any thread.

        Raises:
            AclError: a release failed (the rest still ran).
        """
        with self._lock:
            self._left -= 1
            last = self._left == 0
        if last:
            self.release_now()

    def release_now(self) -> None:
        """Release the batch's memory now whatever still refers to it; idempotent.

        Raises:
            AclError: a release failed (the rest still ran).
        """
        with self._lock:
            if self._done:
                return
            self._done = True
        self._forget(self)
        self._release()


class HandedOut:
    """The holds a model handed out and that are not released yet; thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._holds: set[OutputHold] = set()

    def hold(self, count: int, release: Callable[[], None]) -> OutputHold:
        """A new hold of ``count`` tensors over ``release``."""
        hold = OutputHold(count, release, self._forget)
        with self._lock:
            self._holds.add(hold)
        return hold

    def release_all(self) -> None:
        """Release every hold still out (the model is closing)."""
        with self._lock:
            holds = list(self._holds)
        for hold in holds:
            hold.release_now()

    def _forget(self, hold: OutputHold) -> None:
        with self._lock:
            self._holds.discard(hold)


@dataclass(eq=False)
class AclDeviceTensor(DeviceTensor):
    """One output of a batch, in device memory.

    Attributes:
        ptr: its device address.
        nbytes: the bytes there (the output's size for the largest gear, at least the
            tensor's).
        shape, dtype, device: see :class:`~streamer.runtime.base.DeviceTensor`.
        data_buffer: the ``aclDataBuffer`` over it (sync and async mode), or 0 (queue mode).
        hold: the batch's hold.
    """

    ptr: int
    nbytes: int
    shape: tuple[int, ...]
    dtype: np.dtype[Any]
    device: int
    data_buffer: int
    hold: OutputHold
    _released: bool = field(default=False, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def release(self) -> None:
        """Drop this tensor from its hold, once; any thread.

        Raises:
            AclError: the batch's release failed.
        """
        with self._lock:
            if self._released:
                return
            self._released = True
        self.hold.drop()

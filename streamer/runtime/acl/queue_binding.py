"""A queue-mode model and the tdt queues it is bound to, loaded and released as one.

Load (HA ``…/appdevg/acldevg/aclcppdevg_000035.html``; seeds "队列方式模型推理"): create one
queue per model input and output (:func:`~streamer.runtime.acl.tdt.create_model_queues`), then
load the model bound to them (``aclmdlLoadFromFileWithQ``) and read its description. Release,
newest first: unload the model and destroy its description (queue-mode page, step 4), then
destroy the queues and their attribute. Every call runs in the context that is current on
the calling thread, which must be the device's (S11).

A binding can be released and loaded again (:meth:`QueueBinding.unbind`, then
:meth:`QueueBinding.bind`): a model that lost an output is reloaded so, on queues of new
names, so that nothing its old queues still held can reach its new outputs
(:meth:`~streamer.runtime.acl.model_queue.QueueModeModel.reload`).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import Any

from streamer.errors import BackendError
from streamer.runtime.acl.loaded import LoadedModel, load_model
from streamer.runtime.acl.tdt import TdtQueueApi, create_model_queues, queue_prefix
from streamer.runtime.acl.teardown import Teardown

__all__ = ["LoadWithQ", "QueueBinding"]

LoadWithQ = Callable[[Sequence[int], Sequence[int]], int]
"""Loads the model file bound to ``(input queue ids, output queue ids)`` in the current
context and returns its model id (:meth:`~streamer.runtime.acl.withq.WithQLoader.load`).
Raises AclError."""


class QueueBinding:
    """The loaded model and its queues, or nothing between an :meth:`unbind` and a
    :meth:`bind`; thread-safe.

    Args:
        acl: the pyACL module.
        tdt: the queue API.
        load: loads the model bound to given queues.
        name: the model (stage) name, for queue names and messages.
        device_id: the device, for queue names.
        depth: the depth of each queue (``queue_depth``, >= 2).
        counts: the model's inputs and outputs: one queue each.

    Attributes:
        queues: ``(input queue ids, output queue ids)`` of the last :meth:`bind`.
    """

    def __init__(
        self,
        acl: Any,
        tdt: TdtQueueApi,
        load: LoadWithQ,
        name: str,
        device_id: int,
        depth: int,
        counts: tuple[int, int],
    ) -> None:
        self._acl = acl
        self._tdt = tdt
        self._load = load
        self._name = name
        self._device_id = device_id
        self._depth = depth
        self._counts = counts
        self._lock = threading.Lock()
        self._closed = threading.Event()
        self._teardown: Teardown | None = None
        self.queues: tuple[list[int], list[int]] = ([], [])

    def bind(self) -> LoadedModel:
        """Create the queues (names no other queue has, :func:`queue_prefix`) and load the
        model bound to them, in the calling thread's context; the loaded model.

        Raises:
            AclError: a queue call, the load or its description failed (what was created is
                released first).
            ModelError: the model has a tensor type streamer cannot represent.
            BackendError: the binding was closed, or is bound already.
        """
        with self._lock:
            if self._closed.is_set() or self._teardown is not None:
                state = "closed" if self._closed.is_set() else "bound already"
                raise BackendError(f"model {self._name!r}: its queue binding is {state}")
            teardown = Teardown()
            with teardown.on_error():
                prefix = queue_prefix(self._name, self._device_id, *self._counts)
                counts = self._counts
                queues = create_model_queues(self._tdt, prefix, self._depth, *counts, teardown)
                loaded = load_model(self._acl, self._name, lambda: self._load(*queues), teardown)
            self._teardown, self.queues = teardown, queues
            return loaded

    def unbind(self) -> None:
        """Unload the model, then destroy its queues (nothing while unbound). The unload waits
        for the model's executions in progress (RT ``acl.mdl.unload``).

        Raises:
            AclError: a release failed (every release is still attempted, and none is run
                again).
        """
        with self._lock:
            teardown, self._teardown = self._teardown, None
            if teardown is not None:
                teardown.close()

    def close(self) -> None:
        """:meth:`unbind` for good: a later :meth:`bind` is refused. Idempotent.

        Raises:
            AclError: as :meth:`unbind`.
        """
        self._closed.set()
        self.unbind()

"""Simulated tdt queues and queue-bound ("WithQ") model execution.

Rules (reference/pyacl.md §3 and §9; HA ``…/aclcppdevg_000035.html``, ``aclcppdevg_03_1309``):
    S18: a WithQ model has exactly one queue per input and per output
        (``ACL_ERROR_GE_EXEC_MODEL_QUEUE_ID_INVALID``).
    S23: depth defaults to 8, a depth below 2 or a name of 128 bytes or more (with its NUL)
        is refused (``ACL_ERROR_INVALID_PARAM``); ``acltdtCreateQueue(NULL)`` makes an
        auto-named queue of depth 8.
    S24: enqueue with ``size == 0``, ``userDataSize > 96`` or ``rsv != 0`` fails.
    S25: enqueue on a full queue returns ``ACL_ERROR_RT_QUEUE_FULL`` (207014), dequeue on an
        empty one ``ACL_ERROR_RT_QUEUE_EMPTY`` (207013).
    S26: ``timeout == 0`` is refused in ``ACL_HOST`` run mode; ``-1`` blocks; ``> 0`` waits
        that long, then returns 207013/207014 or 507012 (``queue_timeout_code``: undocumented).
    S27: dequeue copies into the caller's buffer: it peeks first and refuses an item larger
        than ``dataSize`` (the item stays queued), then sets ``*retSize``.
    S28: one host thread enqueues into all inputs of a model, one dequeues all its outputs,
        and a queue has one producer and one consumer (the model is the other end of a bound
        queue). Another live thread gets ``ACL_ERROR_FAILURE``; a dead owner is replaced.
    S29: ``acltdtEnqueue`` / ``acltdtDequeue`` return ``ACL_ERROR_FEATURE_UNSUPPORTED``.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from streamer.runtime.acl.constants import (
    QUEUE_DEPTH_DEFAULT,
    QUEUE_DEPTH_MIN,
    QUEUE_NAME_MAX_BYTES,
    TDT_USER_DATA_MAX_BYTES,
    AclCode,
)
from streamer.runtime.acl.sim.binding import SimError
from streamer.runtime.acl.sim.faults import Faults
from streamer.runtime.acl.sim.memory import SimMemory
from streamer.runtime.acl.sim.models import LoadedModel

__all__ = ["QueueTimeouts", "SimQueue", "SimQueues"]


@dataclass(frozen=True)
class QueueTimeouts:
    """How timeouts behave: ``timeout == 0`` allowed (device run mode) and expiry codes."""

    zero_allowed: bool
    full_code: int
    empty_code: int


@dataclass(eq=False)
class SimQueue:
    """One queue: ``(data, user_data)`` items, owners, the model bound to it, and the device
    of the context current when it was created (None: no context was)."""

    qid: int
    name: str
    depth: int
    items: deque[tuple[bytes, bytes]] = field(default_factory=deque)
    producer: int | None = None
    consumer: int | None = None
    model: LoadedModel | None = None
    model_input: bool = False
    device: int | None = None


def _alive(thread_id: int) -> bool:
    return any(t.ident == thread_id for t in threading.enumerate())


class SimQueues:
    """Queue attributes, queues and WithQ schedulers; thread-safe.

    Args:
        memory: where enqueued data is read from and dequeued data written to.
        faults: injected queue-full reports and failed executions.
        timeouts: run-mode dependent timeout rules.
        on_error: records an error of a WithQ execution (there is no caller to return it to).
    """

    def __init__(
        self,
        memory: SimMemory,
        faults: Faults,
        timeouts: QueueTimeouts,
        on_error: Callable[[SimError], None],
    ) -> None:
        self._memory = memory
        self._faults = faults
        self._timeouts = timeouts
        self._on_error = on_error
        self._cond = threading.Condition()
        self._attrs: dict[int, dict[str, object]] = {}
        self._queues: dict[int, SimQueue] = {}
        self._qids = itertools.count(1)
        self._handles = itertools.count(0x7A00_0000_0100, 0x100)
        self._schedulers: dict[int, threading.Thread] = {}
        self.failed_executions = 0

    # Attributes and queues ------------------------------------------------------------------

    def create_attr(self) -> int:
        with self._cond:
            handle = next(self._handles)
            self._attrs[handle] = {"name": None, "depth": QUEUE_DEPTH_DEFAULT}
            return handle

    def set_name(self, attr: int, length: int, name: bytes | None, pointer_size: int) -> None:
        """Raises: SimError: unknown attr, wrong ``len``, or a name too long (S23)."""
        if length != pointer_size or name is None:
            raise SimError(
                AclCode.ERROR_INVALID_PARAM,
                "S23",
                "name needs param = the address of a char* and len == sizeof(char*)",
            )
        if len(name) + 1 > QUEUE_NAME_MAX_BYTES:
            raise SimError(AclCode.ERROR_INVALID_PARAM, "S23", f"name of {len(name)} bytes")
        self._attr(attr)["name"] = name.decode()

    def set_depth(self, attr: int, length: int, depth: int) -> None:
        """Raises: SimError: unknown attr, wrong ``len``, or depth below 2 (S23)."""
        if length != 4:
            raise SimError(AclCode.ERROR_INVALID_PARAM, "S23", "depth needs len == 4")
        if depth < QUEUE_DEPTH_MIN:
            raise SimError(AclCode.ERROR_INVALID_PARAM, "S23", f"depth {depth} < {QUEUE_DEPTH_MIN}")
        self._attr(attr)["depth"] = depth

    def destroy_attr(self, attr: int) -> None:
        """Raises: SimError: unknown attr."""
        with self._cond:
            if self._attrs.pop(attr, None) is None:
                raise SimError(AclCode.ERROR_INVALID_PARAM, None, f"no queue attr {attr:#x}")

    def create_queue(self, attr: int, device: int | None = None) -> int:
        """A queue from ``attr`` (0 = NULL: auto-named, depth 8) on ``device`` (that of the
        current context, if any).

        Raises:
            SimError: unknown attr.
        """
        settings = self._attr(attr) if attr else {"name": None, "depth": QUEUE_DEPTH_DEFAULT}
        with self._cond:
            qid = next(self._qids)
            name = str(settings["name"] or f"queue_{qid}")
            depth = settings["depth"]
            assert isinstance(depth, int)
            self._queues[qid] = SimQueue(qid, name, depth, device=device)
            return qid

    def destroy_queue(self, qid: int) -> None:
        """Raises: SimError: unknown queue."""
        with self._cond:
            if self._queues.pop(qid, None) is None:
                raise SimError(AclCode.ERROR_INVALID_QUEUE_ID, None, f"no queue {qid}")
            self._cond.notify_all()

    # Host side ------------------------------------------------------------------------------

    def enqueue(
        self, qid: int, data: int, size: int, user: int, user_size: int, timeout: int, rsv: int
    ) -> None:
        """``acltdtEnqueueData``: S24 to S26, S28.

        Raises:
            SimError: bad arguments, another producer thread, the queue full until the timeout.
        """
        if size == 0 or user_size > TDT_USER_DATA_MAX_BYTES or rsv != 0 or data == 0:
            raise SimError(AclCode.ERROR_INVALID_PARAM, "S24", "size 0, userData > 96 or rsv")
        self._check_timeout(timeout)
        if self._faults.queue_full():
            raise SimError(AclCode.ERROR_RT_QUEUE_FULL, None, "injected queue full")
        payload = self._memory.read(data, size)
        user_data = self._memory.read(user, user_size) if user and user_size else b""
        with self._cond:
            queue = self._queue(qid)
            if queue.model is not None and not queue.model_input:
                raise SimError(AclCode.ERROR_FAILURE, "S28", "the model produces this queue")
            self._claim(queue, "producer")
            if not self._wait(lambda: len(queue.items) < queue.depth, qid, timeout):
                raise SimError(self._timeouts.full_code, None, f"queue {qid} full")
            queue.items.append((payload, user_data))
            self._cond.notify_all()

    def dequeue(self, qid: int, data: int, size: int, timeout: int) -> tuple[int, bytes]:
        """``acltdtDequeueData``: S25 to S28. Returns ``(retSize, userData)``.

        Raises:
            SimError: bad arguments, another consumer thread, the queue empty until the
                timeout, or an item larger than ``size``.
        """
        self._check_timeout(timeout)
        with self._cond:
            queue = self._queue(qid)
            if queue.model is not None and queue.model_input:
                raise SimError(AclCode.ERROR_FAILURE, "S28", "the model consumes this queue")
            self._claim(queue, "consumer")
            if not self._wait(lambda: bool(queue.items), qid, timeout):
                raise SimError(self._timeouts.empty_code, None, f"queue {qid} empty")
            payload, user = queue.items[0]
            if len(payload) > size:
                raise SimError(AclCode.ERROR_INVALID_PARAM, "S27", f"item {len(payload)} > {size}")
            self._memory.write(data, payload)
            queue.items.popleft()
            self._cond.notify_all()
            return len(payload), user

    # Queue-bound models ---------------------------------------------------------------------

    def bind(self, model: LoadedModel, inputs: Sequence[int], outputs: Sequence[int]) -> None:
        """Attach queues to a WithQ model and start its scheduler (S18).

        Raises:
            SimError: wrong number of queues, or unknown / already bound queues.
        """
        image = model.image
        if len(inputs) != len(image.inputs) or len(outputs) != len(image.outputs):
            raise SimError(AclCode.ERROR_GE_EXEC_MODEL_QUEUE_ID_INVALID, "S18", "queue count")
        with self._cond:
            queues = [self._queues.get(q) for q in [*inputs, *outputs]]
            if any(q is None or q.model is not None for q in queues):
                raise SimError(AclCode.ERROR_GE_EXEC_MODEL_QUEUE_ID_INVALID, "S18", "queue ids")
            for index, queue in enumerate(queues):
                assert queue is not None
                queue.model = model
                queue.model_input = index < len(inputs)
            model.queues = (tuple(inputs), tuple(outputs))
        name = f"acl-sim-model-{model.model_id}"
        scheduler = threading.Thread(target=self._serve, args=(model,), name=name, daemon=True)
        self._schedulers[model.model_id] = scheduler
        scheduler.start()

    def unbind(self, model: LoadedModel) -> None:
        """Stop a WithQ model's scheduler (after ``unload`` set ``model.stopped``)."""
        with self._cond:
            self._cond.notify_all()
            for queue in self._queues.values():
                if queue.model is model:
                    queue.model = None
        scheduler = self._schedulers.pop(model.model_id, None)
        if scheduler is not None:
            scheduler.join()

    def names(self) -> dict[int, str]:
        """The name of every live queue, by queue id."""
        with self._cond:
            return {qid: queue.name for qid, queue in self._queues.items()}

    def bound_model(self, qid: int) -> int | None:
        """The id of the loaded model queue ``qid`` is bound to, or None."""
        with self._cond:
            queue = self._queues.get(qid)
            return None if queue is None or queue.model is None else queue.model.model_id

    def on_device(self, device: int) -> list[int]:
        """The live queues created in a context of ``device``."""
        with self._cond:
            return [qid for qid, queue in self._queues.items() if queue.device == device]

    def live(self) -> dict[str, list[int]]:
        """Queues and queue attributes not destroyed."""
        with self._cond:
            return {"queues": list(self._queues), "queue_attrs": list(self._attrs)}

    # Internals ------------------------------------------------------------------------------

    def _attr(self, attr: int) -> dict[str, object]:
        with self._cond:
            settings = self._attrs.get(attr)
        if settings is None:
            raise SimError(AclCode.ERROR_INVALID_PARAM, None, f"no queue attr {attr:#x}")
        return settings

    def _queue(self, qid: int) -> SimQueue:
        queue = self._queues.get(qid)
        if queue is None:
            raise SimError(AclCode.ERROR_INVALID_QUEUE_ID, None, f"no queue {qid}")
        return queue

    def _check_timeout(self, timeout: int) -> None:
        if timeout < -1 or (timeout == 0 and not self._timeouts.zero_allowed):
            raise SimError(AclCode.ERROR_INVALID_PARAM, "S26", f"timeout {timeout} in this mode")

    def _claim(self, queue: SimQueue, role: str) -> None:
        owner: SimQueue | LoadedModel = queue
        attr = role
        if queue.model is not None:
            owner = queue.model
            attr = "input_producer" if role == "producer" else "output_consumer"
        me = threading.get_ident()
        current = getattr(owner, attr)
        if current not in (None, me) and _alive(current):
            raise SimError(AclCode.ERROR_FAILURE, "S28", f"thread {current} is the {role}")
        setattr(owner, attr, me)

    def _wait(self, ready: Callable[[], bool], qid: int, timeout: int) -> bool:
        """Wait on the condition (held) until ``ready``; False on timeout.

        Raises:
            SimError: the queue was destroyed meanwhile.
        """
        deadline = None if timeout < 0 else time.monotonic() + timeout / 1000
        while not ready():
            remaining = None if deadline is None else deadline - time.monotonic()
            if remaining is not None and remaining <= 0:
                return False
            self._cond.wait(remaining)
            if qid not in self._queues:
                raise SimError(AclCode.ERROR_INVALID_QUEUE_ID, None, f"queue {qid} destroyed")
        return True

    def _serve(self, model: LoadedModel) -> None:
        """The device side of a WithQ model: take one item per input, execute, fill outputs."""
        assert model.queues is not None
        inputs, outputs = model.queues
        while (payloads := self._take(model, inputs)) is not None:
            if self._faults.execution_fails(model.device):
                self.failed_executions += 1
                continue
            try:
                results = self._execute(model, payloads)
            except SimError as err:
                self.failed_executions += 1
                self._on_error(err)
                continue
            if not self._put(model, outputs, results):
                return

    def _take(self, model: LoadedModel, qids: Sequence[int]) -> list[bytes] | None:
        with self._cond:
            while not model.stopped.is_set():
                queues = [self._queues.get(q) for q in qids]
                if any(q is None for q in queues):
                    return None
                if all(q.items for q in queues if q is not None):
                    taken = [q.items.popleft()[0] for q in queues if q is not None]
                    self._cond.notify_all()
                    return taken
                self._cond.wait(0.05)
            return None

    def _execute(self, model: LoadedModel, payloads: list[bytes]) -> list[bytes]:
        image = model.image
        shapes = image.shapes[()]
        arrays = []
        for desc, shape, payload in zip(image.inputs, shapes, payloads, strict=True):
            if len(payload) != desc.size:
                raise SimError(
                    AclCode.ERROR_GE_EXEC_MODEL_DATA_SIZE_INVALID,
                    "queue-data",
                    f"{desc.name}: {len(payload)} bytes for {desc.size}",
                )
            arrays.append(np.frombuffer(payload, desc.dtype).reshape(shape))
        self._faults.delay_execution()
        return [np.ascontiguousarray(result).tobytes() for result in image.run(arrays)]

    def _put(self, model: LoadedModel, qids: Sequence[int], results: list[bytes]) -> bool:
        with self._cond:
            for qid, payload in zip(qids, results, strict=True):
                while True:
                    queue = self._queues.get(qid)
                    if queue is None or model.stopped.is_set():
                        return False
                    if len(queue.items) < queue.depth:
                        queue.items.append((payload, b""))
                        self._cond.notify_all()
                        break
                    self._cond.wait(0.05)
        return True

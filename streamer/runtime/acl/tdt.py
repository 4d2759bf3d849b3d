"""The tdt queue C API through ctypes: pyACL has no queue functions (reference/pyacl.md §1.1).

Signatures from RT ``include/external/acl/acl_tdt_queue.h``; the library is
``libacl_tdt_queue.so`` (RT ``src/acl/acl_tdt_queue/CMakeLists.txt``). A model bound to queues
gets one queue per input and one per output, created from one attribute object that carries
the depth and, before each creation, the queue's name (HA ``…/aclcppdevg_000035.html``).
Teardown order: destroy the queues, then the attribute.
"""

from __future__ import annotations

import ctypes
import itertools
import secrets
from typing import Any

import structlog

from streamer.runtime.acl.constants import QUEUE_NAME_MAX_BYTES, QueueAttr
from streamer.runtime.acl.errors import check_handle, check_ret
from streamer.runtime.acl.teardown import Teardown

__all__ = ["TdtQueueApi", "create_model_queues", "queue_prefix"]

_log = structlog.get_logger(__name__)

_SERIALS = itertools.count()
"""Numbers the sets of queues this process creates, so no two replicas share a name."""
_PROCESS_TAG = secrets.token_hex(4)
"""Tells this process's queues from another's on the same device."""

_P = ctypes.c_void_p
_SIGNATURES: dict[str, tuple[list[Any], Any]] = {
    "acltdtCreateQueueAttr": ([], _P),
    "acltdtSetQueueAttr": ([_P, ctypes.c_int, ctypes.c_size_t, _P], ctypes.c_int),
    "acltdtDestroyQueueAttr": ([_P], ctypes.c_int),
    "acltdtCreateQueue": ([_P, ctypes.POINTER(ctypes.c_uint32)], ctypes.c_int),
    "acltdtDestroyQueue": ([ctypes.c_uint32], ctypes.c_int),
    "acltdtEnqueueData": (
        [
            ctypes.c_uint32,
            _P,
            ctypes.c_size_t,
            _P,
            ctypes.c_size_t,
            ctypes.c_int32,
            ctypes.c_uint32,
        ],
        ctypes.c_int,
    ),
    "acltdtDequeueData": (
        [
            ctypes.c_uint32,
            _P,
            ctypes.c_size_t,
            ctypes.POINTER(ctypes.c_size_t),
            _P,
            ctypes.c_size_t,
            ctypes.c_int32,
        ],
        ctypes.c_int,
    ),
}


class TdtQueueApi:
    """Typed bindings of the queue functions of one loaded library.

    Args:
        lib: ``ctypes.CDLL("libacl_tdt_queue.so")``, or the simulator's stand-in.

    Raises:
        AttributeError: the library lacks one of the functions.
    """

    def __init__(self, lib: Any) -> None:
        self._lib = lib
        for name, (argtypes, restype) in _SIGNATURES.items():
            function = getattr(lib, name)
            function.argtypes = argtypes
            function.restype = restype

    @classmethod
    def load(cls, name: str) -> TdtQueueApi | None:
        """Bind the library ``name``, or None when it cannot be loaded (no queue mode)."""
        try:
            return cls(ctypes.CDLL(name))
        except (OSError, AttributeError) as exc:
            _log.info("acl_tdt_unavailable", library=name, detail=str(exc))
            return None

    def create_attr(self) -> int:
        """``acltdtCreateQueueAttr``. Raises: AclError: it returned NULL."""
        return check_handle(self._lib.acltdtCreateQueueAttr(), "acltdtCreateQueueAttr")

    def set_name(self, attr: int, name: str) -> None:
        """``ACL_TDT_QUEUE_NAME_PTR``: ``param`` is the address of a ``char*``.

        Raises:
            AclError: refused (e.g. 128 bytes or more with the NUL).
        """
        pointer = ctypes.c_char_p(name.encode())
        size = ctypes.sizeof(ctypes.c_char_p)
        ret = self._lib.acltdtSetQueueAttr(attr, QueueAttr.NAME_PTR, size, ctypes.byref(pointer))
        check_ret(ret, "acltdtSetQueueAttr")

    def set_depth(self, attr: int, depth: int) -> None:
        """``ACL_TDT_QUEUE_DEPTH_UINT32``. Raises: AclError: refused (depth < 2)."""
        value = ctypes.c_uint32(depth)
        ret = self._lib.acltdtSetQueueAttr(
            attr, QueueAttr.DEPTH_UINT32, ctypes.sizeof(value), ctypes.byref(value)
        )
        check_ret(ret, "acltdtSetQueueAttr")

    def destroy_attr(self, attr: int) -> int:
        """``acltdtDestroyQueueAttr``; returns its code."""
        return int(self._lib.acltdtDestroyQueueAttr(attr))

    def create_queue(self, attr: int) -> int:
        """``acltdtCreateQueue``; returns the queue id. Raises: AclError: refused."""
        qid = ctypes.c_uint32(0)
        check_ret(self._lib.acltdtCreateQueue(attr, ctypes.byref(qid)), "acltdtCreateQueue")
        return qid.value

    def destroy_queue(self, qid: int) -> int:
        """``acltdtDestroyQueue``; returns its code."""
        return int(self._lib.acltdtDestroyQueue(qid))

    def enqueue(self, qid: int, data: int, size: int, timeout_ms: int) -> int:
        """``acltdtEnqueueData`` of ``size`` bytes at ``data`` without user data.

        Args:
            timeout_ms: -1 blocks; 0 is valid only in ``ACL_DEVICE`` run mode; > 0 waits.

        Returns:
            The aclError code; :data:`~streamer.runtime.acl.errors.QUEUE_WAIT_CODES` mean full.
        """
        return int(self._lib.acltdtEnqueueData(qid, data, size, None, 0, timeout_ms, 0))

    def dequeue(self, qid: int, data: int, size: int, timeout_ms: int) -> tuple[int, int]:
        """``acltdtDequeueData`` into the caller's ``size`` bytes at ``data``.

        Returns:
            ``(code, bytes written)``; :data:`~streamer.runtime.acl.errors.QUEUE_WAIT_CODES`
            mean empty.
        """
        written = ctypes.c_size_t(0)
        ret = self._lib.acltdtDequeueData(
            qid, data, size, ctypes.byref(written), None, 0, timeout_ms
        )
        return int(ret), written.value


def queue_prefix(model: str, device: int, inputs: int, outputs: int) -> str:
    """``<model>.<process tag>.d<device>.r<serial>``: a name prefix no other set of queues
    has, whether of this process (replicas of one model, on one device or several) or of
    another daemon sharing the device (one ``streamer@`` instance per device range, or a
    container, where process ids repeat: the tag is random), with the model
    name cut (at a character boundary) so that the longest queue name, ``<prefix>.in<i>`` /
    ``<prefix>.out<i>``, fits the 128 bytes of a queue name, NUL included
    (:data:`~streamer.runtime.acl.constants.QUEUE_NAME_MAX_BYTES`)."""
    tail = f".{_PROCESS_TAG}.d{device}.r{next(_SERIALS)}"
    suffix = max(len(f".in{inputs - 1}"), len(f".out{outputs - 1}"))
    budget = QUEUE_NAME_MAX_BYTES - 1 - len(tail) - suffix
    return model.encode()[:budget].decode(errors="ignore") + tail


def create_model_queues(
    api: TdtQueueApi, prefix: str, depth: int, inputs: int, outputs: int, teardown: Teardown
) -> tuple[list[int], list[int]]:
    """One attribute, then one queue per model input and output, named ``<prefix>.in<i>`` /
    ``<prefix>.out<i>`` (``prefix`` from :func:`queue_prefix`); releases are pushed on
    ``teardown``.

    Returns:
        ``(input queue ids, output queue ids)``.

    Raises:
        AclError: a queue call failed (what was created is released by ``teardown``).
    """
    attr = api.create_attr()
    teardown.push("acltdtDestroyQueueAttr", api.destroy_attr, attr)
    api.set_depth(attr, depth)

    def create(suffix: str) -> int:
        api.set_name(attr, f"{prefix}.{suffix}")
        qid = api.create_queue(attr)
        teardown.push("acltdtDestroyQueue", api.destroy_queue, qid)
        return qid

    return [create(f"in{i}") for i in range(inputs)], [create(f"out{i}") for i in range(outputs)]

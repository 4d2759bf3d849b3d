"""The simulated ``libacl_tdt_queue.so`` (RT ``include/external/acl/acl_tdt_queue.h``).

Exports the queue functions streamer calls, plus ``acltdtEnqueue`` / ``acltdtDequeue`` that
refuse to work (S29), and not ``acltdtQueryQueue``, which the public header does not declare.
``acltdtDestroyQueue`` refuses a queue still bound to a loaded model (rule ``teardown``,
:mod:`~streamer.runtime.acl.sim.teardown`).
"""

from __future__ import annotations

import ctypes
from typing import TYPE_CHECKING, Any

from streamer.runtime.acl.constants import AclCode, QueueAttr
from streamer.runtime.acl.sim import teardown
from streamer.runtime.acl.sim.binding import SimError
from streamer.runtime.acl.sim.cfunc import CFunction, SimLibrary

if TYPE_CHECKING:
    from streamer.runtime.acl.sim.simulator import Simulator

__all__ = ["build_tdt_library"]

_P = ctypes.c_void_p
_INT = ctypes.c_int
_U32 = ctypes.c_uint32
_SIZE = ctypes.c_size_t


def build_tdt_library(sim: Simulator) -> SimLibrary:
    """The library object the tdt wrapper loads instead of the real one."""

    def create_attr() -> int:
        return sim.queues.create_attr()

    def set_attr(attr: int, kind: int, length: int, param: Any) -> int:
        if kind == QueueAttr.NAME_PTR:
            name = param.value if isinstance(param, ctypes.c_char_p) else None
            sim.queues.set_name(attr, length, name, ctypes.sizeof(ctypes.c_char_p))
        elif kind == QueueAttr.DEPTH_UINT32 and isinstance(param, ctypes.c_uint32):
            sim.queues.set_depth(attr, length, param.value)
        else:
            raise SimError(AclCode.ERROR_INVALID_PARAM, "S23", f"attr type {kind} / {param!r}")
        return 0

    def create_queue(attr: int, qid: ctypes.c_uint32) -> int:
        qid.value = sim.queues.create_queue(attr, sim.devices.current_device())
        return 0

    def destroy_queue(qid: int) -> int:
        teardown.check_destroy_queue(sim, qid)
        sim.queues.destroy_queue(qid)
        return 0

    def enqueue_data(
        qid: int, data: int, size: int, user: int, user_size: int, timeout: int, rsv: int
    ) -> int:
        sim.queues.enqueue(qid, data, size, user, user_size, timeout, rsv)
        return 0

    def dequeue_data(
        qid: int,
        data: int,
        size: int,
        ret_size: ctypes.c_size_t,
        user: int,
        user_size: int,
        timeout: int,
    ) -> int:
        got, user_data = sim.queues.dequeue(qid, data, size, timeout)
        ret_size.value = got
        if user and user_size and user_data:
            sim.memory.write(user, user_data[:user_size])
        return 0

    def unsupported(*_args: Any) -> int:
        raise SimError(AclCode.ERROR_FEATURE_UNSUPPORTED, "S29", "buffer queue API unsupported")

    def func(name: str, argtypes: list[Any], restype: Any, impl: Any) -> CFunction:
        return CFunction(name, argtypes, restype, impl, sim.binder)

    return SimLibrary(
        "libacl_tdt_queue.so",
        [
            func("acltdtCreateQueueAttr", [], _P, create_attr),
            func("acltdtSetQueueAttr", [_P, _INT, _SIZE, _P], _INT, set_attr),
            func("acltdtDestroyQueueAttr", [_P], _INT, _ok(sim.queues.destroy_attr)),
            func("acltdtCreateQueue", [_P, ctypes.POINTER(_U32)], _INT, create_queue),
            func("acltdtDestroyQueue", [_U32], _INT, destroy_queue),
            func(
                "acltdtEnqueueData",
                [_U32, _P, _SIZE, _P, _SIZE, ctypes.c_int32, _U32],
                _INT,
                enqueue_data,
            ),
            func(
                "acltdtDequeueData",
                [_U32, _P, _SIZE, ctypes.POINTER(_SIZE), _P, _SIZE, ctypes.c_int32],
                _INT,
                dequeue_data,
            ),
            func("acltdtEnqueue", [_U32, _P, ctypes.c_int32], _INT, unsupported),
            func("acltdtDequeue", [_U32, ctypes.POINTER(_P), ctypes.c_int32], _INT, unsupported),
        ],
    )


def _ok(action: Any) -> Any:
    def call(*args: Any) -> int:
        action(*args)
        return 0

    return call

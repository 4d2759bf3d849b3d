"""Simulator rules of tdt queues and queue-bound models (reference/pyacl.md §9, S17, S18,
S23-S29), driven through streamer's ctypes wrapper so the wrapper is checked as well."""

from __future__ import annotations

import ctypes
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from acl_testing import MakeModel, Reference, in_thread, open_device, rules

from streamer.runtime.acl.constants import AclCode
from streamer.runtime.acl.errors import AclError
from streamer.runtime.acl.options import SimOptions
from streamer.runtime.acl.sim.binding import SimulatorFault
from streamer.runtime.acl.sim.simulator import Simulator
from streamer.runtime.acl.tdt import TdtQueueApi
from streamer.runtime.acl.teardown import Teardown
from streamer.runtime.acl.withq import WithQLoader

pytestmark = pytest.mark.timeout(30)

EMPTY, FULL = AclCode.ERROR_RT_QUEUE_EMPTY, AclCode.ERROR_RT_QUEUE_FULL


class Queues:
    """A simulator with a device open, its tdt API, and helpers for data and buffers."""

    def __init__(self, **options: object) -> None:
        self.sim = Simulator(SimOptions(**options))  # type: ignore[arg-type]
        open_device(self.sim)
        self.tdt = TdtQueueApi(self.sim.tdt_library)
        self.keep: list[bytes] = []

    def queue(self, depth: int | None = None, name: str = "q") -> int:
        attr = self.tdt.create_attr()
        if depth is not None:
            self.tdt.set_depth(attr, depth)
        self.tdt.set_name(attr, name)
        return self.tdt.create_queue(attr)

    def data(self, payload: bytes) -> tuple[int, int]:
        self.keep.append(payload)
        return self.sim.acl.util.bytes_to_ptr(payload), len(payload)

    def put(self, qid: int, payload: bytes, timeout_ms: int = 10) -> int:
        ptr, size = self.data(payload)
        return self.tdt.enqueue(qid, ptr, size, timeout_ms)

    def buffer(self, size: int) -> int:
        ptr, ret = self.sim.acl.rt.malloc_host(size)
        assert ret == 0
        return int(ptr)


def test_s23_depth_default_minimum_and_names() -> None:
    q = Queues()
    default = q.queue()
    assert [q.put(default, b"x") for _ in range(9)] == [0] * 8 + [FULL]
    attr = q.tdt.create_attr()
    with pytest.raises(AclError, match="ACL_ERROR_INVALID_PARAM"):
        q.tdt.set_depth(attr, 1)
    q.tdt.set_depth(attr, 2)
    with pytest.raises(AclError, match="ACL_ERROR_INVALID_PARAM"):
        q.tdt.set_name(attr, "n" * 128)
    q.tdt.set_name(attr, "n" * 127)
    two = q.tdt.create_queue(attr)
    assert [q.put(two, b"x") for _ in range(3)] == [0, 0, FULL]
    anonymous = ctypes.c_uint32(0)
    assert q.sim.tdt_library.acltdtCreateQueue(None, ctypes.byref(anonymous)) == 0
    assert [q.put(anonymous.value, b"x") for _ in range(9)][-1] == FULL
    assert rules(q.sim) == ["S23", "S23"]


def test_s24_enqueue_arguments() -> None:
    q = Queues()
    qid = q.queue()
    ptr, _ = q.data(b"abc")
    enqueue = q.sim.tdt_library.acltdtEnqueueData
    user = ctypes.create_string_buffer(97)
    assert enqueue(qid, ptr, 0, None, 0, 10, 0) == AclCode.ERROR_INVALID_PARAM
    assert enqueue(qid, ptr, 3, ctypes.addressof(user), 97, 10, 0) == AclCode.ERROR_INVALID_PARAM
    assert enqueue(qid, ptr, 3, None, 0, 10, 1) == AclCode.ERROR_INVALID_PARAM
    assert enqueue(qid, ptr, 3, None, 0, 10, 0) == 0
    assert rules(q.sim) == ["S24", "S24", "S24"]


def test_s25_full_and_empty_codes() -> None:
    q = Queues()
    qid = q.queue(depth=2)
    buffer = q.buffer(16)
    assert q.tdt.dequeue(qid, buffer, 16, 10) == (EMPTY, 0)
    assert [q.put(qid, b"abc") for _ in range(3)] == [0, 0, FULL]
    assert q.tdt.dequeue(qid, buffer, 16, 10) == (0, 3)
    assert q.sim.acl.util.ptr_to_bytes(buffer, 3) == b"abc"


def test_s26_timeouts_by_run_mode() -> None:
    host = Queues()
    qid = host.queue(depth=2)
    assert host.put(qid, b"x", timeout_ms=0) == AclCode.ERROR_INVALID_PARAM
    host.put(qid, b"x")
    host.put(qid, b"x")
    started = time.monotonic()
    assert host.put(qid, b"x", timeout_ms=150) == FULL
    assert time.monotonic() - started >= 0.14
    assert rules(host.sim) == ["S26"]

    device = Queues(run_mode="device", queue_timeout_code="report_timeout")
    qid = device.queue(depth=2)
    buffer = device.buffer(8)
    assert device.tdt.dequeue(qid, buffer, 8, 0) == (AclCode.ERROR_RT_REPORT_TIMEOUT, 0)
    threading.Timer(0.1, lambda: device.put(qid, b"late")).start()
    assert device.tdt.dequeue(qid, buffer, 8, -1) == (0, 4), "-1 blocks until data comes"


def test_s27_dequeue_into_a_too_small_buffer() -> None:
    q = Queues()
    qid = q.queue()
    q.put(qid, b"0123456789")
    buffer = q.buffer(8)
    assert q.tdt.dequeue(qid, buffer, 8, 10) == (AclCode.ERROR_INVALID_PARAM, 0)
    bigger = q.buffer(16)
    assert q.tdt.dequeue(qid, bigger, 16, 10) == (0, 10), "the item stayed queued"
    assert rules(q.sim) == ["S27"]


def test_s28_one_producer_and_one_consumer() -> None:
    q = Queues()
    qid = q.queue()
    ptr, size = q.data(b"data")
    assert in_thread(lambda: q.tdt.enqueue(qid, ptr, size, 10)) == 0
    assert q.put(qid, b"main") == 0, "a producer thread that ended is replaced"
    assert in_thread(lambda: q.tdt.enqueue(qid, ptr, size, 10)) == AclCode.ERROR_FAILURE
    buffer = q.buffer(16)
    assert q.tdt.dequeue(qid, buffer, 16, 10)[0] == 0
    assert in_thread(lambda: q.tdt.dequeue(qid, buffer, 16, 10)[0]) == AclCode.ERROR_FAILURE
    assert rules(q.sim) == ["S28", "S28"]


def test_s29_buffer_queue_api_and_no_query(sim: Simulator) -> None:
    library = sim.tdt_library
    library.acltdtEnqueue.argtypes = [ctypes.c_uint32, ctypes.c_void_p, ctypes.c_int32]
    library.acltdtEnqueue.restype = ctypes.c_int
    assert library.acltdtEnqueue(1, None, -1) == AclCode.ERROR_FEATURE_UNSUPPORTED == 200006
    assert not hasattr(library, "acltdtQueryQueue")


def test_wrong_ctypes_declarations_are_caught(sim: Simulator) -> None:
    function = sim.tdt_library.acltdtDestroyQueue
    with pytest.raises(SimulatorFault, match="argtypes"):
        function(1)
    function.argtypes = [ctypes.c_int64]
    function.restype = ctypes.c_int
    with pytest.raises(SimulatorFault, match="header has"):
        function(1)


def test_s23_queue_name_is_passed_as_the_address_of_a_char_pointer() -> None:
    """``ACL_TDT_QUEUE_NAME_PTR`` takes ``param = &name`` (a ``char**``): a ``char*`` passed
    by value would make the real runtime read the name's bytes as a pointer."""
    q = Queues()
    library = q.sim.tdt_library
    attr = q.tdt.create_attr()
    size = ctypes.sizeof(ctypes.c_char_p)
    name = ctypes.c_char_p(b"by-value")
    assert library.acltdtSetQueueAttr(attr, 0, size, name) == AclCode.ERROR_INVALID_PARAM
    assert library.acltdtSetQueueAttr(attr, 0, size, ctypes.pointer(name)) == 0
    depth = ctypes.c_uint32(3)
    assert library.acltdtSetQueueAttr(attr, 1, 4, ctypes.pointer(depth)) == 0
    qid = q.tdt.create_queue(attr)
    assert q.sim.queues.names()[qid] == "by-value"
    assert [q.put(qid, b"x") for _ in range(4)] == [0, 0, 0, FULL]
    assert rules(q.sim) == ["S23"]


def test_a_null_out_pointer_is_refused_before_the_call_does_anything() -> None:
    """``qid`` of ``acltdtCreateQueue`` and ``retDataSize`` of ``acltdtDequeueData`` are
    required: NULL gets ``ACL_ERROR_INVALID_PARAM``, and the queue keeps its item."""
    q = Queues()
    library = q.sim.tdt_library
    assert library.acltdtCreateQueue(None, None) == AclCode.ERROR_INVALID_PARAM
    qid = q.queue()
    assert q.put(qid, b"item") == 0
    buffer = q.buffer(64)
    assert library.acltdtDequeueData(qid, buffer, 64, None, None, 0, 10) == 100000
    assert q.tdt.dequeue(qid, buffer, 64, 10) == (0, 4)
    assert rules(q.sim) == ["null-pointer", "null-pointer"]


def bound(
    q: Queues, model: Path, with_q_inputs: int = 1, with_q_outputs: int = 2
) -> tuple[list[int], list[int], int]:
    ins = [q.queue(name=f"in{i}") for i in range(with_q_inputs)]
    outs = [q.queue(name=f"out{i}") for i in range(with_q_outputs)]
    loader = WithQLoader(q.sim.acl, q.sim.acl_library)
    return ins, outs, loader.load(str(model), ins, outs)


@pytest.mark.parametrize("route", ["pyacl", "ctypes"])
def test_withq_model_runs_from_queues(
    route: str, static4_model: Path, reference: Reference
) -> None:
    q = Queues(with_q=route)
    ins, outs, model_id = bound(q, static4_model)
    batch = np.random.default_rng(2).uniform(-1, 1, (4, 3, 128, 128)).astype(np.float32)
    assert q.put(ins[0], batch.tobytes()) == 0
    sizes = [4 * 896 * 16 * 4, 4 * 896 * 4]
    buffers = [q.buffer(size) for size in sizes]
    got = [
        q.tdt.dequeue(qid, buf, size, 2000)
        for qid, buf, size in zip(outs, buffers, sizes, strict=True)
    ]
    assert got == [(0, sizes[0]), (0, sizes[1])]
    regressors = np.frombuffer(q.sim.acl.util.ptr_to_bytes(buffers[0], sizes[0]), np.float32)
    np.testing.assert_allclose(regressors.reshape(4, 896, 16), reference(batch)[0], atol=1e-4)
    assert q.put(outs[0], b"x") == AclCode.ERROR_FAILURE, "the model produces its outputs"
    assert q.tdt.dequeue(ins[0], buffers[0], 8, 10)[0] == AclCode.ERROR_FAILURE
    assert q.sim.acl.mdl.unload(model_id) == 0


def test_s17_withq_refuses_dynamic_and_om2(dynamic_model: Path, make_model: MakeModel) -> None:
    """A dynamic-shape model breaks S17 (its description says it is dynamic); an OM2 file is
    refused too, but as documented for a format no caller can see before the load: no
    broken rule."""
    q = Queues()
    with pytest.raises(AclError, match="ACL_ERROR_GE_PARAM_INVALID"):
        bound(q, dynamic_model)
    om2 = make_model("om2", {"input_shape": {"input": [1, 3, 128, 128]}, "om2": True})
    with pytest.raises(AclError, match="ACL_ERROR_API_NOT_SUPPORT") as caught:
        bound(q, om2)
    assert caught.value.code == 200001
    assert rules(q.sim) == ["S17"]


def test_s18_one_queue_per_input_and_output(static4_model: Path) -> None:
    q = Queues()
    with pytest.raises(AclError, match="ACL_ERROR_GE_EXEC_MODEL_QUEUE_ID_INVALID"):
        bound(q, static4_model, with_q_outputs=1)
    assert rules(q.sim) == ["S18"]
    assert q.sim.models.live()["models"] == [], "a refused load leaves no model"


def test_injected_queue_full_and_teardown_helper() -> None:
    q = Queues(queue_full_every_n_enqueues=2)
    qid = q.queue()
    assert [q.put(qid, b"x") for _ in range(4)] == [0, FULL, 0, FULL]
    teardown = Teardown()
    teardown.push("acltdtDestroyQueue", q.tdt.destroy_queue, qid)
    teardown.push("acltdtDestroyQueue", q.tdt.destroy_queue, 999)
    with pytest.raises(AclError, match="ACL_ERROR_INVALID_QUEUE_ID"):
        teardown.close()
    assert qid not in q.sim.queues.live()["queues"], "the other release still ran"

"""Simulator rules of the binding, memory, devices and contexts (reference/pyacl.md §9, S1-S11):
each rule broken on purpose gives the documented result."""

from __future__ import annotations

import threading

import numpy as np
import pytest
from acl_testing import in_thread, open_device, rules

from streamer.runtime.acl.constants import AclCode, MallocPolicy, MemcpyKind
from streamer.runtime.acl.options import SimOptions
from streamer.runtime.acl.sim.binding import SimulatorFault
from streamer.runtime.acl.sim.simulator import Simulator

pytestmark = pytest.mark.timeout(30)

NORMAL = MallocPolicy.NORMAL_ONLY


# Binding (S1-S5) ----------------------------------------------------------------------------


def test_s1_handles_are_ints_and_s2_bad_arguments_raise_type_error(sim: Simulator) -> None:
    open_device(sim)
    ptr, ret = sim.acl.rt.malloc(100, NORMAL)
    assert type(ptr) is int and ret == 0
    with pytest.raises(TypeError, match=r"acl\.rt\.malloc args parse failed"):
        sim.acl.rt.malloc(100)
    with pytest.raises(TypeError, match="args parse failed"):
        sim.acl.rt.malloc(np.int64(100), NORMAL)  # a numpy integer is not a PyLong
    with pytest.raises(TypeError, match=r"acl\.rt\.launch_callback args parse failed"):
        sim.acl.rt.launch_callback(print, [], 0)
    with pytest.raises(TypeError, match="args parse failed"):
        sim.acl.mdl.load_from_file(b"model.om")
    assert sim.acl.rt.free(ptr) == 0


def test_s3_no_tdt_module_and_with_q_by_configuration() -> None:
    for with_q, in_pyacl, in_library in [
        ("pyacl", True, True),
        ("ctypes", False, True),
        ("none", False, False),
    ]:
        sim = Simulator(SimOptions.model_validate({"with_q": with_q}))
        assert not hasattr(sim.acl, "tdt")
        assert hasattr(sim.acl.mdl, "load_from_file_with_q") is in_pyacl
        assert hasattr(sim.acl.mdl, "load_from_mem_with_q") is False
        assert hasattr(sim.acl_library, "aclmdlLoadFromFileWithQ") is in_library


def test_s4_no_constants_exported(sim: Simulator) -> None:
    for module in (sim.acl, sim.acl.rt, sim.acl.mdl, sim.acl.op, sim.acl.util):
        public = [name for name in vars(module) if not name.startswith("_")]
        assert all(
            callable(getattr(module, name)) or name in {"rt", "mdl", "op", "util"}
            for name in public
        )
        assert not [name for name in public if name.isupper()]


def test_s5_bytes_to_ptr_needs_bytes_and_ptr_to_bytes_copies(sim: Simulator) -> None:
    with pytest.raises(ValueError):
        sim.acl.util.bytes_to_ptr(bytearray(b"abc"))
    data = b"streamer"
    ptr = sim.acl.util.bytes_to_ptr(data)
    copy = sim.acl.util.ptr_to_bytes(ptr + 2, 4)
    assert copy == b"ream" and type(copy) is bytes


# Memory (S6-S9) -----------------------------------------------------------------------------


def test_s6_malloc_refuses_zero_size_and_combined_policies(sim: Simulator) -> None:
    open_device(sim)
    assert sim.acl.rt.malloc(0, NORMAL)[1] == AclCode.ERROR_INVALID_PARAM
    combined = MallocPolicy.NORMAL_ONLY | MallocPolicy.TYPE_HIGH_BAND_WIDTH
    assert sim.acl.rt.malloc(64, combined)[1] == AclCode.ERROR_INVALID_PARAM
    assert sim.acl.rt.malloc(-1, NORMAL)[1] == AclCode.ERROR_BAD_ALLOC  # "k" wraps to 2**64-1
    assert rules(sim) == ["S6", "S6"]


@pytest.mark.parametrize(("soc_950", "extra"), [(False, 32), (True, 0)])
def test_s7_malloc_alignment_rounding_and_garbage(soc_950: bool, extra: int) -> None:
    sim = Simulator(SimOptions(soc_950=soc_950))
    open_device(sim)
    ptrs = [sim.acl.rt.malloc(size, NORMAL)[0] for size in (1, 33, 100)]
    assert all(ptr % 64 == 0 for ptr in ptrs)
    reserved = {a.start: a.reserved for a in sim.memory.live()}
    assert [reserved[p] for p in ptrs] == [32 + extra, 64 + extra, 128 + extra]
    host, _ = sim.acl.rt.malloc_host(16)
    assert sim.acl.rt.memcpy(host, 16, ptrs[0], 16, MemcpyKind.DEVICE_TO_HOST) == 0
    assert sim.acl.util.ptr_to_bytes(host, 16) != bytes(16), "malloc does not zero memory"


def test_s8_malloc_host_is_aligned(sim: Simulator) -> None:
    sim.acl.init()
    ptrs = [sim.acl.rt.malloc_host(size)[0] for size in (1, 70, 3)]
    assert all(ptr % 64 == 0 for ptr in ptrs)
    assert [sim.acl.rt.free_host(ptr) for ptr in ptrs] == [0, 0, 0]


def test_s9_data_buffers(sim: Simulator) -> None:
    assert sim.acl.create_data_buffer(0, 16) == 0
    empty = sim.acl.create_data_buffer(0, 0)
    assert empty != 0 and sim.acl.destroy_data_buffer(empty) == 0


def test_memcpy_out_of_bounds_freed_and_double_free(sim: Simulator) -> None:
    open_device(sim)
    dst, _ = sim.acl.rt.malloc(100, NORMAL)  # reserves 160 bytes
    data = bytes(range(200))  # alive while this test uses its address
    src = sim.acl.util.bytes_to_ptr(data)
    assert sim.acl.rt.memcpy(dst, 160, src, 160, MemcpyKind.HOST_TO_DEVICE) == 0
    assert sim.acl.rt.memcpy(dst, 100, src, 160, 1) == AclCode.ERROR_INVALID_PARAM  # > dest_max
    assert sim.acl.rt.memcpy(dst + 64, 200, src, 100, 1) == AclCode.ERROR_INVALID_PARAM  # past end
    assert sim.acl.rt.memcpy(dst, 100, src + 150, 100, 1) == AclCode.ERROR_INVALID_PARAM  # source
    assert sim.acl.rt.memcpy(dst, 100, src, 100, 9) == AclCode.ERROR_INVALID_PARAM  # kind
    assert sim.acl.rt.free(dst) == 0
    assert sim.acl.rt.memcpy(dst, 100, src, 10, 1) == AclCode.ERROR_INVALID_PARAM  # freed
    assert sim.acl.rt.free(dst) == AclCode.ERROR_INVALID_PARAM  # double free
    assert rules(sim) == ["memcpy", "bounds", "bounds", "memcpy", "bounds", "free"]


def test_host_process_cannot_read_device_memory_but_device_mode_can() -> None:
    for run_mode, readable in (("host", False), ("device", True)):
        sim = Simulator(SimOptions.model_validate({"run_mode": run_mode}))
        open_device(sim)
        ptr, _ = sim.acl.rt.malloc(64, NORMAL)
        if readable:
            assert len(sim.acl.util.ptr_to_bytes(ptr, 64)) == 64
        else:
            with pytest.raises(SimulatorFault, match="read device memory"):
                sim.acl.util.ptr_to_bytes(ptr, 64)


def test_a_dropped_bytes_object_is_a_dangling_pointer(sim: Simulator) -> None:
    open_device(sim)
    dst, _ = sim.acl.rt.malloc(64, NORMAL)
    ptr = sim.acl.util.bytes_to_ptr(bytes([120] * 65))  # gone once the call returns
    assert sim.acl.rt.memcpy(dst, 64, ptr, 64, 1) == AclCode.ERROR_INVALID_PARAM
    kept = bytes([121] * 65)
    ptr = sim.acl.util.bytes_to_ptr(kept)
    assert sim.acl.rt.memcpy(dst, 64, ptr, 64, 1) == 0
    with pytest.raises(SimulatorFault, match="immutable"):
        sim.acl.rt.memcpy(ptr, 64, dst, 64, 2)


def test_memory_of_another_device_needs_its_context() -> None:
    sim = Simulator(SimOptions(device_count=2))
    context0 = open_device(sim, 0)
    on0, _ = sim.acl.rt.malloc(64, NORMAL)
    open_device(sim, 1)
    on1, _ = sim.acl.rt.malloc(64, NORMAL)
    assert (
        sim.acl.rt.memcpy(on1, 64, on0, 64, MemcpyKind.DEVICE_TO_DEVICE)
        == AclCode.ERROR_INVALID_PARAM
    )
    assert sim.acl.rt.set_context(context0) == 0
    other, _ = sim.acl.rt.malloc(64, NORMAL)
    assert sim.acl.rt.memcpy(other, 64, on0, 64, MemcpyKind.DEVICE_TO_DEVICE) == 0


# Devices and contexts (S10, init) ------------------------------------------------------------


def test_init_rules(sim: Simulator) -> None:
    assert sim.acl.rt.set_device(0) == AclCode.ERROR_UNINITIALIZE
    assert sim.acl.init() == 0
    assert sim.acl.init() == AclCode.ERROR_REPEAT_INITIALIZE
    assert sim.acl.rt.set_device(1) == AclCode.ERROR_INVALID_DEVICE
    assert sim.acl.finalize() == 0
    assert sim.acl.finalize() == AclCode.ERROR_REPEAT_FINALIZE


def test_s10_a_new_thread_has_no_context_until_set_context(sim: Simulator) -> None:
    context = open_device(sim)
    assert in_thread(lambda: sim.acl.rt.malloc(64, NORMAL)[1]) == AclCode.ERROR_RT_CONTEXT_NULL

    def with_context() -> int:
        assert sim.acl.rt.set_context(context) == 0
        ptr, ret = sim.acl.rt.malloc(64, NORMAL)
        sim.acl.rt.free(ptr)
        return int(ret)

    assert in_thread(with_context) == 0
    assert rules(sim) == ["S10"]


def test_destroyed_context_is_no_context(sim: Simulator) -> None:
    context = open_device(sim)
    assert sim.acl.rt.destroy_context(context) == 0
    assert sim.acl.rt.malloc(64, NORMAL)[1] == AclCode.ERROR_RT_CONTEXT_NULL
    assert sim.acl.rt.set_context(context) == AclCode.ERROR_RT_PARAM_INVALID


def test_call_log_records_every_call_in_order(sim: Simulator) -> None:
    open_device(sim)
    sim.acl.rt.malloc(0, NORMAL)
    calls = sim.log.calls()
    assert [c.api for c in calls] == [
        "acl.init",
        "acl.rt.set_device",
        "acl.rt.create_context",
        "acl.rt.malloc",
    ]
    assert calls[-1].args == (0, NORMAL) and calls[-1].result == (0, AclCode.ERROR_INVALID_PARAM)
    assert calls[0].thread == threading.current_thread().name

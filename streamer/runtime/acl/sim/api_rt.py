"""The simulated ``acl`` top level, ``acl.rt`` and ``acl.util`` (pyACL formats from RT
``python/pyACL/py_init_acl.cpp``, ``rt/*.cpp``, ``util/*.cpp``). ``destroy_stream``,
``destroy_context``, ``reset_device`` and ``acl.finalize`` enforce rule ``teardown``
(:mod:`~streamer.runtime.acl.sim.teardown`)."""

from __future__ import annotations

from types import ModuleType
from typing import TYPE_CHECKING, Any

from streamer.runtime.acl.constants import AclCode, CallbackBlock, RunMode
from streamer.runtime.acl.sim import teardown
from streamer.runtime.acl.sim.binding import SimError
from streamer.runtime.acl.sim.memory import MemoryKind

if TYPE_CHECKING:
    from streamer.runtime.acl.sim.simulator import Simulator

__all__ = ["build_rt", "build_top_level", "build_util"]


def build_top_level(sim: Simulator, module: ModuleType) -> None:
    """``acl.init``, ``acl.finalize``, ``acl.create_data_buffer``, ``acl.destroy_data_buffer``,
    ``acl.get_recent_err_msg`` (no arguments; the message, or None like a NULL ``char*``)."""
    export = sim.binder.export

    def init(config_path: str | None = None) -> int:
        sim.initialize(config_path)
        return 0

    def finalize() -> int:
        sim.finalize()
        return 0

    def destroy_data_buffer(handle: int) -> int:
        sim.models.destroy_buffer(handle)
        return 0

    export(module, "acl.init", "|s", "ret", init)
    export(module, "acl.finalize", "", "ret", finalize)
    export(module, "acl.create_data_buffer", "kk", "handle", sim.models.create_buffer)
    export(module, "acl.destroy_data_buffer", "k", "ret", destroy_data_buffer)
    export(module, "acl.get_recent_err_msg", "", "value", sim.binder.take_recent_message)


def build_rt(sim: Simulator) -> ModuleType:
    """``acl.rt``: devices, contexts, streams, memory, callbacks."""
    rt = ModuleType("acl.rt")
    _devices(sim, rt)
    _memory(sim, rt)
    _streams(sim, rt)
    _callbacks(sim, rt)
    return rt


def _devices(sim: Simulator, rt: ModuleType) -> None:
    export = sim.binder.export

    def set_device(device: int) -> int:
        sim.require_init()
        sim.devices.set_device(device)
        return 0

    def reset_device(device: int) -> int:
        teardown.check_reset_device(sim, device)
        sim.devices.reset_device(device)
        return 0

    def create_context(device: int) -> tuple[int, int]:
        return sim.devices.create_context(device), 0

    def destroy_context(context: int) -> int:
        sim.devices.explicit(context)
        teardown.check_destroy_context(sim, context)
        sim.devices.destroy_context(context)
        return 0

    def set_context(context: int) -> int:
        sim.devices.set_context(context)
        return 0

    def get_run_mode() -> tuple[int, int]:
        return int(sim.run_mode), 0

    def get_context() -> tuple[int, int]:
        return sim.devices.current().handle, 0

    export(rt, "acl.rt.set_device", "i", "ret", set_device)
    export(rt, "acl.rt.reset_device", "i", "ret", reset_device)
    export(rt, "acl.rt.create_context", "i", "pair", create_context)
    export(rt, "acl.rt.destroy_context", "k", "ret", destroy_context)
    export(rt, "acl.rt.set_context", "k", "ret", set_context)
    export(rt, "acl.rt.get_context", "", "pair", get_context)
    export(rt, "acl.rt.get_run_mode", "", "pair", get_run_mode)


def _memory(sim: Simulator, rt: ModuleType) -> None:
    export = sim.binder.export

    def malloc(size: int, policy: int) -> tuple[int, int]:
        return sim.memory.malloc(sim.devices.current().device, size, policy), 0

    def malloc_host(size: int) -> tuple[int, int]:
        sim.require_init()
        return sim.memory.malloc_host(size), 0

    def free(ptr: int) -> int:
        sim.memory.free(ptr, MemoryKind.DEVICE)
        return 0

    def free_host(ptr: int) -> int:
        sim.memory.free(ptr, MemoryKind.HOST)
        return 0

    def memcpy(dst: int, dest_max: int, src: int, count: int, kind: int) -> int:
        sim.memory.copy(dst, dest_max, src, count, kind, sim.devices.current().device)
        return 0

    export(rt, "acl.rt.malloc", "ki", "pair", malloc)
    export(rt, "acl.rt.malloc_host", "k", "pair", malloc_host)
    export(rt, "acl.rt.free", "k", "ret", free)
    export(rt, "acl.rt.free_host", "k", "ret", free_host)
    export(rt, "acl.rt.memcpy", "kkkki", "ret", memcpy)


def _streams(sim: Simulator, rt: ModuleType) -> None:
    export = sim.binder.export

    def create_stream() -> tuple[int, int]:
        return sim.create_stream(sim.devices.current()), 0

    def destroy_stream(stream: int) -> int:
        sim.destroy_stream(stream)
        return 0

    def synchronize_stream(stream: int) -> int:
        return sim.stream(stream).synchronize(-1)

    def synchronize_stream_with_timeout(stream: int, timeout_ms: int) -> int:
        return sim.stream(stream).synchronize(timeout_ms)

    def synchronize_device() -> int:
        device = sim.devices.current().device
        for stream in sim.device_streams(device):
            if (ret := stream.synchronize(-1)) != 0:
                return ret
        return 0

    export(rt, "acl.rt.synchronize_device", "", "ret", synchronize_device)
    export(rt, "acl.rt.create_stream", "", "pair", create_stream)
    export(rt, "acl.rt.destroy_stream", "k", "ret", destroy_stream)
    export(rt, "acl.rt.synchronize_stream", "k", "ret", synchronize_stream)
    export(
        rt, "acl.rt.synchronize_stream_with_timeout", "ki", "ret", synchronize_stream_with_timeout
    )


def _callbacks(sim: Simulator, rt: ModuleType) -> None:
    export = sim.binder.export

    def subscribe_report(thread_id: int, stream: int) -> int:
        sim.reports.subscribe(thread_id, sim.stream(stream))
        return 0

    def unsubscribe_report(thread_id: int, stream: int) -> int:
        sim.reports.unsubscribe(thread_id, stream)
        return 0

    def launch_callback(fn: Any, data: Any, block: int, stream: int) -> int:
        if not callable(fn):
            raise TypeError("parameter must be callable")
        if block not in (CallbackBlock.NO_BLOCK, CallbackBlock.BLOCK):
            raise SimError(AclCode.ERROR_INVALID_PARAM, "S21", f"block type {block} is not 0 or 1")
        sim.devices.current()
        target = sim.stream(stream)
        if not sim.reports.subscribed(stream):
            raise SimError(AclCode.ERROR_RT_STREAM_NO_CB_REG, "S19", "no thread subscribed")
        target.submit(lambda: sim.reports.post(stream, fn, data, block))
        return 0

    def process_report(timeout_ms: int) -> int:
        sim.devices.current()
        return sim.reports.process(timeout_ms)

    export(rt, "acl.rt.subscribe_report", "Kk", "ret", subscribe_report)
    export(rt, "acl.rt.unsubscribe_report", "Kk", "ret", unsubscribe_report)
    export(rt, "acl.rt.launch_callback", "OOik", "ret", launch_callback)
    export(rt, "acl.rt.process_report", "i", "ret", process_report)


def build_util(sim: Simulator) -> ModuleType:
    """``acl.util``: raw threads and pointer conversion."""
    util = ModuleType("acl.util")
    export = sim.binder.export

    def ptr_to_bytes(ptr: int, size: int) -> bytes:
        return sim.memory.host_read(ptr, size, sim.run_mode == RunMode.HOST)

    export(util, "acl.util.start_thread", "OO", "pair", sim.threads.start)
    export(util, "acl.util.stop_thread", "K", "ret", sim.threads.stop)
    export(util, "acl.util.bytes_to_ptr", "O", "value", sim.memory.register_user)
    export(util, "acl.util.ptr_to_bytes", "kk", "value", ptr_to_bytes)
    return util

"""Simulator rules of callbacks and raw threads (reference/pyacl.md §9, S19-S22)."""

from __future__ import annotations

import errno
import threading
import time
from typing import Any

import pytest
from acl_testing import open_device, rules

from streamer.runtime.acl.constants import AclCode, CallbackBlock
from streamer.runtime.acl.options import SimOptions
from streamer.runtime.acl.sim.simulator import Simulator

pytestmark = pytest.mark.timeout(30)


class Reporter:
    """A ``start_thread`` thread that sets the context, waits for :meth:`subscribe`, then
    loops ``process_report``."""

    def __init__(self, sim: Simulator, context: int, timeout_ms: int = 20) -> None:
        self.sim = sim
        self.codes: list[int] = []
        self.subscribed = threading.Event()
        self.stop = threading.Event()
        self.thread_id, ret = sim.acl.util.start_thread(self._loop, [context, timeout_ms])
        assert ret == 0

    def subscribe(self, stream: int) -> int:
        ret = int(self.sim.acl.rt.subscribe_report(self.thread_id, stream))
        if ret == 0:
            self.subscribed.set()
        return ret

    def _loop(self, args: list[Any]) -> None:
        context, timeout_ms = args
        self.sim.acl.rt.set_context(context)
        while not self.subscribed.wait(0.01):
            if self.stop.is_set():
                return
        while not self.stop.is_set():
            self.codes.append(self.sim.acl.rt.process_report(timeout_ms))

    def join(self) -> None:
        self.stop.set()
        assert self.sim.acl.util.stop_thread(self.thread_id) == 0


def test_s19_launch_callback_needs_a_subscribed_stream(sim: Simulator) -> None:
    open_device(sim)
    stream, _ = sim.acl.rt.create_stream()
    launched = sim.acl.rt.launch_callback(print, [], CallbackBlock.BLOCK, stream)
    assert launched == AclCode.ERROR_RT_STREAM_NO_CB_REG == 107015
    assert rules(sim) == ["S19"]


def test_s21_launch_callback_takes_one_of_the_two_block_types(sim: Simulator) -> None:
    """``aclrtCallbackBlockType`` has ``ACL_CALLBACK_NO_BLOCK`` (0) and ``ACL_CALLBACK_BLOCK``
    (1) only."""
    context = open_device(sim)
    stream, _ = sim.acl.rt.create_stream()
    reporter = Reporter(sim, context)
    assert reporter.subscribe(stream) == 0
    ran: list[Any] = []
    assert sim.acl.rt.launch_callback(ran.append, [1], 2, stream) == AclCode.ERROR_INVALID_PARAM
    assert sim.acl.rt.launch_callback(ran.append, [2], CallbackBlock.BLOCK, stream) == 0
    assert sim.acl.rt.synchronize_stream(stream) == 0
    assert sim.acl.rt.unsubscribe_report(reporter.thread_id, stream) == 0
    reporter.join()
    assert ran == [[2]]
    assert rules(sim) == ["S21"]


def test_s21_callbacks_run_on_the_subscribed_thread(sim: Simulator) -> None:
    context = open_device(sim)
    stream, _ = sim.acl.rt.create_stream()
    reporter = Reporter(sim, context)
    assert reporter.subscribe(stream) == 0
    seen: list[tuple[int, list[int]]] = []
    for n in range(3):
        callback = lambda data: seen.append((threading.get_ident(), data))  # noqa: E731
        assert sim.acl.rt.launch_callback(callback, [n], CallbackBlock.BLOCK, stream) == 0
    assert sim.acl.rt.synchronize_stream(stream) == 0
    assert seen == [(reporter.thread_id, [0]), (reporter.thread_id, [1]), (reporter.thread_id, [2])]
    assert sim.acl.rt.unsubscribe_report(reporter.thread_id, stream) == 0
    reporter.join()
    assert AclCode.ERROR_RT_REPORT_TIMEOUT in reporter.codes, "process_report(20) times out"
    assert sim.acl.rt.destroy_stream(stream) == 0


def test_s21_process_report_timeouts_and_subscription(sim: Simulator) -> None:
    open_device(sim)
    stream, _ = sim.acl.rt.create_stream()
    assert sim.acl.rt.process_report(10) == AclCode.ERROR_RT_THREAD_SUBSCRIBE == 107012
    me = threading.get_ident()
    assert sim.acl.rt.subscribe_report(me, stream) == 0
    started = time.monotonic()
    assert sim.acl.rt.process_report(100) == AclCode.ERROR_RT_REPORT_TIMEOUT
    assert time.monotonic() - started >= 0.1
    ran: list[int] = []
    sim.acl.rt.launch_callback(lambda data: ran.append(threading.get_ident()), [], 0, stream)
    assert sim.acl.rt.process_report(-1) == 0, "-1 waits until a callback comes"
    assert ran == [me]
    assert sim.acl.rt.unsubscribe_report(me, stream) == 0
    assert sim.acl.rt.destroy_stream(stream) == 0
    assert rules(sim) == ["S21"]


def test_s21_older_releases_time_out_with_wait_callback_timeout() -> None:
    sim = Simulator(SimOptions(report_timeout_code="wait_callback_timeout"))
    open_device(sim)
    stream, _ = sim.acl.rt.create_stream()
    me = threading.get_ident()
    assert sim.acl.rt.subscribe_report(me, stream) == 0
    assert sim.acl.rt.process_report(10) == AclCode.ERROR_WAIT_CALLBACK_TIMEOUT == 100036
    assert sim.acl.rt.unsubscribe_report(me, stream) == 0
    assert sim.acl.rt.destroy_stream(stream) == 0


def test_a_callback_that_raises_is_swallowed_and_recorded(sim: Simulator) -> None:
    context = open_device(sim)
    stream, _ = sim.acl.rt.create_stream()
    reporter = Reporter(sim, context)
    reporter.subscribe(stream)
    sim.acl.rt.launch_callback(lambda data: 1 / 0, [], CallbackBlock.BLOCK, stream)
    assert sim.acl.rt.synchronize_stream(stream) == 0
    sim.acl.rt.unsubscribe_report(reporter.thread_id, stream)
    reporter.join()
    assert [type(e) for e in sim.callback_errors] == [ZeroDivisionError]


def test_s20_one_thread_per_stream_and_one_device_per_thread() -> None:
    sim = Simulator(SimOptions(device_count=2))
    context0 = open_device(sim, 0)
    stream0, _ = sim.acl.rt.create_stream()
    first, second = Reporter(sim, context0), Reporter(sim, context0)
    assert first.subscribe(stream0) == 0
    assert sim.acl.rt.subscribe_report(second.thread_id, stream0) == AclCode.ERROR_REPEAT_SUBSCRIBE
    open_device(sim, 1)
    stream1, _ = sim.acl.rt.create_stream()
    assert (
        sim.acl.rt.subscribe_report(first.thread_id, stream1) == AclCode.ERROR_RT_THREAD_SUBSCRIBE
    )
    assert second.subscribe(stream1) == 0
    assert (
        sim.acl.rt.unsubscribe_report(second.thread_id, stream0)
        == AclCode.ERROR_STREAM_NOT_SUBSCRIBE
    )
    assert rules(sim) == ["S20", "S20", "S20"]
    sim.acl.rt.unsubscribe_report(first.thread_id, stream0)
    sim.acl.rt.unsubscribe_report(second.thread_id, stream1)
    first.join()
    second.join()


def test_s10_a_started_thread_has_no_context(sim: Simulator) -> None:
    open_device(sim)
    codes: list[int] = []
    thread_id, _ = sim.acl.util.start_thread(
        lambda args: codes.append(sim.acl.rt.process_report(1)), []
    )
    sim.acl.util.stop_thread(thread_id)
    assert codes == [AclCode.ERROR_RT_CONTEXT_NULL]


def test_s22_start_and_stop_thread(sim: Simulator) -> None:
    release = threading.Event()
    thread_id, ret = sim.acl.util.start_thread(lambda args: release.wait(args[0]), [5.0])
    assert ret == 0 and type(thread_id) is int
    assert thread_id in [t.ident for t in threading.enumerate()], "a pthread_t of a live thread"
    threading.Timer(0.2, release.set).start()
    started = time.monotonic()
    assert sim.acl.util.stop_thread(thread_id) == 0
    assert time.monotonic() - started >= 0.15, "stop_thread joins"
    failing, _ = sim.acl.util.start_thread(lambda args: [][1], None)
    with pytest.raises(RuntimeError, match="exception=IndexError"):
        sim.acl.util.stop_thread(failing)
    assert sim.acl.util.stop_thread(12345) == errno.ESRCH
    with pytest.raises(TypeError, match="args parse failed"):
        sim.acl.util.start_thread(print)


def test_s20_thread_limit(sim: Simulator, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("streamer.runtime.acl.sim.streams._MAX_REPORT_THREADS", 1)
    context = open_device(sim)
    first, second = Reporter(sim, context), Reporter(sim, context)
    streams = [sim.acl.rt.create_stream()[0] for _ in range(2)]
    assert first.subscribe(streams[0]) == 0
    assert second.subscribe(streams[1]) == AclCode.ERROR_RT_THREAD_SUBSCRIBE
    assert first.subscribe(streams[1]) == 0, "one thread may serve several streams of a device"
    for stream in streams:
        sim.acl.rt.unsubscribe_report(first.thread_id, stream)
    second.stop.set()
    first.join()
    second.join()

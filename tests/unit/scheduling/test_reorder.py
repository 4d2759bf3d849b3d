import time
from types import SimpleNamespace

import pytest

from streamer.errors import FrameError, Reason
from streamer.frames import EndOfStream, Frame
from streamer.scheduling import reorder
from streamer.scheduling.reorder import ReorderBuffer


def frame(order: int, source: str = "a", epoch: int = 0) -> Frame:
    f = Frame(source, order, time.monotonic_ns(), time.time())
    f.epoch, f.order = epoch, order
    return f


def orders(items: list) -> list[int]:
    return [i.order for i in items]


def test_in_order_passes_straight_through() -> None:
    buffer = ReorderBuffer(window=8, timeout_s=1, idle_evict_s=60)
    assert [orders(buffer.push(frame(i))) for i in range(3)] == [[0], [1], [2]]
    assert buffer.held() == 0


def test_out_of_order_is_held_until_the_gap_fills() -> None:
    buffer = ReorderBuffer(window=8, timeout_s=1, idle_evict_s=60)
    assert buffer.push(frame(1)) == [] and buffer.push(frame(2)) == []
    assert orders(buffer.push(frame(0))) == [0, 1, 2]


def test_a_skipped_frame_does_not_stall_its_stream() -> None:
    buffer = ReorderBuffer(window=8, timeout_s=1, idle_evict_s=60)
    buffer.push(frame(0))
    buffer.skip(frame(1))
    assert orders(buffer.push(frame(2))) == [2]


def test_skip_releases_frames_held_behind_it() -> None:
    buffer = ReorderBuffer(window=8, timeout_s=10, idle_evict_s=60)
    assert buffer.push(frame(1)) == []
    buffer.skip(frame(0))
    assert orders(buffer.expire()) == [1]


def test_window_and_timeout_give_up_on_a_lost_frame() -> None:
    buffer = ReorderBuffer(window=2, timeout_s=0.05, idle_evict_s=60)
    assert buffer.push(frame(1)) == [] and buffer.push(frame(2)) == []
    assert orders(buffer.push(frame(3))) == [1, 2, 3]  # window exceeded
    assert buffer.gave_up == 1
    assert orders(buffer.push(frame(0))) == [0] and buffer.late == 1
    assert buffer.push(frame(5)) == []
    assert buffer.expire(now_ns=time.monotonic_ns() + 10**9) and buffer.gave_up == 2


def test_streams_are_independent_and_eos_closes_one() -> None:
    buffer = ReorderBuffer(window=8, timeout_s=1, idle_evict_s=60)
    assert buffer.push(frame(1, "a")) == []
    assert orders(buffer.push(frame(0, "b"))) == [0]
    eos = EndOfStream("b", 0, epoch=0, order=1)
    assert buffer.push(eos) == [eos]
    assert orders(buffer.flush()) == [1]
    assert buffer.held() == 0


def test_unsequenced_items_pass() -> None:
    buffer = ReorderBuffer(window=8, timeout_s=1, idle_evict_s=60)
    broken = Frame("", -1, 0, 0.0)
    assert buffer.push(broken) == [broken]


def test_dropped_frames_do_not_fill_the_window() -> None:
    """``drop_oldest`` under overload drops frames queued behind those still running: they
    are no reason to give up on a running one, which would then be published late, out of
    order."""
    buffer = ReorderBuffer(window=4, timeout_s=10, idle_evict_s=60)
    for order in range(10, 20):
        buffer.skip(frame(order))
    assert buffer.push(frame(1)) == []  # frame 0 still runs on another replica
    assert orders(buffer.push(frame(0))) == [0, 1]
    assert [orders(buffer.push(frame(i))) for i in range(2, 10)] == [[i] for i in range(2, 10)]
    assert buffer.gave_up == buffer.late == buffer.held() == 0


def test_failed_frames_do_not_fill_the_window() -> None:
    """Corrupt images fail before the model and reach egress as fast as they arrive, while an
    earlier good frame's batch still runs: any number of them may pass it."""
    buffer = ReorderBuffer(window=4, timeout_s=10, idle_evict_s=60)
    corrupt = [frame(i) for i in range(1, 200)]
    for f in corrupt:
        f.fail(FrameError(Reason.DECODE_FAILED, "truncated"))
        assert buffer.push(f) == []  # frame 0 still runs
    assert orders(buffer.push(frame(0))) == list(range(200))
    assert orders(buffer.push(frame(200))) == [200]
    assert buffer.gave_up == buffer.late == buffer.held() == 0


def test_an_end_of_stream_waits_for_the_frames_given_up_on() -> None:
    """A subscriber that stops reading at the end of stream gets the frames given up on
    (still running on a slow replica) too: the end of stream comes after them."""
    buffer = ReorderBuffer(window=2, timeout_s=10, idle_evict_s=60)
    for order in (2, 3, 4):
        buffer.push(frame(order))  # frames 0 and 1 run long: given up on at the window
    eos = EndOfStream("a", 4)
    eos.epoch, eos.order = 0, 5
    assert buffer.push(eos) == [] and buffer.held() == 1
    assert buffer.push(frame(6)) == []  # the source's next clip waits behind its end
    assert orders(buffer.push(frame(1))) == [1]  # late, at once
    assert orders(buffer.push(frame(0))) == [0, 5, 6]
    assert (buffer.gave_up, buffer.late, buffer.held()) == (2, 2, 0)


def test_a_stream_forgotten_takes_late_frames_at_once() -> None:
    buffer = ReorderBuffer(window=1, timeout_s=10, idle_evict_s=1)
    buffer.push(frame(1))
    buffer.push(frame(2))  # frame 0 given up on
    buffer.close(("a", 0))
    assert buffer.expire(now_ns=time.monotonic_ns() + 2 * 10**9) == []  # forgotten
    assert orders(buffer.push(frame(0))) == [0] and buffer.late == 1 and buffer.held() == 0


def test_an_end_of_stream_waits_no_longer_than_the_timeout() -> None:
    buffer = ReorderBuffer(window=1, timeout_s=1, idle_evict_s=60)
    buffer.push(frame(1))
    assert orders(buffer.push(frame(2))) == [1, 2]  # frame 0 given up on
    buffer.skip(frame(3))  # dropped
    eos = EndOfStream("a", 3)
    eos.epoch, eos.order = 0, 4
    assert buffer.push(eos) == []
    assert buffer.expire() == []
    assert buffer.expire(now_ns=time.monotonic_ns() + 2 * 10**9) == [eos]
    assert buffer.held() == 0 and orders(buffer.push(frame(0))) == [0]


def test_a_dropped_frame_given_up_on_releases_the_end_of_stream() -> None:
    buffer = ReorderBuffer(window=1, timeout_s=10, idle_evict_s=60)
    buffer.push(frame(1))
    buffer.push(frame(2))  # frame 0 given up on
    eos = EndOfStream("a", 2)
    eos.epoch, eos.order = 0, 3
    assert buffer.push(eos) == []
    buffer.skip(frame(0))  # then dropped (e.g. a reload gave its chain up)
    assert buffer.expire() == [eos]


def test_flush_releases_a_waiting_end_of_stream() -> None:
    buffer = ReorderBuffer(window=1, timeout_s=10, idle_evict_s=60)
    buffer.push(frame(1))
    buffer.push(frame(2))
    eos = EndOfStream("a", 2)
    eos.epoch, eos.order = 0, 3
    buffer.push(eos)
    assert buffer.flush() == [eos] and buffer.held() == 0


def test_the_timeout_counts_from_the_oldest_held_frame(monkeypatch: pytest.MonkeyPatch) -> None:
    """A source that keeps sending while one frame is missing: the results held behind it go
    out ``timeout_s`` after the first of them came, not only once the source pauses for that
    long (each new result restarted the wait, and only the window, 4096 frames, bounded it)."""
    clock = [0]
    monkeypatch.setattr(reorder, "time", SimpleNamespace(monotonic_ns=lambda: clock[0]))
    buffer = ReorderBuffer(window=4096, timeout_s=0.2, idle_evict_s=60)
    released = []
    for order in range(1, 41):  # order 0 is missing; a result every 50 ms
        clock[0] = order * 50_000_000
        released += buffer.push(frame(order)) + buffer.expire()
    assert orders(released) == list(range(1, 41)) and buffer.gave_up == 1


def test_dropped_frames_do_not_start_the_timeout(monkeypatch: pytest.MonkeyPatch) -> None:
    """``drop_oldest`` under overload with a slow postprocess: frame 0 spends longer than
    ``timeout_s`` between the queue and egress while the frames queued behind it are
    dropped. Their places are no reason to give up on it; it and the results behind it
    leave in order (the timeout ran from the first dropped place: frame 0 was given up on
    and published late, out of order)."""
    clock = [0]
    monkeypatch.setattr(reorder, "time", SimpleNamespace(monotonic_ns=lambda: clock[0]))
    buffer = ReorderBuffer(window=4096, timeout_s=1, idle_evict_s=60)
    released = []
    for order in range(1, 40):  # a dropped frame every 100 ms while frame 0 runs
        clock[0] = order * 100_000_000
        buffer.skip(frame(order))
        released += buffer.expire()
    released += buffer.push(frame(0)) + buffer.push(frame(40))
    assert orders(released) == [0, 40]
    assert buffer.gave_up == buffer.late == buffer.held() == 0


def test_dropped_places_alone_are_given_up_on_after_idle_evict_s() -> None:
    """A frame that never comes, behind which only dropped frames' places wait: they are
    released after ``idle_evict_s``, so the stream can be forgotten."""
    buffer = ReorderBuffer(window=8, timeout_s=1, idle_evict_s=30)
    buffer.skip(frame(1))
    start = time.monotonic_ns()
    assert buffer.expire(now_ns=start) == []
    buffer.close(("a", 0))
    assert buffer.expire(now_ns=start + 20 * 10**9) == [] and buffer.held() == 1
    assert buffer.expire(now_ns=start + 31 * 10**9) == [] and buffer.held() == 0
    assert buffer.gave_up == 1
    buffer.expire(now_ns=start + 32 * 10**9)
    assert buffer.released_through(("a", 0)) > 2


def eos(order: int, source: str = "a", epoch: int = 0) -> EndOfStream:
    item = EndOfStream(source, order)
    item.epoch, item.order = epoch, order
    return item


def test_an_end_of_stream_waits_timeout_s_after_the_give_up(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Frame 0 runs long; the end of stream behind it is held, then frame 0 is given up on
    ``timeout_s`` later: the end of stream waits ``timeout_s`` more for it (its own wait ran
    out one tick after the give-up, and it was published before frame 0)."""
    clock = [0]
    monkeypatch.setattr(reorder, "time", SimpleNamespace(monotonic_ns=lambda: clock[0]))
    buffer = ReorderBuffer(window=4096, timeout_s=1, idle_evict_s=60)
    released = buffer.push(frame(1)) + buffer.push(eos(2))
    for tick in range(1, 150):  # the egress loop's ticks, 10 ms apart, for 1.5 s
        clock[0] = tick * 10_000_000
        released += buffer.expire()
    released += buffer.push(frame(0))  # given up on at 1 s, comes at 1.5 s
    assert [(type(i).__name__, i.order) for i in released] == [
        ("Frame", 1),
        ("Frame", 0),
        ("EndOfStream", 2),
    ]
    assert buffer.gave_up == buffer.late == 1


def test_gaps_that_waited_are_given_up_on_in_one_tick(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = [0]
    monkeypatch.setattr(reorder, "time", SimpleNamespace(monotonic_ns=lambda: clock[0]))
    buffer = ReorderBuffer(window=4096, timeout_s=1, idle_evict_s=60)
    for order in (1, 3, 5):  # 0, 2 and 4 missing
        buffer.push(frame(order))
    clock[0] = 10**9
    assert orders(buffer.expire()) == [1, 3, 5] and buffer.gave_up == 3


def test_a_frame_of_a_stream_the_tracker_forgot_is_late() -> None:
    """A frame stuck so long that its source was forgotten anyway (ten idle times), and
    this buffer's memory of the stream expired: it is published at once, as late. It used to
    open the stream anew at order 0, give up on every order before its own (a dict entry
    each) and pin the stream, never closed again, for good."""
    buffer = ReorderBuffer(window=4096, timeout_s=1, idle_evict_s=1)
    buffer.tracked = lambda key: key != ("a", 0)
    assert orders(buffer.push(frame(100_000))) == [100_000]
    buffer.skip(frame(100_001))
    assert buffer.expire() == [] and buffer.held() == 0
    assert buffer.late == 1 and buffer.gave_up == 0 and buffer.released_through(("a", 0)) == 0
    assert orders(buffer.push(frame(0, source="b"))) == [0]  # streams it tracks open as ever


def test_a_stream_is_forgotten_only_once_its_source_tracker_closed_it() -> None:
    """Idle for long with a frame of it still in the pipeline: the stream stays, so that
    frame's result is released in its place (a stream forgotten under it, then met again,
    started at order 0 and held it for orders published long before); once closed and
    empty it is forgotten, and a frame of it that still comes is late."""
    buffer = ReorderBuffer(window=8, timeout_s=1, idle_evict_s=1)
    assert orders(buffer.push(frame(0))) == [0]
    later = time.monotonic_ns() + 100 * 10**9
    assert buffer.expire(now_ns=later) == [] and buffer.released_through(("a", 0)) == 1
    assert orders(buffer.push(frame(1))) == [1] and buffer.late == 0
    buffer.close(("a", 0))
    assert buffer.expire() == [] and buffer.released_through(("a", 0)) > 2
    assert orders(buffer.push(frame(2))) == [2] and buffer.late == 1
    assert buffer.released_through(("b", 0)) == 0  # never seen

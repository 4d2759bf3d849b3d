import threading
import time
from collections.abc import Callable
from concurrent.futures import Future

import pytest

from streamer.errors import FrameError, Reason
from streamer.frames import EndOfStream, Frame, OutcomeCounts
from streamer.scheduling.admission import AdmissionQueue
from streamer.scheduling.sources import SourceTracker


def make(capacity: int = 2) -> tuple[AdmissionQueue, OutcomeCounts, list[Frame], threading.Event]:
    counts, dropped, abort = OutcomeCounts(), [], threading.Event()

    def prepare(frame: Frame, *, inline: bool = True) -> Future[Frame]:
        future: Future[Frame] = Future()
        return future

    admission = AdmissionQueue(capacity, SourceTracker(60), prepare, counts, dropped.append, abort)
    return admission, counts, dropped, abort


def frame(source: str, seq: int) -> Frame:
    return Frame(source, seq, time.monotonic_ns(), time.time())


def drain(admission: AdmissionQueue) -> list:
    return admission.take(1, 0)


def test_drop_oldest_keeps_the_frame_being_prepared_and_the_newest() -> None:
    """A queue of 2 prepares 1 ahead (half of it): frame 0; the oldest of the others goes."""
    admission, counts, dropped, _ = make(capacity=2)
    for seq in range(4):
        admission.offer(frame("a", seq), "drop_oldest")
    assert [f.seq for f in drain(admission)] == [0, 3]
    assert counts.snapshot().dropped == {"queue_full": 2}
    assert [f.seq for f in dropped] == [1, 2]
    assert all(f.pending is None for f in dropped)  # never prepared


def test_a_queue_full_of_block_frames_and_frames_being_prepared_drops_one_of_those() -> None:
    """Room for a frame that must wait is made before it is queued: with no other frame
    waiting, the oldest frame in the window goes, never the newcomer (which is not queued
    yet: picking it raised ValueError out of offer and ended the ingress thread)."""
    admission, counts, dropped, _ = make(capacity=4)  # a window of 2
    for seq in range(2):
        admission.offer(frame("b", seq), "block")
    admission.offer(frame("a", 0), "latest")
    admission.offer(frame("c", 0), "latest")
    assert admission.offer(frame("a", 1), "latest") is None
    assert [(f.source, f.seq) for f in dropped] == [("a", 0)]
    assert counts.snapshot().dropped == {"queue_full": 1}
    taken = drain(admission)
    assert [(f.source, f.seq) for f in taken] == [("b", 0), ("b", 1), ("c", 0), ("a", 1)]


def test_frames_queued_before_a_reload_are_dropped_before_those_after_it() -> None:
    """A reload's switch prepares the waiting frames for the old chain, but they stay first to
    go under drop_oldest: overload during the swap drops stale frames, not fresh ones."""
    counts, dropped = OutcomeCounts(), []
    admission = AdmissionQueue(
        8, SourceTracker(60), Recorder(), counts, dropped.append, threading.Event(), 2
    )
    for seq in range(8):
        admission.offer(frame("cam", seq), "drop_oldest")
    admission.put_marker("stop", lambda: None)
    for seq in range(8, 12):
        admission.offer(frame("cam", seq), "drop_oldest")
    assert [f.seq for f in dropped] == [2, 3, 4, 5]
    assert all(f.pending is not None and f.pending.cancelled() for f in dropped)
    queued = [getattr(i, "seq", i) for i in admission.take(16, 0)]
    assert queued == [0, 1, 6, 7, "stop"]


def test_latest_keeps_each_sources_frame_being_prepared_and_its_newest() -> None:
    """The first frame of each source is being prepared: it stays (its decode is not thrown
    away); each newer frame waits unprepared and is replaced by the next one at no cost."""
    admission, counts, _, _ = make(capacity=8)
    for seq in range(4):
        admission.offer(frame("a", seq), "latest")
        admission.offer(frame("b", seq), "latest")
    taken = drain(admission)
    assert [(f.source, f.seq) for f in taken] == [("a", 0), ("b", 0), ("a", 3), ("b", 3)]
    assert counts.snapshot().dropped == {"superseded": 4}
    assert all(f.pending is not None and f.error is None for f in taken)  # started as taken


class Recorder:
    """A ``prepare`` that records what it was asked, with the chain it would prepare for."""

    def __init__(self) -> None:
        self.chain = "old"
        self.calls: list[tuple[int, bool, str]] = []

    def __call__(self, frame: Frame, *, inline: bool = True) -> Future[Frame]:
        self.calls.append((frame.seq, inline, self.chain))
        return Future()


def test_drop_oldest_prepares_a_few_ahead_and_drops_unprepared_frames_first() -> None:
    """Frames beyond ``prepare_ahead`` wait as received; a full queue drops the oldest of
    those, whose preparation never began, and the batcher's takes start the next ones."""
    prepare, counts, dropped = Recorder(), OutcomeCounts(), []
    admission = AdmissionQueue(
        4, SourceTracker(60), prepare, counts, dropped.append, threading.Event(), prepare_ahead=2
    )
    for seq in range(6):
        admission.offer(frame("a", seq), "drop_oldest")
    assert [f.seq for f in dropped] == [2, 3] and all(f.pending is None for f in dropped)
    assert counts.snapshot().dropped == {"queue_full": 2}
    assert prepare.calls == [(0, True, "old"), (1, True, "old")]
    assert [f.seq for f in admission.take(1, 0, limit=1)] == [0]
    assert prepare.calls[-1] == (4, False, "old")  # on the pool, as the window moved
    assert [f.seq for f in admission.take(1, 0)] == [1, 4, 5]
    assert [c[0] for c in prepare.calls] == [0, 1, 4, 5]


def test_a_reload_switch_prepares_the_waiting_frames_for_the_old_chain() -> None:
    """Frames queued before a reload's marker run on the old chain: those still waiting
    are prepared for it before the switch; frames after the marker for the new one."""
    prepare = Recorder()
    admission = AdmissionQueue(
        8, SourceTracker(60), prepare, OutcomeCounts(), [].append, threading.Event(), 1
    )
    for seq, source in enumerate("abc"):
        admission.offer(frame(source, seq), "latest")
    assert prepare.calls == [(0, True, "old")]
    admission.put_marker("stop", lambda: setattr(prepare, "chain", "new"))
    admission.offer(frame("d", 3), "latest")
    assert prepare.calls == [(0, True, "old"), (1, False, "old"), (2, False, "old")]
    assert [getattr(i, "seq", i) for i in admission.take(8, 0)] == [0, 1, 2, "stop"]
    assert prepare.calls[-1] == (3, False, "new")
    assert [f.seq for f in admission.take(1, 0)] == [3]


def test_block_waits_for_room_and_gives_up_on_abort() -> None:
    admission, counts, _, abort = make(capacity=1)
    admission.offer(frame("a", 0), "block")
    blocked = threading.Thread(target=admission.offer, args=(frame("a", 1), "block"))
    blocked.start()
    blocked.join(0.2)
    assert blocked.is_alive()
    assert [f.seq for f in admission.take(1, 1)] == [0]
    blocked.join(2)
    assert not blocked.is_alive() and [f.seq for f in admission.take(1, 1)] == [1]
    assert admission.offer(frame("a", 2), "block") is None
    abort.set()
    assert admission.offer(frame("a", 3), "block") == "shutdown"
    assert counts.snapshot().dropped == {"shutdown": 1}


def test_markers_are_never_dropped_and_stale_frames_are() -> None:
    admission, counts, _, _ = make(capacity=1)
    assert admission.offer(frame("a", 5), "drop_oldest") is None
    assert admission.offer(frame("a", 5), "drop_oldest") == "stale_seq"  # said in a reply
    assert admission.offer(EndOfStream("a", 5), "drop_oldest") is None
    admission.put_marker("stop")
    items = drain(admission)  # a take ends at a marker
    items += drain(admission)
    assert isinstance(items[1], EndOfStream) and items[1].order == 1 and items[2] == "stop"
    assert counts.snapshot().dropped == {"stale_seq": 1}


def test_failed_frames_are_queued_without_preparation() -> None:
    admission, _, _, _ = make()
    broken = frame("", -1)
    broken.fail(FrameError(Reason.BAD_HEADER, "x"))
    admission.offer(broken, "block")
    [item] = admission.take(1, 1)
    assert item is broken and item.pending is None and item.order == -1


def test_frames_offered_after_a_reloads_marker_wait_for_the_new_batcher() -> None:
    """A reload queues STOP with its switch while frames keep coming: the old chain's
    batcher, which returns at STOP, takes only what came before it."""
    admission, counts, _, _ = make(capacity=8)
    switched: list[bool] = []
    for seq in range(2):
        admission.offer(frame("a", seq), "block")
    admission.put_marker("stop", lambda: switched.append(True))
    for seq in range(2, 4):
        admission.offer(frame("a", seq), "block")
    old = admission.take(8, 1)
    assert switched and [f.seq for f in old[:-1]] == [0, 1] and old[-1] == "stop"
    assert admission.qsize() == 2
    assert [f.seq for f in admission.take(2, 1)] == [2, 3]
    assert counts.snapshot().dropped == {}


def make_preparing(prepare: Callable[[Frame], None]) -> AdmissionQueue:
    counts, abort = OutcomeCounts(), threading.Event()
    return AdmissionQueue(8, SourceTracker(60), prepare, counts, [].append, abort)


def test_ingresses_prepare_at_once_outside_the_lock() -> None:
    """Two ingress threads each wait inside prepare for the other to be there too: only
    possible when preparing holds no lock the other needs."""
    both_preparing = threading.Barrier(2, timeout=5)

    def prepare(frame: Frame) -> None:
        both_preparing.wait()

    admission = make_preparing(prepare)
    threads = [
        threading.Thread(target=admission.offer, args=(frame(source, 0), "block"))
        for source in ("a", "b")
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(5)
    assert not both_preparing.broken
    assert sorted(f.source for f in admission.take(2, 1)) == ["a", "b"]


def test_a_reload_switch_waits_for_the_preparation_under_way() -> None:
    """A frame being prepared for the old chain when a reload switches is queued before the
    reload's marker; one offered during the switch is prepared for the new chain."""
    chain = ["old"]
    preparing, go_on = threading.Event(), threading.Event()

    def prepare(item: Frame) -> None:
        item.model = chain[0]
        if item.seq == 0:
            preparing.set()
            go_on.wait(5)

    admission = make_preparing(prepare)
    ingress = threading.Thread(target=admission.offer, args=(frame("a", 0), "block"))
    ingress.start()
    assert preparing.wait(5)

    def switch() -> None:
        chain[0] = "new"
        late = threading.Thread(target=admission.offer, args=(frame("a", 1), "block"))
        late.start()
        late.join(0.2)
        assert late.is_alive()  # its preparation waits for the switch
        threads.append(late)

    threads: list[threading.Thread] = []
    reload = threading.Thread(target=admission.put_marker, args=("stop", switch))
    reload.start()
    reload.join(0.2)
    assert reload.is_alive() and chain == ["old"]  # the switch waits for frame 0
    go_on.set()
    for thread in [ingress, reload, *threads]:
        thread.join(5)
    old = admission.take(8, 1)
    assert [(f.seq, f.model) for f in old[:-1]] == [(0, "old")] and old[-1] == "stop"
    assert [(f.seq, f.model) for f in admission.take(1, 1)] == [(1, "new")]


def test_frames_cannot_be_put_around_admission() -> None:
    admission, _, _, _ = make()
    with pytest.raises(TypeError):
        admission.put(frame("a", 0))
    admission.put("stop")
    assert admission.take(1, 0) == ["stop"]


def test_a_reload_switch_does_not_wait_for_a_blocked_ingress() -> None:
    """A ``block`` frame waiting for room is not yet being prepared: a reload's switch goes
    ahead at once, and the frame, once there is room, is prepared for the new chain."""
    chain = ["old"]

    def prepare(item: Frame) -> None:
        item.model = chain[0]

    admission = AdmissionQueue(
        2, SourceTracker(60), prepare, OutcomeCounts(), [].append, threading.Event()
    )
    for seq in range(2):
        admission.offer(frame("a", seq), "block")
    blocked = threading.Thread(target=admission.offer, args=(frame("a", 2), "block"))
    blocked.start()
    blocked.join(0.2)
    assert blocked.is_alive()  # the queue is full
    reload = threading.Thread(
        target=admission.put_marker, args=("stop", lambda: chain.append("new"))
    )
    reload.start()
    reload.join(5)
    assert not reload.is_alive(), "the switch waited for room in the queue"
    chain.pop(0)
    old = admission.take(8, 1)
    assert [(f.seq, f.model) for f in old[:-1]] == [(0, "old"), (1, "old")] and old[-1] == "stop"
    blocked.join(5)
    assert [(f.seq, f.model) for f in admission.take(1, 1)] == [(2, "new")]


def test_a_preparation_that_cannot_start_fails_its_frame_only() -> None:
    def prepare(item: Frame) -> None:
        raise RuntimeError("cannot schedule new futures after shutdown")

    admission = make_preparing(prepare)
    admission.offer(frame("a", 0), "block")
    [failed] = admission.take(1, 1)
    assert failed.error is not None and failed.error.reason == "preprocess_failed"


def test_a_given_up_reload_discards_its_marker_and_the_frames_before_it() -> None:
    """The old chain never took its STOP: the frames before it (prepared for the old chain)
    are dropped, end-of-stream markers among them stay, and frames after it are kept."""
    admission, counts, dropped, _ = make(capacity=8)
    admission.offer(frame("a", 0), "block")
    admission.offer(EndOfStream("b", 3), "block")
    admission.offer(frame("a", 1), "block")
    admission.put_marker("stop")
    admission.offer(frame("a", 2), "block")
    assert admission.discard_through("stop", Reason.RELOAD_GIVEN_UP) == 2
    assert [f.seq for f in dropped] == [0, 1]
    assert counts.snapshot().dropped == {"reload_given_up": 2}
    items = admission.take(8, 1)  # a take ends at the first marker
    items += admission.take(8, 1)
    assert isinstance(items[0], EndOfStream) and [f.seq for f in items[1:]] == [2]
    assert admission.qsize() == 0 and admission.discard_through("stop", Reason.SHUTDOWN) == 0


def test_frames_that_came_in_under_block_are_never_dropped_for_other_ingresses() -> None:
    """One queue, a policy per ingress: drop_oldest and latest make room with their own
    frames only; with nothing of theirs queued, their new frame is the one dropped."""
    admission, counts, dropped, _ = make(capacity=3)
    admission.offer(frame("cam", 0), "block")
    admission.offer(frame("live", 0), "drop_oldest")
    admission.offer(frame("cam", 1), "block")
    assert admission.offer(frame("live", 1), "drop_oldest") is None  # drops live 0, not cam 0
    admission.offer(frame("cam", 2), "latest")  # supersedes no block frame; drops live 1
    assert [(f.source, f.seq) for f in dropped] == [("live", 0), ("live", 1)]
    queued = [(f.source, f.seq) for f in admission.take(8, 1)]
    assert queued == [("cam", 0), ("cam", 1), ("cam", 2)]

    admission.offer(frame("cam", 3), "block")
    admission.offer(frame("cam", 4), "block")
    admission.offer(frame("cam", 5), "block")
    assert admission.offer(frame("live", 2), "drop_oldest") == "queue_full"  # only block ones
    assert [(f.source, f.seq) for f in dropped][-1] == ("live", 2)
    assert [f.seq for f in admission.take(8, 1)] == [3, 4, 5]
    assert counts.snapshot().dropped == {"queue_full": 3}


def test_a_frame_of_a_source_beyond_max_sources_is_queued_failed_unprepared() -> None:
    """Its error result goes to egress like any failed frame's; nothing is dropped, and the
    tracked source's frames go on being prepared."""
    prepared: list[Frame] = []
    counts = OutcomeCounts()
    tracker = SourceTracker(60, max_sources=1)
    admission = AdmissionQueue(8, tracker, prepared.append, counts, [].append, threading.Event())
    for item in (frame("a", 0), frame("b", 0), EndOfStream("b", 0), frame("a", 1)):
        admission.offer(item, "block")
    a0, b0, eos = admission.take(8, 1)  # a take ends at a marker
    [a1] = admission.take(8, 1)
    assert b0.error is not None and b0.error.reason == Reason.TOO_MANY_SOURCES
    assert (b0.order, b0.pending, eos.order) == (-1, None, -1)
    assert prepared == [a0, a1] and (a0.order, a1.order) == (0, 1)
    assert counts.snapshot().dropped == {}


def test_frames_failed_on_arrival_are_neither_dropped_for_room_nor_superseded() -> None:
    """Under drop_oldest and latest a frame refused on arrival keeps its place, as a block
    frame does: its error result is published (a rep reply has told its sender "refused",
    not "dropped"). Frames waiting for a decode make the room; with only kept frames queued,
    the newcomer is dropped."""
    admission, counts, dropped, _ = make(capacity=2)  # a window of 1
    refused = []
    for seq in range(2):
        broken = frame("bad", seq)
        broken.fail(FrameError(Reason.BAD_HEADER, "x"))
        refused.append(broken)
    assert admission.offer(refused[0], "drop_oldest") is None
    assert admission.offer(frame("cam", 0), "drop_oldest") is None  # prepared in the window
    assert admission.offer(frame("cam", 1), "drop_oldest") is None  # drops cam 0, not bad 0
    assert admission.offer(refused[1], "latest") is None  # supersedes no bad 0; drops cam 1
    assert admission.offer(frame("cam", 2), "drop_oldest") == "queue_full"
    assert [(f.source, f.seq) for f in dropped] == [("cam", 0), ("cam", 1), ("cam", 2)]
    assert admission.take(8, 1) == refused
    assert counts.snapshot().dropped == {"queue_full": 3}

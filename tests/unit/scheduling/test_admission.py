import threading
import time
from concurrent.futures import Future

from streamer.errors import FrameError, Reason
from streamer.frames import EndOfStream, Frame, OutcomeCounts
from streamer.scheduling.admission import AdmissionQueue
from streamer.scheduling.sources import SourceTracker


def make(capacity: int = 2) -> tuple[AdmissionQueue, OutcomeCounts, list[Frame], threading.Event]:
    counts, dropped, abort = OutcomeCounts(), [], threading.Event()

    def prepare(frame: Frame) -> Future[Frame]:
        future: Future[Frame] = Future()
        return future

    admission = AdmissionQueue(capacity, SourceTracker(60), prepare, counts, dropped.append, abort)
    return admission, counts, dropped, abort


def frame(source: str, seq: int) -> Frame:
    return Frame(source, seq, time.monotonic_ns(), time.time())


def drain(admission: AdmissionQueue) -> list:
    return admission.take(1, 0)


def test_drop_oldest_keeps_the_newest_frames() -> None:
    admission, counts, dropped, _ = make(capacity=2)
    for seq in range(4):
        admission.offer(frame("a", seq), "drop_oldest")
    assert [f.seq for f in drain(admission)] == [2, 3]
    assert counts.snapshot().dropped == {"queue_full": 2}
    assert [f.seq for f in dropped] == [0, 1]
    assert all(f.pending is not None and f.pending.cancelled() for f in dropped)


def test_latest_keeps_one_frame_per_source() -> None:
    admission, counts, _, _ = make(capacity=8)
    for seq in range(3):
        admission.offer(frame("a", seq), "latest")
        admission.offer(frame("b", seq), "latest")
    assert [(f.source, f.seq) for f in drain(admission)] == [("a", 2), ("b", 2)]
    assert counts.snapshot().dropped == {"superseded": 4}


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
    admission.offer(frame("a", 2), "block")
    abort.set()
    admission.offer(frame("a", 3), "block")
    assert counts.snapshot().dropped == {"shutdown": 1}


def test_markers_are_never_dropped_and_stale_frames_are() -> None:
    admission, counts, _, _ = make(capacity=1)
    admission.offer(frame("a", 5), "drop_oldest")
    admission.offer(frame("a", 5), "drop_oldest")
    admission.offer(EndOfStream("a", 5), "drop_oldest")
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

import time

from structlog.testing import capture_logs

from streamer.errors import FrameError, Reason
from streamer.frames import EndOfStream, Frame
from streamer.scheduling.sources import MAX_DROPOUT, MAX_MISORDER, MAX_RUNS, SourceTracker


def frame(source: str, seq: int, at_ns: int = 0, run: str | None = None) -> Frame:
    return Frame(source, seq, at_ns or time.monotonic_ns(), time.time(), run=run)


def test_in_order_gaps_and_stale() -> None:
    tracker = SourceTracker(idle_evict_s=60)
    frames = [frame("a", s) for s in (0, 1, 4, 3, 4, 5)]
    accepted = [tracker.admit(f) for f in frames]
    assert accepted == [True, True, True, False, False, True]
    assert [f.order for f in frames if f.order >= 0] == [0, 1, 2, 3]
    stats = tracker.stats()
    assert (stats.seq_gaps, stats.stale, stats.restarts, stats.active_sources) == (2, 2, 0, 1)


def test_a_restart_at_zero_keeps_the_arrival_order() -> None:
    """Results after a restart must not overtake those before it (egress orders by
    ``order`` within an epoch)."""
    tracker = SourceTracker(idle_evict_s=60)
    first, second, again, next_ = frame("a", 0), frame("a", 1), frame("a", 0), frame("a", 1)
    assert all(tracker.admit(f) for f in (first, second, again, next_))
    assert again.epoch == first.epoch and (again.order, next_.order) == (2, 3)
    stats = tracker.stats()
    assert (stats.restarts, stats.seq_gaps, stats.stale) == (1, 0, 0)


def test_a_producer_restarting_on_every_frame_cannot_flood_the_log() -> None:
    tracker = SourceTracker(idle_evict_s=60)
    with capture_logs() as logs:
        for _ in range(1000):
            assert tracker.admit(frame("a", 0))
    assert tracker.stats().restarts == 999
    assert [e["event"] for e in logs] == ["source_restarted"] * 10


def test_a_zero_right_after_a_zero_is_a_restart() -> None:
    """A producer that sent one frame and restarted, or an imagezmq source its reader forgot
    (after 4096 others) and numbers from 0 again: its frame is not dropped."""
    tracker = SourceTracker(idle_evict_s=60)
    assert [tracker.admit(frame("a", s)) for s in (0, 0, 1)] == [True, True, True]
    assert tracker.stats().restarts == 1


def test_a_restart_with_a_counter_not_at_zero_is_confirmed_by_the_next_frame() -> None:
    """RFC 3550 A.1: a far backward jump is dropped, and the frame after it resynchronises."""
    tracker = SourceTracker(idle_evict_s=60)
    before = [frame("a", s) for s in range(500)]
    assert all(tracker.admit(f) for f in before)
    one, two, three = frame("a", 1), frame("a", 2), frame("a", 3)
    assert [tracker.admit(f) for f in (one, two, three)] == [False, True, True]
    assert two.epoch == before[0].epoch and (two.order, three.order) == (500, 501)
    stats = tracker.stats()
    assert (stats.stale, stats.restarts, stats.seq_gaps) == (1, 1, 0)


def test_only_the_very_next_frame_confirms_a_restart() -> None:
    tracker = SourceTracker(idle_evict_s=60)
    assert all(tracker.admit(frame("a", s)) for s in range(201))
    assert [tracker.admit(frame("a", s)) for s in (50, 190, 51)] == [False, False, False]
    assert tracker.stats().restarts == 0


def test_late_frames_never_restart_a_stream() -> None:
    tracker = SourceTracker(idle_evict_s=60)
    assert all(tracker.admit(frame("a", s)) for s in range(500))
    near = [frame("a", s) for s in (499 - MAX_MISORDER + 1, 499 - MAX_MISORDER + 2)]
    assert not any(tracker.admit(f) for f in near)  # late within the misorder window
    far, following = frame("a", 10), frame("a", 500)
    assert not tracker.admit(far)  # far behind: a restart, if the next frame is 11
    assert tracker.admit(following) and following.epoch == near[0].epoch
    late = frame("a", 11)  # the probe ended with the in-order frame
    assert not tracker.admit(late)
    assert tracker.stats().restarts == 0


def test_a_far_forward_jump_is_a_restart_not_a_gap() -> None:
    tracker = SourceTracker(idle_evict_s=60)
    first, near, far = frame("a", 0), frame("a", 1 + MAX_DROPOUT), frame("a", 2**53 - 2)
    assert tracker.admit(first) and tracker.admit(near) and tracker.admit(far)
    assert near.epoch == far.epoch == first.epoch and far.order == 2
    stats = tracker.stats()
    assert (stats.seq_gaps, stats.restarts) == (MAX_DROPOUT, 1)


def test_sources_are_independent() -> None:
    tracker = SourceTracker(idle_evict_s=60)
    a, b = frame("a", 5), frame("b", 5)
    assert tracker.admit(a) and tracker.admit(b)
    assert a.epoch != b.epoch and a.order == b.order == 0


def test_after_an_end_of_stream_the_next_clip_starts_anew_in_the_same_order() -> None:
    """A producer sending clip after clip on one source id: each clip's results and end of
    stream are published before the next clip's (same epoch, later orders), and the next
    clip's seq starts anew: no restart, gap or stale frame."""
    tracker = SourceTracker(idle_evict_s=60)
    last = frame("a", 7)
    tracker.admit(frame("a", 6))
    tracker.admit(last)
    eos = EndOfStream("a", 7)
    tracker.end(eos)
    assert (eos.epoch, eos.order) == (last.epoch, last.order + 1)
    ended = tracker.stats()  # ended, but held against max_sources until forgotten
    assert (ended.active_sources, ended.tracked_sources) == (0, 1)
    clip = [frame("a", 3), frame("a", 4)]
    assert all(tracker.admit(f) for f in clip)
    assert [(f.epoch, f.order) for f in clip] == [(last.epoch, 3), (last.epoch, 4)]
    stats = tracker.stats()
    assert (stats.restarts, stats.seq_gaps, stats.stale, stats.active_sources) == (0, 0, 0, 1)
    assert tracker.evict_idle(now_ns=time.monotonic_ns() + 61 * 10**9) == ["a"]
    again = frame("a", 0)
    assert tracker.admit(again) and again.epoch != last.epoch and again.order == 0


def test_a_new_run_is_a_restart_and_the_old_runs_backlog_is_not_stale() -> None:
    """A producer restarted while its old connection's frames are still queued: ZeroMQ hands
    both over in turns. With ``run`` each is checked against its own count: no frame is
    stale, one restart is counted, and all keep the arrival order."""
    tracker = SourceTracker(idle_evict_s=60)
    old = [frame("a", s, run="r1") for s in range(500, 505)]
    new = [frame("a", s, run="r2") for s in range(5)]
    arrived = [old[0], old[1], new[0], old[2], new[1], new[2], old[3], old[4], new[3], new[4]]
    with capture_logs() as logs:
        assert all(tracker.admit(f) for f in arrived)
    assert [f.order for f in arrived] == list(range(10))
    assert len({f.epoch for f in arrived}) == 1
    stats = tracker.stats()
    assert (stats.restarts, stats.seq_gaps, stats.stale) == (1, 0, 0)
    assert [(e["run"], e["seq"]) for e in logs if e["event"] == "source_restarted"] == [("r2", 0)]
    assert not tracker.admit(frame("a", 503, run="r1"))  # a duplicate of its run
    assert not tracker.admit(frame("a", 4, run="r2"))


def test_without_run_the_old_backlog_reads_as_stale() -> None:
    """The same restart without ``run``: one count for both, so frames of the one behind
    the other's last are stale (here the new run's, after an old frame read as a gap)."""
    tracker = SourceTracker(idle_evict_s=60)
    arrived = [frame("a", 500), frame("a", 0), frame("a", 501), frame("a", 1)]
    assert [tracker.admit(f) for f in arrived] == [True, True, True, False]


def test_a_new_run_after_an_end_of_stream_is_no_restart() -> None:
    tracker = SourceTracker(idle_evict_s=60)
    assert tracker.admit(frame("a", 0, run="r1"))
    tracker.end(EndOfStream("a", 0, run="r1"))
    assert tracker.admit(frame("a", 9, run="r2"))
    stats = tracker.stats()
    assert (stats.restarts, stats.seq_gaps, stats.stale) == (0, 0, 0)
    assert tracker.admit(frame("a", 0, run="r1"))  # ended: a new run again, not stale


def test_a_source_keeps_the_seq_of_its_latest_runs_only() -> None:
    """A producer restarting in a loop cannot grow its source's state: beyond ``MAX_RUNS``
    the run with the oldest frame is forgotten, and a frame of it counts as a new run."""
    tracker = SourceTracker(idle_evict_s=60)
    for run in range(MAX_RUNS + 1):
        assert tracker.admit(frame("a", 10, run=f"r{run}"))
    assert tracker.stats().restarts == MAX_RUNS
    assert tracker.admit(frame("a", 10, run=f"r{MAX_RUNS}")) is False  # still known
    assert tracker.admit(frame("a", 10, run="r0"))  # forgotten: not stale, a new run
    assert tracker.stats().restarts == MAX_RUNS + 1


def test_an_end_of_stream_ends_every_run_of_its_source() -> None:
    """An ``eos`` without ``run`` (a tool that sends none) or of another run: the next clip
    of the run that sent frames starts anew (it was stale against that run's old count)."""
    for ending in (None, "other"):
        tracker = SourceTracker(idle_evict_s=60)
        assert all(tracker.admit(frame("a", seq, run="live")) for seq in range(200))
        tracker.end(EndOfStream("a", 199, run=ending))
        assert tracker.admit(frame("a", 5, run="live"))
        stats = tracker.stats()
        assert (stats.restarts, stats.seq_gaps, stats.stale) == (0, 0, 0)


def test_a_refused_next_seq_moves_its_run() -> None:
    tracker = SourceTracker(idle_evict_s=60)
    assert tracker.admit(frame("a", 0, run="r")) and tracker.admit(frame("a", 1, run="r"))
    bad = refused("a", 2)
    bad.run = "r"
    assert tracker.admit(bad) and tracker.admit(frame("a", 3, run="r"))
    assert not tracker.admit(frame("a", 2, run="r"))
    stats = tracker.stats()
    assert (stats.restarts, stats.seq_gaps, stats.stale) == (0, 0, 1)


def test_a_refused_header_moves_no_run_and_counts_no_restart() -> None:
    tracker = SourceTracker(idle_evict_s=60)
    assert tracker.admit(frame("a", 0, run="r1"))
    assert tracker.admit(refused("a", 1))  # its run could not be read: None
    assert tracker.admit(frame("a", 1, run="r1"))
    stats = tracker.stats()
    assert (stats.restarts, stats.seq_gaps, stats.stale) == (0, 0, 0)


def test_idle_sources_are_evicted() -> None:
    tracker = SourceTracker(idle_evict_s=1.0)
    tracker.admit(frame("old", 0, at_ns=1))
    tracker.admit(frame("new", 0, at_ns=2_000_000_000))
    assert tracker.evict_idle(now_ns=2_500_000_000) == ["old"]
    assert tracker.stats().active_sources == 1


def refused(source: str, seq: int) -> Frame:
    """A frame whose header was refused, named by the source and seq it claimed."""
    bad = frame(source, seq)
    bad.fail(FrameError(Reason.BAD_HEADER, "`seq` must be an integer in 0..2**53 - 1"))
    return bad


def test_a_refused_header_takes_its_place_but_moves_no_sequence_state() -> None:
    tracker = SourceTracker(idle_evict_s=60)
    frames = [frame("a", 0), frame("a", 1), refused("a", 2**53), refused("a", 0)]
    frames += [refused("a", 1), frame("a", 2), refused("a", 3), frame("a", 4)]
    assert all(tracker.admit(f) for f in frames)
    assert [f.order for f in frames] == list(range(8))
    assert len({f.epoch for f in frames}) == 1
    stats = tracker.stats()
    assert (stats.seq_gaps, stats.stale, stats.restarts) == (0, 0, 0)


def test_a_refused_header_first_takes_its_place_and_sets_no_seq() -> None:
    """A source's first frame refused: its error result is published before the source's
    next frames (order 0), and the next frame's seq is the first trusted one."""
    tracker = SourceTracker(idle_evict_s=60)
    first = refused("a", 2**53)
    assert tracker.admit(first) and first.order == 0
    after = frame("a", 5)
    assert tracker.admit(after) and (after.epoch, after.order) == (first.epoch, 1)
    stats = tracker.stats()
    assert (stats.seq_gaps, stats.restarts, stats.stale) == (0, 0, 0)
    assert tracker.admit(frame("a", 6)) and tracker.stats().seq_gaps == 0


def test_a_source_with_items_in_flight_keeps_its_epoch_until_they_have_left() -> None:
    """Idle longer than ``idle_evict_s`` while its frames are still in the pipeline (a long
    batch deadline): the source is not forgotten, so its end of stream takes its place after
    them instead of going out first; once the reorder buffer has released them all it is
    forgotten, and the buffer is told which stream."""
    released = {"through": 0}
    forgotten: list[tuple[str, int]] = []
    tracker = SourceTracker(1.0, lambda key: released["through"], forgotten.append)
    frames = [frame("cam", seq, at_ns=1) for seq in range(3)]
    assert all(tracker.admit(f) for f in frames)
    assert tracker.evict_idle(now_ns=2 * 10**9) == []  # idle, but 3 items in flight
    eos = EndOfStream("cam", 2)
    tracker.end(eos)
    assert (eos.epoch, eos.order) == (frames[0].epoch, 3)
    released["through"] = 4  # the three frames and the end of stream
    assert tracker.evict_idle(now_ns=3 * 10**9) == ["cam"]
    assert forgotten == [("cam", frames[0].epoch)]


def test_a_source_whose_items_never_leave_is_forgotten_after_ten_idle_times() -> None:
    tracker = SourceTracker(1.0, lambda key: 0)
    assert tracker.admit(frame("cam", 0, at_ns=1))
    assert tracker.evict_idle(now_ns=10 * 10**9) == []
    assert tracker.evict_idle(now_ns=10 * 10**9 + 2) == ["cam"]


def test_a_long_source_id_is_cut_short_in_the_log() -> None:
    tracker = SourceTracker(idle_evict_s=1.0)
    source = "x" * 60_000
    assert tracker.admit(frame(source, 5, at_ns=1))
    with capture_logs() as logs:
        assert tracker.admit(frame(source, 0, at_ns=2))  # a restart
        assert tracker.evict_idle(now_ns=5 * 10**9) == [source]
    assert [e["source"] for e in logs] == [f"{'x' * 256}… (60000 characters)"] * 2


def test_a_new_source_beyond_max_sources_fails_and_opens_no_stream() -> None:
    tracker = SourceTracker(idle_evict_s=60, max_sources=2)
    a, b, c = frame("a", 0), frame("b", 0), frame("c", 0)
    assert tracker.admit(a) and tracker.admit(b) and tracker.admit(c)
    assert c.error is not None and c.error.reason == Reason.TOO_MANY_SOURCES
    assert "daemon.max_sources" in c.error.detail and c.order == -1
    assert tracker.stats().active_sources == 2
    known = [frame("a", 1), frame("b", 1)]
    assert all(tracker.admit(f) for f in known)
    assert [(f.error, f.order) for f in known] == [(None, 1), (None, 1)]


def test_a_refused_source_is_admitted_once_a_tracked_one_is_forgotten() -> None:
    tracker = SourceTracker(idle_evict_s=1.0, max_sources=1)
    assert tracker.admit(frame("old", 0, at_ns=1))
    refused_first = frame("new", 0, at_ns=2)
    assert tracker.admit(refused_first) and refused_first.order == -1
    assert tracker.evict_idle(now_ns=2 * 10**9) == ["old"]
    admitted = frame("new", 1, at_ns=2 * 10**9)
    assert tracker.admit(admitted)
    assert (admitted.error, admitted.order) == (None, 0)


def test_a_source_ended_but_not_forgotten_still_counts_towards_max_sources() -> None:
    """Otherwise a sender could end every id it makes up and track them without bound."""
    tracker = SourceTracker(idle_evict_s=60, max_sources=1)
    assert tracker.admit(frame("a", 0))
    tracker.end(EndOfStream("a", 0))
    late = frame("b", 0)
    assert tracker.admit(late) and late.error is not None and late.order == -1


def test_an_end_of_stream_of_a_source_not_tracked_opens_no_stream() -> None:
    tracker = SourceTracker(idle_evict_s=60, max_sources=1)
    unknown = EndOfStream("x", 3)
    tracker.end(unknown)
    assert unknown.order == -1
    first = frame("a", 0)
    assert tracker.admit(first) and first.error is None  # the end of stream took no slot
    beyond = EndOfStream("c", 0)
    tracker.end(beyond)
    assert beyond.order == -1
    assert tracker.evict_idle(now_ns=time.monotonic_ns() + 61 * 10**9) == ["a"]


def test_a_frame_failed_already_keeps_its_reason_beyond_max_sources() -> None:
    tracker = SourceTracker(idle_evict_s=60, max_sources=1)
    assert tracker.admit(frame("a", 0))
    bad = refused("b", 7)
    with capture_logs() as logs:
        assert tracker.admit(bad)
    assert bad.error is not None and bad.error.reason == Reason.BAD_HEADER and bad.order == -1
    assert logs == []  # too_many_sources would say why it failed, wrongly


def test_a_stuck_source_holds_its_place_until_forgotten_anyway() -> None:
    """A source whose items never leave is forgotten after ten idle times, and frees its
    place for a new source then."""
    tracker = SourceTracker(1.0, lambda key: 0, max_sources=1)
    assert tracker.admit(frame("stuck", 0, at_ns=1))
    assert tracker.evict_idle(now_ns=10 * 10**9) == []
    waiting = frame("new", 0, at_ns=10 * 10**9)
    assert tracker.admit(waiting) and waiting.order == -1
    assert tracker.evict_idle(now_ns=10 * 10**9 + 2) == ["stuck"]
    admitted = frame("new", 1, at_ns=10 * 10**9 + 2)
    assert tracker.admit(admitted) and (admitted.error, admitted.order) == (None, 0)


def test_a_flood_of_new_sources_logs_ten_lines_of_its_ids_cut_short() -> None:
    tracker = SourceTracker(idle_evict_s=60, max_sources=1)
    assert tracker.admit(frame("a", 0))
    with capture_logs() as logs:
        for index in range(1000):
            assert tracker.admit(frame(f"{index:05d}" + "x" * 60_000, 0))
    assert [e["event"] for e in logs] == ["too_many_sources"] * 10
    assert all(e["log_level"] == "warning" and e["max_sources"] == 1 for e in logs)
    assert logs[0]["source"] == f"00000{'x' * 251}… (60005 characters)"
    assert tracker.stats().active_sources == 1


def test_tracks_says_whether_a_stream_is_its_sources_current_one() -> None:
    tracker = SourceTracker(idle_evict_s=1.0)
    first = frame("a", 0, at_ns=1)
    tracker.admit(first)
    key = (first.source, first.epoch)
    assert tracker.tracks(key) and not tracker.tracks(("b", first.epoch))
    tracker.evict_idle(now_ns=5_000_000_000)
    again = frame("a", 0)
    tracker.admit(again)
    assert not tracker.tracks(key) and tracker.tracks(("a", again.epoch))

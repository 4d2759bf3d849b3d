"""The batcher's inbox: one wake per batch's worth of frames, markers at once."""

from __future__ import annotations

import threading
import time

from streamer.frames import STOP, Frame
from streamer.scheduling.mailbox import Mailbox


def frame(seq: int) -> Frame:
    return Frame("cam", seq, time.monotonic_ns(), time.time())


def taker(mailbox: Mailbox, wanted: int, timeout: float) -> tuple[threading.Thread, list]:
    taken: list = []
    thread = threading.Thread(target=lambda: taken.extend(mailbox.take(wanted, timeout)))
    thread.start()
    return thread, taken


def test_take_returns_once_the_wanted_frames_are_queued() -> None:
    mailbox = Mailbox()
    thread, taken = taker(mailbox, 3, 30)
    for seq in range(2):
        mailbox.put(frame(seq))
    thread.join(0.2)
    assert thread.is_alive() and not taken  # two of three: still waiting
    mailbox.put(frame(2))
    thread.join(10)
    assert not thread.is_alive() and [f.seq for f in taken] == [0, 1, 2]
    assert mailbox.qsize() == 0


def test_a_marker_wakes_the_consumer_with_what_came_before_it() -> None:
    mailbox = Mailbox()
    thread, taken = taker(mailbox, 8, 30)
    mailbox.put(frame(0))
    mailbox.put(STOP)
    thread.join(10)
    assert not thread.is_alive() and taken[0].seq == 0 and taken[1] is STOP


def test_timeout_returns_what_is_there() -> None:
    mailbox = Mailbox()
    mailbox.put(frame(0))
    assert [f.seq for f in mailbox.take(8, 0.01)] == [0]
    assert mailbox.take(8, 0) == []


def test_everything_queued_is_taken_even_beyond_wanted() -> None:
    mailbox = Mailbox()
    for seq in range(5):
        mailbox.put(frame(seq))
    assert [f.seq for f in mailbox.take(2, 1)] == [0, 1, 2, 3, 4]


def test_a_take_ends_at_a_marker() -> None:
    """What is queued behind a marker waits for the next take: behind a reload's STOP are
    the frames prepared for the new chain, whose batcher takes them (the old one returns at
    STOP and would lose them)."""
    mailbox = Mailbox()
    for item in (frame(0), STOP, frame(1), frame(2)):
        mailbox.put(item)
    first = mailbox.take(8, 1)
    assert first[0].seq == 0 and first[1:] == [STOP]
    assert [f.seq for f in mailbox.take(2, 0)] == [1, 2]


def test_a_take_returns_at_most_its_limit() -> None:
    mailbox = Mailbox()
    for seq in range(5):
        mailbox.put(frame(seq))
    mailbox.put(STOP)
    assert [f.seq for f in mailbox.take(1, 0, limit=2)] == [0, 1]
    rest = mailbox.take(1, 0, limit=8)
    assert [f.seq for f in rest[:-1]] == [2, 3, 4] and rest[-1] is STOP

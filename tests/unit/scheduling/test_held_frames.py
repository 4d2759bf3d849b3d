"""A chain given up on accounts for every frame it holds, exactly once, and at once."""

from __future__ import annotations

import queue
from typing import Any

from streamer.errors import Reason
from streamer.frames import STOP, Batch, EndOfStream, Frame, OutcomeCounts
from streamer.scheduling.held_frames import HeldFrames
from streamer.scheduling.mailbox import Mailbox
from streamer.scheduling.reorder import ReorderBuffer


def frame(order: int) -> Frame:
    """Frame ``order`` of source ``cam`` (its seq too), placed in the source's stream."""
    placed = Frame("cam", order, 0, 0.0)
    placed.order = order
    return placed


def held_with(
    *items: Any,
) -> tuple[HeldFrames, Mailbox, queue.SimpleQueue[Any], OutcomeCounts, ReorderBuffer]:
    """Frames held by a chain whose admission queue holds ``items``, and its outlets."""
    intake, results, counts = Mailbox(), queue.SimpleQueue[Any](), OutcomeCounts()
    reorder = ReorderBuffer(window=64, timeout_s=60.0, idle_evict_s=60.0)
    for item in items:
        intake.put(item)
    return HeldFrames(intake, results, counts, reorder.skip), intake, results, counts, reorder


def test_a_give_up_drops_what_is_held_once_and_its_source_goes_on() -> None:
    """Frames 0-3 taken; 0 leaves the chain; 1-3 are dropped at the give-up, and a result
    of 2 that still comes from the chain is neither published nor counted again. The
    source's frame 4 (from a new chain) is then released at once, not after the 60 s
    reorder timeout."""
    frames = [frame(order) for order in range(4)]
    held, _, results, counts, reorder = held_with(*frames)
    assert held.take(4, 0.0) == frames
    held.put(Batch(frames[:1]))
    assert results.get_nowait().frames == frames[:1]
    assert held.give_up(Reason.RELOAD_GIVEN_UP) == 3
    assert counts.snapshot().dropped == {"reload_given_up": 3}
    held.put(Batch([frames[2]]))
    assert results.empty()
    assert held.give_up(Reason.SHUTDOWN) == 0
    assert counts.snapshot().dropped == {"reload_given_up": 3}
    assert reorder.push(frames[0]) == [frames[0]]
    later = frame(4)
    assert reorder.push(later) == [later]


def test_frames_taken_after_the_give_up_are_dropped_at_once_and_markers_go_on() -> None:
    """A take under way when the chain is given up: its frames are dropped with the
    give-up's reason, its markers reach the batcher, and an end of stream still reaches
    egress."""
    eos = EndOfStream("cam", 1)
    eos.order = 2
    held, _, results, counts, reorder = held_with(frame(0), frame(1), eos, STOP)
    assert held.give_up(Reason.RELOAD_GIVEN_UP) == 0
    assert held.take(8, 0.0) == [eos]
    assert held.take(8, 0.0) == [STOP]
    assert counts.snapshot().dropped == {"reload_given_up": 2}
    held.put(eos)
    assert results.get_nowait() is eos
    assert reorder.push(eos) == [eos]  # frames 0 and 1 were reported lost

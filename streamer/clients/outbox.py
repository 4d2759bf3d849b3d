"""The messages a client handed to a ZMQ socket that libzmq still holds.

A message's last part is sent as a tracked zero-copy :class:`zmq.Frame` (the parts before it
are copied); its :class:`zmq.MessageTracker` is done once libzmq has let go of the buffer,
that is once the connection's I/O thread has written it out (or copied it into the
connection's outgoing batch), or dropped it. The parts of a message leave in order, so the
last part's tracker stands for the whole message, and pyzmq keeps the buffer alive until
then (pyzmq, "More than just bindings": non-copying sends and MessageTracker).

This is what lets a producer wait at close for its queued frames, bounded in time, and tell
how many it gave up on, where ``LINGER`` alone discards them silently.
"""

from __future__ import annotations

import collections
import time
from collections.abc import Sequence
from typing import Any

import zmq

__all__ = ["Outbox"]


class Outbox:
    """Trackers of the messages sent on one socket and still held by libzmq, oldest first.

    Not thread-safe: used by the thread that owns the socket.
    """

    def __init__(self) -> None:
        self._trackers: collections.deque[zmq.MessageTracker] = collections.deque()

    def __len__(self) -> int:
        """Messages still held by libzmq."""
        self._forget_done()
        return len(self._trackers)

    def send(
        self, socket: zmq.Socket[Any], parts: Sequence[bytes | memoryview], flags: int = 0
    ) -> None:
        """Send ``parts`` as one multipart message, the last part without a copy.

        Args:
            socket: the socket to send on (its ``SNDTIMEO`` bounds the wait for room).
            parts: one or more buffers; the last one must not be modified until libzmq has
                let go of it (:meth:`wait`).
            flags: ``zmq.NOBLOCK`` not to wait at all.

        Raises:
            zmq.Again: the socket took nothing within its ``SNDTIMEO`` (at once with
                ``NOBLOCK``).
        """
        last = zmq.Frame(parts[-1], copy=False, track=True)
        tracker = socket.send_multipart([*parts[:-1], last], flags)
        assert tracker is not None, "sending a tracked Frame returns its tracker"
        self._trackers.append(tracker)
        self._forget_done()

    def wait(self, deadline_s: float) -> int:
        """Wait until libzmq has let go of every message, or until ``deadline_s``.

        Args:
            deadline_s: a ``time.monotonic()`` instant (s).

        Returns:
            The messages still held at the deadline; 0 when every one left.
        """
        while self._trackers:
            try:
                self._trackers[0].wait(max(deadline_s - time.monotonic(), 0.0))
            except zmq.NotDone:
                return len(self)
            self._trackers.popleft()
        return 0

    def _forget_done(self) -> None:
        while self._trackers and self._trackers[0].done:
            self._trackers.popleft()

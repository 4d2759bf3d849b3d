"""A subscriber thread that keeps every result a daemon publishes, with its arrival time.

It does no parsing while results arrive (the benchmark shares the CPU with the daemon): it
stores ``(wall time, topic, body)`` and counts results per topic; :meth:`ResultCapture.take`
hands a run's results over for parsing after the run.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Iterable
from typing import Any

import zmq

from streamer.errors import StreamerError

__all__ = ["ResultCapture"]

_POLL_MS = 100
_START_TIMEOUT_S = 10.0


class ResultCapture(threading.Thread):
    """The SUB socket (created and used in this thread only) and what it received.

    Args:
        endpoint: the daemon's PUB egress, e.g. ``tcp://127.0.0.1:5556``.

    Raises:
        StreamerError: the socket could not be set up (from :meth:`launch`).
    """

    def __init__(self, endpoint: str) -> None:
        super().__init__(name="bench-capture", daemon=True)
        self._endpoint = endpoint
        self._ready = threading.Event()
        self._stopping = threading.Event()
        self._received: list[tuple[float, bytes, bytes]] = []
        self._counts: Counter[bytes] = Counter()
        self._error: BaseException | None = None

    def launch(self) -> None:
        """Start the thread and return once its socket is connected."""
        self.start()
        if not self._ready.wait(_START_TIMEOUT_S) or self._error is not None:
            raise StreamerError(f"result subscriber failed: {self._error}")

    def run(self) -> None:
        context: zmq.Context[Any] = zmq.Context()
        socket = context.socket(zmq.SUB)
        try:
            socket.setsockopt(zmq.LINGER, 0)
            socket.setsockopt(zmq.RCVHWM, 0)  # never drop on this side
            socket.setsockopt(zmq.SUBSCRIBE, b"")
            socket.connect(self._endpoint)
            self._ready.set()
            self._receive(socket)
        except zmq.ZMQError as exc:
            self._error = exc
        finally:
            self._ready.set()
            socket.close()
            context.term()

    def _receive(self, socket: zmq.Socket[Any]) -> None:
        while not self._stopping.is_set():
            if not socket.poll(_POLL_MS):
                continue
            topic, body = socket.recv_multipart()[:2]
            self._received.append((time.time(), topic, body))
            self._counts[topic] += 1

    def count(self, topics: Iterable[str]) -> int:
        """Results received so far on ``topics`` (any thread)."""
        return sum(self._counts[topic.encode()] for topic in topics)

    def take(self, topics: Iterable[str]) -> list[tuple[float, bytes]]:
        """``(arrival wall time, JSON body)`` of every result on ``topics``, in arrival order."""
        wanted = {topic.encode() for topic in topics}
        return [(at, body) for at, topic, body in list(self._received) if topic in wanted]

    def stop(self) -> None:
        """End the thread and close its socket."""
        self._stopping.set()
        self.join(_START_TIMEOUT_S)

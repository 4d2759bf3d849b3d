"""The ingress thread on real sockets: socket types, replies, topics, limits, imagezmq.

The pipeline downstream is replaced by a recorder of what the ingress hands on; the daemon
as a whole is tested in tests/e2e.
"""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import cv2
import imagezmq
import numpy as np
import pytest
import zmq

from streamer.config import FullPolicy, IngressConfig
from streamer.errors import ConfigError, Reason
from streamer.frames import EndOfStream, Frame, OutcomeCounts
from streamer.transport.ingress import Ingress, widest_limits
from streamer.transport.protocol import encode_eos, encode_frame

_TIMEOUT_MS = 5000


class Recorder:
    """Stands in for the admission queue: keeps every item in order."""

    def __init__(self) -> None:
        self.items: list[Frame | EndOfStream] = []
        self._arrived = threading.Condition()

    def offer(self, item: Frame | EndOfStream, policy: FullPolicy) -> None:
        with self._arrived:
            self.items.append(item)
            self._arrived.notify_all()

    def wait(self, count: int) -> list[Frame | EndOfStream]:
        """The items, once there are at least ``count``."""
        return self.wait_until(lambda items: len(items) >= count)

    def wait_until(
        self, done: Callable[[list[Frame | EndOfStream]], bool]
    ) -> list[Frame | EndOfStream]:
        """The items, once ``done(items)`` holds (5 s at most)."""
        with self._arrived:
            assert self._arrived.wait_for(lambda: done(self.items), 5.0), self.items
            return list(self.items)


class Running:
    """One started ingress with its recorder and counts."""

    def __init__(self, ingress: Ingress, recorder: Recorder, counts: OutcomeCounts) -> None:
        self.ingress, self.recorder, self.counts = ingress, recorder, counts


@pytest.fixture
def context() -> Iterator[zmq.Context[Any]]:
    ctx: zmq.Context[Any] = zmq.Context()
    yield ctx
    ctx.term()


@pytest.fixture
def start(context: zmq.Context[Any]) -> Iterator[Callable[..., Running]]:
    started: list[Ingress] = []

    def run(**settings: Any) -> Running:
        recorder, counts = Recorder(), OutcomeCounts()
        ingress = Ingress(IngressConfig(**settings), context, recorder, counts, threading.Event())
        ingress.launch(5.0)
        started.append(ingress)
        return Running(ingress, recorder, counts)

    yield run
    for ingress in started:
        ingress.request_stop()
        ingress.join(5.0)
        assert ingress.failure is None, ingress.failure


@pytest.fixture
def client(context: zmq.Context[Any]) -> Iterator[Callable[[int, str], zmq.Socket[Any]]]:
    sockets: list[zmq.Socket[Any]] = []

    def make(kind: int, address: str) -> zmq.Socket[Any]:
        socket = context.socket(kind)
        socket.setsockopt(zmq.LINGER, 0)
        socket.setsockopt(zmq.RCVTIMEO, _TIMEOUT_MS)
        socket.setsockopt(zmq.SNDTIMEO, _TIMEOUT_MS)
        socket.connect(address)
        sockets.append(socket)
        return socket

    yield make
    for made in sockets:
        made.close()


def _jpeg(size: tuple[int, int] = (64, 48)) -> bytes:
    return cv2.imencode(".jpg", np.full((size[1], size[0], 3), 128, np.uint8))[1].tobytes()


def _address() -> str:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return f"tcp://127.0.0.1:{probe.getsockname()[1]}"


def test_rep_replies_once_per_request(start: Any, client: Any) -> None:
    address = _address()
    running = start(uri=f"rep+bind:{address}")
    req = client(zmq.REQ, address)
    req.send_multipart(encode_frame("cam", 0, _jpeg(), encoding="jpeg"))
    assert json.loads(req.recv()) == {"ok": True, "source": "cam", "seq": 0}
    req.send_multipart([b"{not json", b"x"])
    bad = json.loads(req.recv())
    assert bad["ok"] is False and bad["reason"] == Reason.BAD_HEADER
    req.send_multipart(encode_eos("cam", 0))
    assert json.loads(req.recv())["eos"] is True
    items = running.recorder.wait(3)
    assert [type(i).__name__ for i in items] == ["Frame", "Frame", "EndOfStream"]
    assert running.counts.snapshot().received == 2  # the end-of-stream is not a frame


def test_router_replies_through_the_envelope(start: Any, client: Any) -> None:
    address = _address()
    running = start(uri=f"router+bind:{address}")
    req = client(zmq.REQ, address)  # sends the empty delimiter part
    dealer = client(zmq.DEALER, address)  # sends none
    req.send_multipart(encode_frame("a", 0, _jpeg(), encoding="jpeg"))
    assert json.loads(req.recv())["source"] == "a"
    dealer.send_multipart(encode_frame("b", 0, _jpeg(), encoding="jpeg"))
    assert json.loads(dealer.recv())["source"] == "b"
    dealer.send_multipart([b"x", b"y", b"z"])
    assert json.loads(dealer.recv())["reason"] == Reason.BAD_HEADER
    assert [i.source for i in running.recorder.wait(3)] == ["a", "b", ""]


def test_router_replies_through_a_broker(start: Any, client: Any, context: Any) -> None:
    """A REQ peer behind a ROUTER/DEALER broker: the request came as [broker, client, "",
    header, payload] and was read as a 4-part message from the broker (bad_header), its
    reply routed to no one, the REQ peer waiting for ever."""
    address, front_address = _address(), _address()
    running = start(uri=f"router+bind:{address}")
    front = context.socket(zmq.ROUTER)
    front.setsockopt(zmq.LINGER, 0)
    front.setsockopt(zmq.RCVTIMEO, _TIMEOUT_MS)
    try:
        front.bind(front_address)
        back = client(zmq.DEALER, address)
        req = client(zmq.REQ, front_address)
        for seq in range(2):  # what zmq.proxy(front, back) does, one message each way
            req.send_multipart(encode_frame("behind", seq, _jpeg(), encoding="jpeg"))
            back.send_multipart(front.recv_multipart())
            front.send_multipart(back.recv_multipart())
            assert json.loads(req.recv()) == {"ok": True, "source": "behind", "seq": seq}
    finally:
        front.close()
    assert [(i.source, i.error) for i in running.recorder.wait(2)] == [("behind", None)] * 2


def test_a_refused_frame_fails_at_once_and_says_why(start: Any, client: Any) -> None:
    address = _address()
    running = start(uri=f"rep+bind:{address}", max_width_px=32)
    req = client(zmq.REQ, address)
    req.send_multipart(encode_frame("cam", 0, _jpeg(), encoding="jpeg"))
    ack = json.loads(req.recv())
    assert ack["ok"] is False and ack["reason"] == Reason.TOO_LARGE and "64x48" in ack["detail"]
    (frame,) = running.recorder.wait(1)
    assert isinstance(frame, Frame) and frame.error is not None and frame.payload is None


def test_sub_topics_match_exactly(start: Any, context: Any) -> None:
    address = _address()
    running = start(uri=f"sub+connect:{address}", topics=["cam1"])
    pub = context.socket(zmq.PUB)
    pub.setsockopt(zmq.LINGER, 0)
    pub.bind(address)
    try:
        for _ in range(100):  # until the subscription has reached the publisher
            pub.send_multipart([b"cam1", *encode_frame("cam1", 0, b"x", encoding="jpeg")])
            if running.recorder.items:
                break
            time.sleep(0.05)
        pub.send_multipart([b"cam10", *encode_frame("cam10", 0, b"x", encoding="jpeg")])
        pub.send_multipart([b"cam1", *encode_frame("cam1", 1, b"x", encoding="jpeg")])
        # cam10 went first on the same pipe: had it been taken, it would be there by now.
        items = running.recorder.wait_until(lambda items: any(i.seq == 1 for i in items))
    finally:
        pub.close()
    assert {i.source for i in items} == {"cam1"}
    assert running.counts.snapshot().received == len(items)


def test_one_socket_binds_ipc_and_connects_tcp(
    start: Any, client: Any, context: Any, tmp_path: Path
) -> None:
    ipc, tcp = f"ipc://{tmp_path}/frames.ipc", _address()
    pusher = context.socket(zmq.PUSH)
    pusher.setsockopt(zmq.LINGER, 0)
    pusher.bind(tcp)  # the ingress connects to this producer
    try:
        running = start(uri=[f"pull+bind:{ipc}", f"pull+connect:{tcp}"])
        client(zmq.PUSH, ipc).send_multipart(encode_frame("over-ipc", 0, b"x", encoding="jpeg"))
        pusher.send_multipart(encode_frame("over-tcp", 0, b"x", encoding="jpeg"))
        assert {i.source for i in running.recorder.wait(2)} == {"over-ipc", "over-tcp"}
    finally:
        pusher.close()


def test_imagezmq_sender_gets_ok_or_an_error(start: Any) -> None:
    address = _address()
    running = start(uri=f"rep+bind:{address}", protocol="imagezmq", max_pixels=10_000)
    sender = imagezmq.ImageSender(connect_to=address)
    sender.zmq_socket.setsockopt(zmq.RCVTIMEO, _TIMEOUT_MS)
    try:
        assert sender.send_image("cam", np.zeros((48, 64, 3), np.uint8)) == b"OK"
        assert sender.send_jpg("cam", _jpeg()) == b"OK"
        reply = sender.send_image("cam", np.zeros((200, 200, 3), np.uint8))
        assert reply.startswith(b"ERROR too_large: image is 200x200")
    finally:
        sender.zmq_socket.setsockopt(zmq.LINGER, 0)
        sender.close()
    items = running.recorder.wait(3)
    assert [(i.source, i.seq) for i in items] == [("cam", 0), ("cam", 1), ("cam", 2)]


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"uri": "pub+bind:tcp://127.0.0.1:1"}, "not allowed"),
        ({"uri": ["sub+bind:tcp://127.0.0.1:1", "pull+bind:tcp://127.0.0.1:2"]}, "mix"),
    ],
)
def test_bad_settings_name_the_ingress(
    context: Any, settings: dict[str, Any], message: str
) -> None:
    config = IngressConfig(name="cams", **settings)
    with pytest.raises(ConfigError, match=f"ingress cams: .*{message}"):
        Ingress(config, context, Recorder(), OutcomeCounts(), threading.Event())


def test_widest_limits_backstop_every_ingress() -> None:
    configs = (
        IngressConfig(uri="pull+bind:tcp://127.0.0.1:1", max_width_px=100, max_pixels=50),
        IngressConfig(uri="pull+bind:tcp://127.0.0.1:2", max_height_px=100),
    )
    limits = widest_limits(configs)
    assert (limits.max_width, limits.max_height, limits.max_pixels) == (8192, 8192, 40_000_000)

"""Egress on real sockets: a PUSH socket nobody reads does not hold up the others, and
nothing is sent or counted once the pipeline has given up draining."""

from __future__ import annotations

import json
import queue
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
import zmq
from structlog.testing import capture_logs

from streamer.bench.bench_config import free_port
from streamer.config import EgressConfig
from streamer.frames import STOP, Batch, Frame, OutcomeCounts
from streamer.observability.metrics import PipelineMetrics
from streamer.scheduling.reorder import ReorderBuffer
from streamer.transport.egress import Egress

_FRAMES = 20
DROPPED = "streamer_egress_dropped_results_total"


def frames(count: int, source: str = "cam", first: int = 0) -> list[Frame]:
    made = []
    for seq in range(first, first + count):
        frame = Frame(source, seq, time.monotonic_ns(), time.time())
        frame.order = seq
        made.append(frame)
    return made


@pytest.fixture
def context() -> Iterator[zmq.Context[Any]]:
    context: zmq.Context[Any] = zmq.Context()
    yield context
    context.term()


def make_egress(
    context: zmq.Context[Any], uris: list[str]
) -> tuple[Egress, queue.SimpleQueue[Any], OutcomeCounts, threading.Event]:
    configs = tuple(EgressConfig(name=f"out{i}", uri=uri) for i, uri in enumerate(uris))
    inbox: queue.SimpleQueue[Any] = queue.SimpleQueue()
    counts, abort = OutcomeCounts(), threading.Event()
    reorder = ReorderBuffer(window=64, timeout_s=1.0, idle_evict_s=60.0)
    return Egress(configs, context, inbox, reorder, counts, abort), inbox, counts, abort


def subscribe(
    context: zmq.Context[Any], pub: int, inbox: queue.SimpleQueue[Any]
) -> tuple[zmq.Socket[Any], int]:
    """A SUB connected to the egress's PUB on port ``pub``, once its subscription is live,
    and the number of ``probe`` results sent to find that out (ZeroMQ's slow joiner: a fixed
    sleep lost the first results on a loaded machine).

    Probes go out one at a time until one arrives; the last one sent went out after that
    one, so it arrives too, and nothing of the probes is left to come after it."""
    subscriber = context.socket(zmq.SUB)
    subscriber.setsockopt(zmq.SUBSCRIBE, b"")
    subscriber.connect(f"tcp://127.0.0.1:{pub}")
    seq = -1
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        seq += 1
        inbox.put(Batch(frames(1, source="probe", first=seq)))
        if subscriber.poll(100):
            while json.loads(subscriber.recv_multipart()[1])["seq"] != seq:
                assert subscriber.poll(10_000), "the last probe's result never came"
            return subscriber, seq + 1
    raise AssertionError("the subscription never reached the PUB")


def receive(subscriber: zmq.Socket[Any], count: int, within_s: float) -> list[int]:
    """The seqs of the results that arrive within ``within_s`` seconds, at most ``count``."""
    seqs: list[int] = []
    deadline = time.monotonic() + within_s
    while len(seqs) < count and (left := deadline - time.monotonic()) > 0:
        if subscriber.poll(round(left * 1000)):
            seqs.append(json.loads(subscriber.recv_multipart()[1])["seq"])
    return seqs


def test_a_push_socket_nobody_reads_holds_up_no_result_of_the_pub(
    context: zmq.Context[Any],
) -> None:
    pub, push = free_port(), free_port()
    egress, inbox, counts, _ = make_egress(
        context, [f"pub+bind:tcp://127.0.0.1:{pub}", f"push+bind:tcp://127.0.0.1:{push}"]
    )
    egress.launch(10)
    with capture_logs() as logs:
        subscriber, probes = subscribe(context, pub, inbox)
        inbox.put(Batch(frames(_FRAMES)))
        seqs = receive(subscriber, _FRAMES, within_s=10.0)
        inbox.put(STOP)
        egress.join(10)
    subscriber.close(linger=0)
    assert not egress.is_alive()
    assert seqs == list(range(_FRAMES))
    assert counts.snapshot().published == probes + _FRAMES
    stalled = [e for e in logs if e["event"] == "egress_stalled"]
    assert len(stalled) == 1 and stalled[0]["egress"] == "out1" and stalled[0]["dropped"] == 1


def test_a_slow_push_reader_beside_a_pub_slows_only_itself(context: zmq.Context[Any]) -> None:
    """A PUSH reader taking a result every 20 ms made every send wait for it (1 s at most
    each), holding the PUB's subscribers up as much."""
    pub, push = free_port(), free_port()
    configs = (
        EgressConfig(name="pub", uri=f"pub+bind:tcp://127.0.0.1:{pub}"),
        EgressConfig(name="push", uri=f"push+bind:tcp://127.0.0.1:{push}", hwm=2),
    )
    inbox: queue.SimpleQueue[Any] = queue.SimpleQueue()
    counts = OutcomeCounts()
    reorder = ReorderBuffer(window=64, timeout_s=1.0, idle_evict_s=60.0)
    metrics = PipelineMetrics()
    egress = Egress(configs, context, inbox, reorder, counts, threading.Event(), metrics=metrics)
    for config in configs:  # every egress's series from 0, before any drop
        labels = {"egress": config.name}
        assert metrics.registry.get_sample_value(DROPPED, labels) == 0
    egress.launch(10)
    reader = context.socket(zmq.PULL)
    reader.setsockopt(zmq.RCVHWM, 1)
    reader.connect(f"tcp://127.0.0.1:{push}")
    subscriber, probes = subscribe(context, pub, inbox)
    while reader.poll(200):  # the probes' results the PUSH took (it did not wait for it)
        reader.recv_multipart()
    dropped_before = metrics.registry.get_sample_value(DROPPED, {"egress": "push"}) or 0
    read = 0
    done = threading.Event()

    def read_slowly() -> None:
        nonlocal read
        while not done.is_set():
            if reader.poll(20):
                reader.recv_multipart()
                read += 1
            time.sleep(0.02)

    slow = threading.Thread(target=read_slowly)
    slow.start()
    batch = frames(200)
    for frame in batch:  # big enough that the kernel's socket buffers hold only a few
        frame.meta = {"padding": "x" * 100_000}
    inbox.put(Batch(batch))
    seqs = receive(subscriber, 200, within_s=30.0)
    read_when_pub_done = read
    done.set()
    slow.join()
    inbox.put(STOP)
    egress.join(10)
    subscriber.close(linger=0)
    reader.close(linger=0)
    assert seqs == list(range(200))
    # Had the PUB waited for the PUSH reader, that would have read nearly all 200 by then
    # and nothing would have been dropped on it; how many it read depends on the machine's
    # speed, so only a bound far from both.
    assert read_when_pub_done < 100
    # Every result counts as published (the PUB took it); those the PUSH dropped are counted.
    assert counts.snapshot().published == probes + 200
    dropped = metrics.registry.get_sample_value(DROPPED, {"egress": "push"})
    assert dropped is not None and 0 < dropped - dropped_before < 200
    assert metrics.registry.get_sample_value(DROPPED, {"egress": "pub"}) == 0


def test_nothing_is_sent_or_counted_after_an_abort(context: zmq.Context[Any]) -> None:
    pub = free_port()
    egress, inbox, counts, abort = make_egress(context, [f"pub+bind:tcp://127.0.0.1:{pub}"])
    egress.setup()
    try:
        abort.set()
        egress._emit(list(frames(3)))
    finally:
        egress.teardown()
    assert counts.snapshot().published == 0


def test_a_result_that_cannot_be_encoded_fails_alone(context: zmq.Context[Any]) -> None:
    """A result JSON cannot express (e.g. a plug-in postprocessor's object) becomes an error
    result; egress, and the results after it, go on."""
    pub = free_port()
    egress, inbox, counts, _ = make_egress(context, [f"pub+bind:tcp://127.0.0.1:{pub}"])
    egress.launch(10)
    subscriber, probes = subscribe(context, pub, inbox)
    batch = frames(3)
    batch[1].results = {"detections": object()}
    inbox.put(Batch(batch))
    results = []
    while len(results) < 3 and subscriber.poll(10_000):
        results.append(json.loads(subscriber.recv_multipart()[1]))
    inbox.put(STOP)
    egress.join(10)
    subscriber.close(linger=0)
    assert [r["seq"] for r in results] == [0, 1, 2]
    assert results[1]["error"]["reason"] == "postprocess_failed"
    assert "detections" not in results[1] and results[0]["error"] is None
    snapshot = counts.snapshot()
    assert snapshot.published == probes + 2 and snapshot.failed == {"postprocess_failed": 1}

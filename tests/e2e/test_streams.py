"""Backpressure policies, per-source order across producer restarts, and hot reload."""

from __future__ import annotations

import json
import signal
import threading
from pathlib import Path
from typing import Any
from urllib.request import urlopen

import cv2
import numpy as np
import pytest
import zmq
from prometheus_client.parser import text_string_to_metric_families

from streamer.transport.protocol import encode_eos, encode_frame

from .conftest import Client, Daemon, shipped


@pytest.fixture(scope="module")
def camera_jpegs(assets: dict[str, Path]) -> list[bytes]:
    """bigbuckbunny's 1280x720 frames as JPEG: slow to decode, so the pipeline is the
    bottleneck for a producer that only sends bytes."""
    capture = cv2.VideoCapture(str(assets["bigbuckbunny.mp4"]))
    jpegs = []
    while len(jpegs) < 40:
        ok, image = capture.read()
        if not ok:
            break
        jpegs.append(cv2.imencode(".jpg", image)[1].tobytes())
    capture.release()
    return jpegs


def peak_rss_mb(daemon: Daemon) -> float:
    status = Path(f"/proc/{daemon.process.pid}/status").read_text()
    line = next(line for line in status.splitlines() if line.startswith("VmHWM:"))
    return int(line.split()[1]) / 1024


def flood(client: Client, source: str, jpegs: list[bytes], count: int) -> None:
    for seq in range(count):
        client.send_parts(encode_frame(source, seq, jpegs[seq % len(jpegs)], encoding="jpeg"))
    client.send_parts(encode_eos(source, count - 1))


def results_until_eos(client: Client, source: str, timeout_s: float = 120) -> list[dict[str, Any]]:
    results: list[dict[str, Any]] = []
    while True:
        batch = client.collect(1, timeout_s)
        assert batch, f"no eos for {source} after {len(results)} results"
        if batch[0]["source"] != source:
            continue
        if batch[0].get("eos"):
            return results
        results.append(batch[0])


def test_latest_keeps_results_fresh_and_memory_bounded(
    start_daemon: Any, connect: Any, camera_jpegs: list[bytes]
) -> None:
    daemon = start_daemon(ingress_extra='on_full = "latest"\nhwm = 1000')
    client: Client = connect(daemon)
    flood(client, "cam", camera_jpegs, 1500)
    results = results_until_eos(client, "cam")
    seqs = [r["seq"] for r in results]
    assert seqs == sorted(seqs) and len(set(seqs)) == len(seqs)
    assert len(results) < 1500 / 3  # most frames were superseded by newer ones
    assert seqs[-1] == 1499  # the newest frame is never the one dropped
    assert peak_rss_mb(daemon) < 800
    assert daemon.stop() == 0
    final = daemon.final_counts()
    assert final["dropped_by_reason"].get("superseded", 0) >= 1000
    assert final["received"] == final["published"] + final["dropped"]


def test_drop_oldest_under_overload_keeps_each_source_in_order(
    tmp_path: Path, connect: Any, carphone_frames: list[np.ndarray]
) -> None:
    """Raw frames as fast as a producer sends them, to two replicas that finish batches out
    of order: the frames dropped behind those still running do not fill egress's reorder
    window, so it never gives up on a running frame (which was then published late, out of
    order: hundreds of times in such a run)."""

    def drop_oldest(text: str) -> str:
        return text.replace('on_full = "block"', 'on_full = "drop_oldest"')

    daemon = shipped("default.toml", tmp_path, drop_oldest)
    client: Client = connect(daemon)
    count = 3000
    for seq in range(count):
        client.send_parts(encode_frame("cam", seq, carphone_frames[seq % 120], encoding="raw"))
    client.send_parts(encode_eos("cam", count - 1))
    seqs = [r["seq"] for r in results_until_eos(client, "cam")]
    assert seqs == sorted(seqs) and len(set(seqs)) == len(seqs) and seqs[-1] == count - 1
    assert daemon.stop() == 0
    final = daemon.final_counts()
    assert final["reorder_gave_up"] == 0 and final["reorder_late"] == 0
    assert final["received"] == final["published"] + final["dropped"]


def test_frames_refused_on_arrival_are_published_under_drop_oldest_overload(
    tmp_path: Path, connect: Any, carphone_frames: list[np.ndarray]
) -> None:
    """Frames refused on arrival (a header with no encoding: bad_header, named by its
    source and seq) among a flood to a drop_oldest ingress get their error results, as the
    README says of every refused frame: a full queue makes room with frames waiting for a
    decode, never with them (it dropped every one of them as queue_full)."""

    def drop_oldest(text: str) -> str:
        return text.replace('on_full = "block"', 'on_full = "drop_oldest"')

    daemon = shipped("default.toml", tmp_path, drop_oldest)
    client: Client = connect(daemon)
    count, refused = 3000, 0
    for seq in range(count):
        client.send_parts(encode_frame("cam", seq, carphone_frames[seq % 120], encoding="raw"))
        if seq % 30 == 29:
            header = json.dumps({"v": 1, "source": "bad", "seq": refused}).encode()
            client.send_parts([header, b"pixels"])
            refused += 1
    client.send_parts(encode_eos("cam", count - 1))
    errors = []
    while True:
        batch = client.collect(1, 120)
        assert batch, f"no eos for cam after {len(errors)} error results"
        if batch[0]["source"] == "bad":
            errors.append((batch[0]["seq"], batch[0]["error"]["reason"]))
        elif batch[0].get("eos"):
            break
    assert errors == [(seq, "bad_header") for seq in range(refused)]
    assert daemon.stop() == 0
    final = daemon.final_counts()
    assert final["failed_by_reason"] == {"bad_header": refused}
    assert final["dropped_by_reason"].get("queue_full", 0) > 0  # the queue was full
    assert final["received"] == final["published"] + final["failed"] + final["dropped"]


def test_clips_on_one_source_keep_their_order_across_ends_of_stream(
    tmp_path: Path, connect: Any, carphone_frames: list[np.ndarray]
) -> None:
    """A producer sending clip after clip on one source id, each closed by an end of
    stream and numbered from 0, as fast as it can, to two replicas that finish batches out
    of order: each clip's results and its eos come before the next clip's."""
    daemon = shipped("default.toml", tmp_path)
    client: Client = connect(daemon)
    clips, length = 6, 60
    for clip in range(clips):
        for seq in range(length):
            image = carphone_frames[(clip * length + seq) % 120]
            client.send_parts(encode_frame("cam", seq, image, encoding="raw"))
        client.send_parts(encode_eos("cam", length - 1))
    got = []
    while len(got) < clips * (length + 1):
        batch = client.collect(1, 120)
        assert batch, f"{len(got)} results"
        got.append("eos" if batch[0].get("eos") else batch[0]["seq"])
    assert got == [*range(length), "eos"] * clips
    assert daemon.stop() == 0
    final = daemon.final_counts()
    assert final["source_restarts"] == final["seq_gaps"] == final["reorder_late"] == 0


def test_a_source_idle_while_its_frames_wait_in_a_batch_keeps_its_order(
    tmp_path: Path, connect: Any, carphone_frames: list[np.ndarray]
) -> None:
    """``source_idle_s`` shorter than a batch's deadline: the source, silent while its three
    frames wait for the batch to fill, is not forgotten under them, so its end of stream comes
    after their results (it came first), and nothing is counted given up or late."""

    def slow_batches(text: str) -> str:
        text = text.replace("source_idle_s = 60.0", "source_idle_s = 0.3")
        return text.replace("max_delay_ms = 5.0", "max_delay_ms = 1500.0")

    daemon = shipped("default.toml", tmp_path, slow_batches)
    client: Client = connect(daemon)
    for seq in range(3):
        client.send_parts(encode_frame("cam", seq, carphone_frames[seq], encoding="raw"))
    # A source whose one frame fails at once, sent after cam's: once it is forgotten, cam
    # has been idle for longer than source_idle_s too.
    client.send_parts(encode_frame("tick", 0, b"not a jpeg", encoding="jpeg"))
    while daemon.wait_event("source_evicted", 10)["source"] != "tick":
        pass
    client.send_parts(encode_eos("cam", 2))
    got = [
        "eos" if r.get("eos") else r["seq"] for r in client.collect(5, 60) if r["source"] == "cam"
    ]
    assert got == [0, 1, 2, "eos"]
    assert daemon.stop() == 0
    final = daemon.final_counts()
    assert final["reorder_gave_up"] == final["reorder_late"] == 0


def test_block_drops_nothing_and_slows_the_producer(
    start_daemon: Any, connect: Any, camera_jpegs: list[bytes]
) -> None:
    daemon = start_daemon(
        daemon_extra="queue_size = 8", ingress_extra='on_full = "block"\nhwm = 10'
    )
    client: Client = connect(daemon)
    client.push.setsockopt(zmq.SNDHWM, 10)
    count, seen = 300, []
    sender = threading.Thread(target=flood, args=(client, "cam", camera_jpegs, count))
    sender.start()
    while sender.is_alive():
        seen += client.collect(1, 0.05)
    done_when_sent = len(seen)
    results = seen + results_until_eos(client, "cam")
    frames = [r for r in results if r["source"] == "cam" and not r.get("eos")]
    assert [r["seq"] for r in frames] == list(range(count))
    # The producer could only finish once most frames had been processed: it was held back.
    assert done_when_sent >= count - 150, done_when_sent
    assert daemon.stop() == 0
    final = daemon.final_counts()
    assert final["dropped"] == 0 and final["published"] == final["received"]


def test_restarting_producers_resume_in_order_with_gaps_reported(
    start_daemon: Any, connect: Any, astronaut: np.ndarray
) -> None:
    daemon = start_daemon()
    client: Client = connect(daemon)
    jpeg = cv2.imencode(".jpg", cv2.resize(astronaut, (160, 160)))[1].tobytes()
    runs = [
        {"a": [*range(0, 30)], "b": [*range(0, 20)]},
        {"a": [*range(0, 10), *range(15, 30)], "b": [*range(0, 20)]},  # a lost 10..14
    ]
    results = []
    for run in runs:
        # Each run is a new producer process per source: a new socket, seq from 0 again,
        # the two sources interleaved.
        with zmq.Context() as context:
            pushes = {source: context.socket(zmq.PUSH) for source in run}
            for push in pushes.values():
                push.connect(daemon.ingress)
            for step in range(max(len(seqs) for seqs in run.values())):
                for source, seqs in run.items():
                    if step < len(seqs):
                        parts = encode_frame(source, seqs[step], jpeg, encoding="jpeg")
                        pushes[source].send_multipart(parts)
            for push in pushes.values():
                push.close()
        results += client.collect(sum(len(seqs) for seqs in run.values()))
    by_source = {s: [r["seq"] for r in results if r["source"] == s] for s in ("a", "b")}
    assert by_source["a"] == runs[0]["a"] + runs[1]["a"]
    assert by_source["b"] == runs[0]["b"] + runs[1]["b"]
    assert daemon.stop() == 0
    final = daemon.final_counts()
    assert final["source_restarts"] == 2 and final["seq_gaps"] == 5


def test_a_restarted_producer_loses_no_frame_among_its_old_backlog(
    start_daemon: Any, connect: Any, camera_jpegs: list[bytes]
) -> None:
    """A producer restarted (a new process, a new connection) while the daemon, pushing
    back, still has its old connection's frames to read: ZeroMQ hands both connections'
    frames over in turns. With ``run`` in the header, each run's ``seq`` is checked on its
    own: every frame of both is published (without it, one count for both dropped frames
    as ``stale_seq``), each run's results in its ``seq`` order, one restart counted."""
    daemon = start_daemon(daemon_extra="queue_size = 8", ingress_extra="hwm = 10")
    client: Client = connect(daemon)
    context = zmq.Context()
    old, new = context.socket(zmq.PUSH), context.socket(zmq.PUSH)
    try:
        for push in (old, new):
            push.setsockopt(zmq.SNDHWM, 1000)
            push.connect(daemon.ingress)
        for seq in range(1000, 1120):
            jpeg = camera_jpegs[seq % len(camera_jpegs)]
            old.send_multipart(encode_frame("cam", seq, jpeg, encoding="jpeg", run="old"))
        for seq in range(60):
            jpeg = camera_jpegs[seq % len(camera_jpegs)]
            new.send_multipart(encode_frame("cam", seq, jpeg, encoding="jpeg", run="new"))
        results = client.collect(180, timeout_s=60)
    finally:
        old.close(linger=0)
        new.close(linger=0)
        context.term()
    runs = [r["run"] for r in results]
    assert runs.index("new") < len(runs) - 1 - runs[::-1].index("old"), "never interleaved"
    for run, seqs in (("old", range(1000, 1120)), ("new", range(60))):
        assert [r["seq"] for r in results if r["run"] == run] == list(seqs)
    assert daemon.stop() == 0
    final = daemon.final_counts()
    assert final["dropped"] == 0 and final["stale_frames"] == 0
    assert final["source_restarts"] == 1


def test_sighup_swaps_the_model_without_losing_a_frame(
    start_daemon: Any, connect: Any, astronaut: np.ndarray
) -> None:
    daemon = start_daemon(max_size=4)
    client: Client = connect(daemon)
    jpeg = cv2.imencode(".jpg", astronaut)[1].tobytes()
    text = daemon.config_path.read_text()
    daemon.config_path.write_text(
        text.replace('name = "face"', 'name = "face_full"').replace(
            "blazeface_short_range", "blazeface_full_range"
        )
    )
    for seq in range(200):
        client.send_parts(encode_frame("cam", seq, jpeg, encoding="jpeg"))
        if seq == 50:
            before = client.collect(51)
            flushed_before = _flushes(daemon)
            daemon.process.send_signal(signal.SIGHUP)
            daemon.wait_event("reloaded", 60)
    results = before + client.collect(149)
    assert [r["seq"] for r in results] == list(range(200))
    models = [r["model"] for r in results]
    switch = models.index("face_full")
    assert set(models[:switch]) == {"face"} and set(models[switch:]) == {"face_full"}
    assert all(r["error"] is None and len(r["detections"]) == 1 for r in results)
    # The old chain's flushes stay counted: the counter goes on, it does not start again.
    assert _flushes(daemon) >= flushed_before + 149 / 4
    assert daemon.stop() == 0
    final = daemon.final_counts()
    assert final["published"] == final["received"]


def test_sighup_with_a_broken_config_keeps_the_running_one(
    start_daemon: Any, connect: Any, astronaut: np.ndarray
) -> None:
    daemon = start_daemon()
    client: Client = connect(daemon)
    text = daemon.config_path.read_text()
    daemon.config_path.write_text(text.replace('kind = "blazeface"', 'kind = "nope"'))
    daemon.process.send_signal(signal.SIGHUP)
    daemon.wait_event("reload_rejected", 60)
    # Options a reload cannot apply are still checked: the next start would refuse them.
    bad_options = text.replace('name = "face"', 'name = "face2"').replace(
        "[runtime]", '[runtime.options]\nintra_op_threads = "2"\n[runtime]'
    )
    daemon.config_path.write_text(bad_options)
    daemon.process.send_signal(signal.SIGHUP)
    rejected = daemon.wait_event("reload_rejected", 60)
    assert "runtime.options.intra_op_threads: Input should be a valid integer" in rejected["error"]
    jpeg = cv2.imencode(".jpg", astronaut)[1].tobytes()
    client.send_parts(encode_frame("cam", 0, jpeg, encoding="jpeg"))
    (result,) = client.collect(1)
    assert result["model"] == "face" and len(result["detections"]) == 1
    assert daemon.stop() == 0


def _flushes(daemon: Daemon) -> float:
    """``streamer_batch_flushes_total`` summed over its reasons, from /metrics."""
    with urlopen(daemon.http + "/metrics", timeout=10) as response:
        families = text_string_to_metric_families(response.read().decode())
    return sum(
        s.value for f in families for s in f.samples if s.name == "streamer_batch_flushes_total"
    )

"""BlazeFace split into backbone → head (the tensor adapter) publishes what the single model
publishes, on onnxruntime and on the ACL simulator in each execution mode."""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any
from urllib.request import urlopen

import cv2
import numpy as np
import pytest
from prometheus_client.parser import text_string_to_metric_families

from streamer.clients.producer import produce
from streamer.transport.protocol import encode_frame

from .conftest import Client, Daemon, metric_by_label, shipped, sim_settings

SPLIT = "blazeface_split.toml"
ONNX_RUNTIME = 'backend = "onnxruntime"\n\n[runtime.options]\nintra_op_threads = 1\n'


def run_frames(daemon: Daemon, stills: dict[str, np.ndarray]) -> dict[tuple[str, int], Any]:
    """Carphone's 120 frames (raw), the stills (PNG) and a PNG that does not decode; results
    by (source, seq)."""
    client = Client(daemon, stills["astronaut"])
    try:
        produce("carphone.mp4", daemon.ingress, source="carphone", encoding="raw")
        results = client.collect(121)[:-1]
        for name, image in stills.items():
            png = cv2.imencode(".png", image)[1].tobytes()
            client.send_parts(encode_frame(name, 0, png, encoding="png"))
        client.send_parts(encode_frame("broken", 0, b"not a png", encoding="png"))
        results += client.collect(len(stills) + 1)
    finally:
        client.close()
    assert daemon.stop() == 0
    return {(r["source"], r["seq"]): r for r in results}


@pytest.fixture(scope="module")
def stills(assets: dict[str, Path]) -> dict[str, np.ndarray]:
    names = ("astronaut.png", "grace_hopper.jpg", "coffee.png", "chelsea.png")
    return {n.split(".")[0]: cv2.imread(str(assets[n])) for n in names}


@pytest.fixture(scope="module")
def single_model(
    tmp_path_factory: pytest.TempPathFactory, stills: dict[str, np.ndarray]
) -> Iterator[dict[tuple[str, int], Any]]:
    """What the single-model default pipeline publishes."""
    daemon = shipped("default.toml", tmp_path_factory.mktemp("single"))
    try:
        yield run_frames(daemon, stills)
    finally:
        daemon.close()


def assert_same_detections(got: dict[str, Any], want: dict[str, Any]) -> None:
    """Same faces: boxes and keypoints within one pixel, scores within 1e-4."""
    assert got["error"] is None and len(got["detections"]) == len(want["detections"])
    for face, expected in zip(got["detections"], want["detections"], strict=True):
        np.testing.assert_allclose(face["box"], expected["box"], atol=1.0, rtol=0)
        np.testing.assert_allclose(face["keypoints"], expected["keypoints"], atol=1.0, rtol=0)
        assert abs(face["score"] - expected["score"]) <= 1e-4


@pytest.mark.parametrize(
    "backend", ["onnxruntime", "acl-sim-sync", "acl-sim-async", "acl-sim-queue"]
)
def test_the_split_model_publishes_what_the_whole_model_does(
    tmp_path: Path,
    assets: dict[str, Path],
    stills: dict[str, np.ndarray],
    single_model: dict[tuple[str, int], Any],
    backend: str,
) -> None:
    acl_sim = backend != "onnxruntime"
    layout = sim_settings(backend.removeprefix("acl-sim-")) if acl_sim else None
    daemon = shipped(SPLIT, tmp_path, layout=layout)
    try:
        results = run_frames(daemon, stills)
    finally:
        daemon.close()
    assert results.keys() == single_model.keys()
    assert results.pop(("broken", 0))["error"]["reason"] == "decode_failed"
    assert all(r["model"] == "head" for r in results.values())
    for key, got in results.items():
        assert_same_detections(got, single_model[key])
    faces = [len(results[("carphone", seq)]["detections"]) for seq in range(120)]
    assert faces.count(1) == 120 and len(results[("astronaut", 0)]["detections"]) == 1
    final = daemon.final_counts()
    assert final["failed"] == 1 and final["published"] + 1 == final["received"]
    if backend != "onnxruntime":
        loaded = [e for e in daemon.logs if e.get("event") == "acl_model_loaded"]
        mode = backend.removeprefix("acl-sim-")
        assert sorted((e["model"], e["mode"]) for e in loaded) == [
            ("backbone", mode),
            ("head", mode),
        ]


def test_failed_executions_in_either_stage_fail_only_their_frames(
    tmp_path: Path, assets: dict[str, Path], connect: Any
) -> None:
    """Every third execution fails (of either model): those frames get an error result naming
    the stage, the others their face; the backbone's device memory held by a failed head
    batch comes back (or the chain would stall)."""

    def failing(text: str) -> str:
        sim = 'backend = "acl-sim"\n\n[runtime.options.sim]\nfail_every_n_executes = 3\n'
        return text.replace(ONNX_RUNTIME, sim)

    daemon = shipped(SPLIT, tmp_path, failing, sim_settings("async"))
    client: Client = connect(daemon)
    produce("carphone.mp4", daemon.ingress, source="carphone", encoding="raw")
    results = client.collect(121)[:-1]
    assert [r["seq"] for r in results] == list(range(120))
    failed = [r for r in results if r["error"] is not None]
    assert {r["error"]["reason"] for r in failed} == {"inference_failed"}
    assert {r["model"] for r in failed} == {"backbone", "head"}
    failure = "acl.mdl.execute_async failed: ACL_ERROR_GE_FAILURE (500002)"
    assert {r["error"]["detail"] for r in failed} == {
        f"stage {stage}: {failure}" for stage in ("backbone", "head")
    }
    assert all(len(r["detections"]) == 1 for r in results if r["error"] is None)
    assert daemon.stop() == 0
    final = daemon.final_counts()
    assert final["published"] + final["failed"] == final["received"]


def test_on_two_devices_each_batch_stays_on_the_device_that_holds_its_tensors(
    tmp_path: Path, assets: dict[str, Path], connect: Any
) -> None:
    """The backbone runs on both simulated devices; a head batch fed from device 1's memory
    on device 0 would fail ("in the memory of device 1"), so every frame publishing its face
    shows each batch went to a head replica on its own device."""

    def two_devices(text: str) -> str:
        return text.replace(
            'backend = "onnxruntime"\n', 'backend = "onnxruntime"\ndevices = [0, 1]\n'
        )

    daemon = shipped(SPLIT, tmp_path, two_devices, sim_settings("async"))
    client: Client = connect(daemon)
    produce("carphone.mp4", daemon.ingress, source="carphone", encoding="raw")
    results = client.collect(121)[:-1]
    assert [r["seq"] for r in results] == list(range(120))
    assert all(r["error"] is None and len(r["detections"]) == 1 for r in results)
    loaded = [
        (e["model"], e["device"]) for e in daemon.logs if e.get("event") == "acl_model_loaded"
    ]
    assert sorted(loaded) == [("backbone", 0), ("backbone", 1), ("head", 0), ("head", 1)]
    with urlopen(daemon.http + "/metrics", timeout=10) as response:
        families = text_string_to_metric_families(response.read().decode())
    executed = {
        (s.labels["model"], s.labels["device"]): s.value
        for family in families
        for s in family.samples
        if s.name == "streamer_replica_batches_total"
    }
    assert all(executed[(model, device)] > 0 for model in ("backbone", "head") for device in "01")
    frames = dict.fromkeys(("backbone", "head"), 120 + client.probes)
    assert metric_by_label(daemon, "streamer_batch_size_sum", "model") == frames
    for latency in ("batch_wait", "queue", "inference"):
        name = f"streamer_{latency}_duration_seconds_count"
        assert metric_by_label(daemon, name, "model") == frames, latency
    assert daemon.stop() == 0


def broken_paths(text: str) -> str:
    """The split chain on two simulated devices where every third execution fails and two
    failures in a row take a replica out of rotation."""
    daemon = (
        '[daemon]\nlog_format = "auto"\nhttp_address = "127.0.0.1:9555"\n'
        "max_consecutive_failures = 2\n\n"
    )
    sim = (
        'backend = "acl-sim"\ndevices = [0, 1]\n\n[runtime.options.sim]\n'
        "fail_every_n_executes = 3\nexecute_delay_ms = 5\n"
    )
    return daemon + text.replace(ONNX_RUNTIME, sim)


def results_until_the_end(client: Client, daemon: Daemon, sources: int) -> list[dict[str, Any]]:
    """Every non-probe result until each source's end of stream came or the daemon exited,
    then those still on their way."""
    results: list[dict[str, Any]] = []
    ended = 0
    while ended < sources and daemon.process.poll() is None:
        result = client.subscriber.receive(0.5)
        if result is not None and result["source"] != "probe":
            ended += bool(result.get("eos"))
            results.append(result)
    while (result := client.subscriber.receive(0.5)) is not None:
        results.append(result)
    return [r for r in results if r["source"] != "probe" and not r.get("eos")]


def test_a_chain_whose_devices_lose_their_paths_keeps_to_one_or_stops_the_daemon(
    tmp_path: Path, assets: dict[str, Path], connect: Any
) -> None:
    """The break test: four sources of 100 frames at 120 frames/s in all. Replicas leave
    rotation as their executions fail. Before, head-1 and backbone-0 left, and every later
    frame failed with ``no live replica on device 1`` (no stage named) while the daemon
    stayed ready. Now a replica's failure takes the other stage's replica on its device
    along, so the frames go to the device with both stages; with no such device left the
    daemon stops (``pipeline_failed``, exit 1) and says why. Which replicas fail depends on
    the threads' timing: both outcomes are checked."""
    daemon = shipped(SPLIT, tmp_path, broken_paths, sim_settings("async"))
    client: Client = connect(daemon)
    with ThreadPoolExecutor(4) as pool:
        for index in range(4):
            pool.submit(
                produce,
                "carphone.mp4",
                daemon.ingress,
                source=f"camera-{index}",
                encoding="raw",
                fps=30,
                limit=100,
                close_timeout_s=2.0,
            )  # a daemon that stopped takes no more frames: those sends fail, as they should
        results = results_until_the_end(client, daemon, 4)
    failed = [r["error"]["detail"] for r in results if r["error"] is not None]
    assert all(d.startswith(("stage backbone: ", "stage head: ")) for d in failed), failed
    kept = devices_with_a_path(daemon) if daemon.process.poll() is None else []
    if kept:  # every source ended, and nothing fails any more
        assert sorted((r["source"], r["seq"]) for r in results) == [
            (f"camera-{i}", seq) for i in range(4) for seq in range(100)
        ]
        # The injected faults go on failing executions on the device kept; a frame fails
        # otherwise only if it was in flight on the other device as it lost its path: at
        # most, per stage, a replica's batches (max_in_flight 2, one being enqueued, one
        # being dequeued) of 8 frames. Before, every frame after the break did (about 360).
        other = [d for d in failed if "acl.mdl.execute_async failed" not in d]
        assert len(other) <= 2 * 4 * 8, other
        assert daemon.stop() == 0
    else:
        assert daemon.process.wait(30) == 1
        daemon.close()
        (stopped,) = [e for e in daemon.logs if e.get("event") == "pipeline_failed"]
        assert stopped["error"].startswith(
            "BackendError: tensor chain 'backbone' -> 'head': no device has a live replica of "
            "every stage, and each batch runs on the device that holds its tensors (device 0 "
            "lacks stage "
        )
    left = [e for e in daemon.logs if e.get("event") == "replica_failed"]
    gone = {d: {e["replica"].rsplit("-", 1)[0] for e in left if e["device"] == d} for d in (0, 1)}
    assert all(gone[d] == set() for d in kept), left
    if kept:  # every batch is done: the other device's replicas have all left
        assert all(gone[d] == {"backbone", "head"} for d in (0, 1) if d not in kept), left
        assert not left or [e for e in left if "has no live replica on device" in e["reason"]]
    else:  # a head may have been finishing its batches when the daemon stopped
        assert all(gone[d] for d in (0, 1)), left
    final = daemon.final_counts()
    assert final["received"] == final["published"] + final["failed"] + final["dropped"]


def devices_with_a_path(daemon: Daemon) -> list[int]:
    """The devices with a live replica of both stages, from ``streamer_replica_up``."""
    with urlopen(daemon.http + "/metrics", timeout=10) as response:
        families = text_string_to_metric_families(response.read().decode())
    up = {
        (s.labels["model"], int(s.labels["device"]))
        for family in families
        for s in family.samples
        if s.name == "streamer_replica_up" and s.value == 1
    }
    return [d for d in (0, 1) if {("backbone", d), ("head", d)} <= up]


def test_in_queue_mode_a_lost_output_fails_only_its_own_head_batch(
    tmp_path: Path, assets: dict[str, Path], connect: Any
) -> None:
    """Queue mode, two head replicas, every fourth execution lost on the device (the count
    spans both models: while their executions alternate, an even period puts the losses on
    the head's, where every fifth could lock onto the backbone's on a busy machine): each
    loss reloads its replica's model, interrupting the enqueue of the batch behind it. That
    batch's inputs are the backbone's outputs in device memory; the interrupted enqueue used
    to release them, so the batch could not move to the other replica and failed, refused
    with ``reloading its model after a lost output``. Now the enqueue hands them back and the
    batch runs elsewhere: a frame fails only when its own execution was lost."""

    def lossy(text: str) -> str:
        sim = (
            'backend = "acl-sim"\n\n[runtime.options]\nresult_timeout_ms = 300\n\n'
            "[runtime.options.sim]\nfail_every_n_executes = 4\n"
        )
        head = 'name = "head"\nreplicas = 2\n'
        return text.replace(ONNX_RUNTIME, sim).replace('name = "head"\n', head)

    daemon = shipped(SPLIT, tmp_path, lossy, sim_settings("queue"))
    client: Client = connect(daemon)
    produce("carphone.mp4", daemon.ingress, source="carphone", encoding="raw")
    results = client.collect(121)[:-1]
    assert [r["seq"] for r in results] == list(range(120))
    details = [r["error"]["detail"] for r in results if r["error"] is not None]
    assert details, "no execution was lost"
    assert [d for d in details if "reloading its model" in d] == []
    assert all(len(r["detections"]) == 1 for r in results if r["error"] is None)
    recovered = [e for e in daemon.logs if e.get("event") == "replica_recovered"]
    assert {e["replica"].rsplit("-", 1)[0] for e in recovered} >= {"head"}
    assert daemon.stop() == 0
    final = daemon.final_counts()
    assert final["published"] + final["failed"] == final["received"]

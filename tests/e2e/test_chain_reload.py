"""SIGHUP replaces the whole chain of models, whatever its length, without losing a frame; a
chain that fails to load leaves the running one serving."""

from __future__ import annotations

import signal
import time
from pathlib import Path
from typing import Any

import cv2
import numpy as np
import zmq

from streamer.transport.protocol import encode_eos, encode_frame

from .conftest import Client, Daemon, backend_settings, shipped, shipped_text, wedge_model
from .test_operations import by_reason, scrape


def ports_of(daemon: Daemon) -> tuple[int, int, int]:
    """The daemon's ingress, egress and HTTP ports."""
    uris = (daemon.ingress, daemon.egress, daemon.http)
    ingress, egress, http = (int(uri.rsplit(":", 1)[1]) for uri in uris)
    return ingress, egress, http


def full_range(text: str) -> str:
    """The default config with BlazeFace full range as one model named ``face_full``."""
    return text.replace('name = "face"', 'name = "face_full"').replace(
        "blazeface_short_range", "blazeface_full_range"
    )


def test_sighup_replaces_two_stages_by_one_then_by_two_others(
    tmp_path: Path, connect: Any, astronaut: np.ndarray
) -> None:
    daemon = shipped("blazeface_split.toml", tmp_path)
    client: Client = connect(daemon)
    jpeg = cv2.imencode(".jpg", astronaut)[1].tobytes()
    ports = ports_of(daemon)
    reloads = {
        60: shipped_text("default.toml", ports, full_range),  # 2 stages (tensor) → 1
        150: shipped_text("blazeface_onet.toml", ports),  # 1 → 2 stages (crops)
    }
    for seq in range(240):
        client.send_parts(encode_frame("cam", seq, jpeg, encoding="jpeg"))
        if seq in reloads:
            daemon.config_path.write_text(reloads[seq])
            daemon.process.send_signal(signal.SIGHUP)
            daemon.wait_event("reloaded", 60)
    results = client.collect(240)
    assert [r["seq"] for r in results] == list(range(240))
    models = [r["model"] for r in results]
    first, second = models.index("face_full"), models.index("onet")
    assert first <= 61 and first < second <= 151  # frames sent after "reloaded" run on it
    assert set(models[:first]) <= {"head"} and set(models[first:second]) == {"face_full"}
    assert set(models[second:]) == {"onet"}
    assert all(r["error"] is None and len(r["detections"]) == 1 for r in results)
    assert all(r["detections"][0]["onet"] is not None for r in results[second:])
    assert daemon.stop() == 0
    final = daemon.final_counts()
    assert final["published"] == final["received"]
    assert [e["models"] for e in daemon.logs if e.get("event") == "reloaded"] == [
        ["face_full"],
        ["face", "onet"],
    ]


def test_sighup_with_a_chain_that_does_not_fit_keeps_the_running_one(
    tmp_path: Path, connect: Any, astronaut: np.ndarray
) -> None:
    daemon = shipped("blazeface_split.toml", tmp_path)
    client: Client = connect(daemon)
    text = daemon.config_path.read_text()
    swapped = 'input = "backbone:tensor:activation_11=activation_16,activation_16=activation_11"'
    daemon.config_path.write_text(text.replace('input = "backbone:tensor"', swapped))
    daemon.process.send_signal(signal.SIGHUP)
    rejected = daemon.wait_event("reload_rejected", 60)
    assert "stage 'backbone' output 'activation_11' [-1, 88, 16, 16]" in rejected["error"]
    assert "stage 'head' input 'activation_16' [-1, 96, 8, 8]" in rejected["error"]
    jpeg = cv2.imencode(".jpg", astronaut)[1].tobytes()
    client.send_parts(encode_frame("cam", 0, jpeg, encoding="jpeg"))
    (result,) = client.collect(1)
    assert result["model"] == "head" and len(result["detections"]) == 1
    assert daemon.stop() == 0


def test_reloads_under_full_load_keep_every_frame_on_its_chain_and_in_order(
    tmp_path: Path, connect: Any, carphone_frames: list[np.ndarray]
) -> None:
    """SIGHUP while frames arrive as fast as the daemon takes them, between chains that
    prepare frames differently (a letterbox tensor; R-Net's whole-frame item): every frame
    runs on the chain it was prepared for, once, and results stay in order. The reorder
    window is made wide: with two replicas, a machine loaded by other jobs can hold one
    replica's batch back while the other publishes past the default window, which egress
    then gives up on by design (``reorder_gave_up``); that is not what this tests."""

    def wide_reorder(text: str) -> str:
        text = text.replace("# reorder_window = 256 ", "reorder_window = 4096 ")
        return text.replace("# reorder_timeout_s = 1.0 ", "reorder_timeout_s = 60.0 ")

    daemon = shipped("default.toml", tmp_path, wide_reorder)
    client: Client = connect(daemon)
    ports = ports_of(daemon)
    configs = [shipped_text(n, ports) for n in ("face_classifier.toml", "default.toml")] * 2
    total, every = 1200, 250
    reloads = 0
    for seq in range(total):
        client.send_parts(encode_frame("cam", seq, carphone_frames[seq % 120], encoding="raw"))
        if seq % every == every - 1 and reloads < len(configs):
            daemon.config_path.write_text(configs[reloads])
            daemon.process.send_signal(signal.SIGHUP)
            daemon.wait_event("reloaded", 60)  # log lines are taken in order: this reload's
            reloads += 1
    results = client.collect(total, timeout_s=120.0)
    assert [r["seq"] for r in results] == list(range(total))
    assert all(r["error"] is None for r in results), [r["error"] for r in results if r["error"]]
    models = [r["model"] for r in results]
    segments = [m for i, m in enumerate(models) if i == 0 or m != models[i - 1]]
    assert segments == ["face", "rnet", "face", "rnet", "face"]
    assert daemon.stop() == 0
    final = daemon.final_counts()
    assert final["published"] == final["received"] and final["reorder_gave_up"] == 0


def reload_from_a_wedged_chain(
    tmp_path: Path, jpeg: bytes, frames: int, setting: tuple[str, str]
) -> Daemon:
    """The default config on a model that never finishes an execution (one replica, the
    ``[daemon]`` line ``setting[0]`` replaced by ``setting[1]``), ``frames`` frames of
    source ``stuck`` sent to it, then a SIGHUP to the default config."""
    wedge = wedge_model(tmp_path / "wedge.onnx")

    def wedged(text: str) -> str:
        text = text.replace('asset = "blazeface_short_range"', f'path = "{wedge}"')
        return text.replace("replicas = 2 ", "replicas = 1 ").replace(*setting)

    daemon = shipped("default.toml", tmp_path, wedged)
    with zmq.Context() as context, context.socket(zmq.PUSH) as push:
        push.setsockopt(zmq.LINGER, 1000)
        push.connect(daemon.ingress)
        for seq in range(frames):
            push.send_multipart(encode_frame("stuck", seq, jpeg, encoding="jpeg"))
    daemon.config_path.write_text(shipped_text("default.toml", ports_of(daemon)))
    daemon.process.send_signal(signal.SIGHUP)
    return daemon


def test_a_stop_during_a_reload_cuts_the_old_chains_drain_short(
    tmp_path: Path, astronaut: np.ndarray
) -> None:
    """SIGTERM while a reload waits for an old chain that cannot drain (its model never
    finishes an execution): the old chain gets ``drain_timeout_s`` from the signal, not the
    reload's 60 s, and the frames it holds are counted as shutdown drops."""
    jpeg = cv2.imencode(".jpg", astronaut)[1].tobytes()
    drain = ("drain_timeout_s = 10.0", "drain_timeout_s = 1.0")
    daemon = reload_from_a_wedged_chain(tmp_path, jpeg, 20, drain)
    daemon.wait_event("reload_swapping")  # a stop before it would release the new chain
    daemon.process.send_signal(signal.SIGTERM)
    final = daemon.wait_event("stopped", 40)  # the old chain's 60 s would come first
    events = [e.get("event") for e in daemon.logs]
    assert "reload_drain_cut_short" in events and "reload_swap_stuck" not in events
    assert final["received"] == 20 == final["published"] + final["failed"] + final["dropped"]
    daemon.stop(timeout_s=30)  # onnxruntime ends the process abnormally under a wedged run


def test_after_a_stuck_reload_the_new_chain_serves_every_later_frame(
    tmp_path: Path, connect: Any, astronaut: np.ndarray
) -> None:
    """An old chain that cannot drain (its model never finishes an execution) is given up
    after ``reload_timeout_s``: what was queued for it is dropped, and the new chain runs
    every frame sent after the reload."""
    jpeg = cv2.imencode(".jpg", astronaut)[1].tobytes()
    timeout = ("reload_timeout_s = 20.0", "reload_timeout_s = 1.0")
    # more frames than the old chain takes: some stay queued for it
    daemon = reload_from_a_wedged_chain(tmp_path, jpeg, 100, timeout)
    daemon.wait_event("reloaded", 30)
    client: Client = connect(daemon)
    for seq in range(30):
        client.send_parts(encode_frame("cam", seq, jpeg, encoding="jpeg"))
    results = [r for r in client.collect(30) if r["source"] == "cam"]
    assert [r["seq"] for r in results] == list(range(30))
    assert all(r["error"] is None and len(r["detections"]) == 1 for r in results)
    events = [e.get("event") for e in daemon.logs]
    assert "reload_swap_stuck" in events and "reload_dropped_frames" in events
    daemon.process.send_signal(signal.SIGTERM)
    final = daemon.wait_event("stopped", 40)
    assert final["received"] == final["published"] + final["failed"] + final["dropped"]
    daemon.stop(timeout_s=30)  # onnxruntime ends the process abnormally under a wedged run


def receive_until(client: Client, sources: tuple[str, ...], eos: bool) -> list[Any]:
    """The results of ``sources``, ``eos`` results included, until the first one came
    (``eos`` False) or each source's ``eos`` came (True); at most 30 s."""
    results: list[dict[str, Any]] = []
    ended: set[str] = set()
    deadline = time.monotonic() + 30.0
    while time.monotonic() < deadline and (ended != set(sources) if eos else not results):
        result = client.subscriber.receive(0.5)
        if result is not None and result["source"] in sources:
            results.append(result)
            if result.get("eos"):
                ended.add(result["source"])
    return results


def test_a_given_up_chain_s_frames_are_dropped_at_once_and_their_sources_go_on(
    start_daemon: Any, connect: Any, tmp_path: Path, assets: dict[str, Path], astronaut: np.ndarray
) -> None:
    """A reload whose old chain is slower than ``reload_timeout_s`` (the simulated device
    takes 1 s a batch): the frames that chain holds are counted as dropped
    (``reload_given_up``) when it is given up and reported to the reorder buffer, so the
    later frames of their sources are published in order at once, not after the reorder
    timeout (60 s here), and the counts balance while the daemon runs."""
    settings = backend_settings("acl-sim-async", assets["blazeface_short_range"], tmp_path)
    daemon = start_daemon(
        **settings,
        daemon_extra="reload_timeout_s = 0.3\nreorder_timeout_s = 60.0",
        runtime_extra="[runtime.options.sim]\nexecute_delay_ms = 1000",
    )
    client: Client = connect(daemon)
    jpeg = cv2.imencode(".jpg", astronaut)[1].tobytes()
    sources = ("a", "b")
    for seq in range(16):  # 8 batches of 4, 8 s: far more than the old chain may drain
        for source in sources:
            client.send_parts(encode_frame(source, seq, jpeg, encoding="jpeg"))
    results = receive_until(client, sources, eos=False)  # the chain now runs a and b
    text = daemon.config_path.read_text()
    daemon.config_path.write_text(text.replace("max_size = 4", "max_size = 2"))
    daemon.process.send_signal(signal.SIGHUP)
    stuck = daemon.wait_event("reload_swap_stuck", 60)
    daemon.wait_event("reloaded", 30)
    for seq in (16, 17):
        for source in sources:
            client.send_parts(encode_frame(source, seq, jpeg, encoding="jpeg"))
    for source in sources:
        client.send_parts(encode_eos(source, 17))
    results += receive_until(client, sources, eos=True)
    values = scrape(daemon)  # each eos result came after every frame of its source counted
    for source in sources:
        mine = [r for r in results if r["source"] == source]
        assert mine and mine[-1].get("eos"), mine
        seqs = [r["seq"] for r in mine[:-1]]
        assert seqs == sorted(set(seqs)) and seqs[-2:] == [16, 17]
        assert all(r["error"] is None for r in mine[:-1])
    assert values[("streamer_frames_in_flight", ())] == 0
    dropped = by_reason(values, "streamer_frames_dropped_total")
    queued = sum(e["frames"] for e in daemon.logs if e.get("event") == "reload_dropped_frames")
    assert stuck["frames"] > 0 and dropped["reload_given_up"] == stuck["frames"] + queued
    assert dropped["shutdown"] == 0
    assert values[("streamer_reorder_gave_up_frames_total", ())] == 0
    # Its threads end with the executions they were in: its models are closed then.
    assert daemon.wait_event("given_up_chain_closed", 60)["stages"] == ["face"]
    assert daemon.stop() == 0
    final = daemon.final_counts()
    assert final["received"] == final["published"] + final["failed"] + final["dropped"]
    assert final["dropped_by_reason"]["reload_given_up"] == dropped["reload_given_up"]


def test_reloads_that_rename_the_model_leave_only_its_current_name_in_metrics(
    start_daemon: Any, connect: Any, astronaut: np.ndarray
) -> None:
    """Each reload renames the model: the series of the names it no longer has leave
    /metrics (histograms, per-model counters, replicas, retried batches)."""
    daemon: Daemon = start_daemon()
    client: Client = connect(daemon)  # its probe frames ran on "face"
    assert models_in_metrics(daemon) == {"face"}
    jpeg = cv2.imencode(".jpg", astronaut)[1].tobytes()
    text = daemon.config_path.read_text()
    for turn, name in enumerate(("face_b", "face_c")):
        daemon.config_path.write_text(text.replace('name = "face"', f'name = "{name}"'))
        daemon.process.send_signal(signal.SIGHUP)
        daemon.wait_event("reloaded", 60)
        for seq in range(4):
            client.send_parts(encode_frame("cam", turn * 4 + seq, jpeg, encoding="jpeg"))
        assert [r["model"] for r in client.collect(4)] == [name] * 4
    assert models_in_metrics(daemon) == {"face_c"}
    assert daemon.stop() == 0


def models_in_metrics(daemon: Daemon) -> set[str]:
    """Every ``model`` label value in /metrics."""
    return {dict(labels)["model"] for _, labels in scrape(daemon) if "model" in dict(labels)}

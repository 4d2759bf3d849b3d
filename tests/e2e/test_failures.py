"""Failures the daemon must survive, and the ones that must stop it."""

from __future__ import annotations

import signal
import time
from pathlib import Path
from typing import Any

import onnx
import pytest
import zmq
from onnx import TensorProto, helper

from streamer.clients.producer import produce

from .conftest import (
    Client,
    Daemon,
    backend_settings,
    metric_by_label,
    samples,
    shipped,
    shipped_config,
    sim_settings,
    streamer_check,
    to_acl_sim,
    wait_metric,
)
from .test_operations import reload_onto_a_fifo


def peak_rss_mb(daemon: Daemon) -> float:
    status = Path(f"/proc/{daemon.process.pid}/status").read_text()
    line = next(line for line in status.splitlines() if line.startswith("VmHWM:"))
    return int(line.split()[1]) / 1024


def test_a_subscriber_that_never_reads_slows_nothing(start_daemon: Any, connect: Any) -> None:
    daemon = start_daemon()
    client: Client = connect(daemon)
    with zmq.Context() as context, context.socket(zmq.SUB) as idle:
        idle.setsockopt(zmq.RCVHWM, 10)
        idle.setsockopt(zmq.SUBSCRIBE, b"")
        idle.connect(daemon.egress)
        # Probes until one reaches it (a fixed sleep could end before it had subscribed, and
        # the test showed nothing): it must now hold the daemon up, if anything can.
        deadline = time.monotonic() + 30
        while not idle.poll(200):
            assert time.monotonic() < deadline, "the idle subscriber never subscribed"
            client.probe()
        rss_before = peak_rss_mb(daemon)
        produce("carphone.mp4", daemon.ingress, source="carphone", encoding="raw", loop=25)
        results = client.collect(3001, timeout_s=120)
        idle.close(linger=0)
    assert [r["seq"] for r in results[:-1]] == list(range(3000))
    assert results[-1].get("eos") is True
    assert peak_rss_mb(daemon) - rss_before < 100  # ZMQ's send HWM bounds what piles up
    assert daemon.stop() == 0
    final = daemon.final_counts()
    assert final["published"] == final["received"]


def test_a_failing_batch_fails_alone(
    start_daemon: Any, connect: Any, tmp_path: Path, assets: dict[str, Path]
) -> None:
    settings = backend_settings("acl-sim-sync", assets["blazeface_short_range"], tmp_path)
    daemon = start_daemon(
        **{**settings, "max_size": 1},
        runtime_extra="[runtime.options.sim]\nfail_every_n_executes = 3",
    )
    client: Client = connect(daemon)  # the probes take some executions; count from here
    produce("carphone.mp4", daemon.ingress, source="carphone", encoding="raw", limit=30)
    results = client.collect(31)[:-1]
    assert [r["seq"] for r in results] == list(range(30))
    failed = [r for r in results if r["error"] is not None]
    assert 9 <= len(failed) <= 11
    assert {r["error"]["reason"] for r in failed} == {"inference_failed"}
    assert all(len(r["detections"]) == 1 for r in results if r["error"] is None)
    assert daemon.stop() == 0
    warnings = [e for e in daemon.logs if e.get("event") == "execution_failed"]
    assert warnings and all(e["consecutive"] == 1 for e in warnings)  # once per streak
    assert len(warnings) < len(failed)  # and at most once per WARNING_INTERVAL_S


def test_repeated_failures_stop_the_daemon_with_an_error(
    start_daemon: Any, tmp_path: Path, assets: dict[str, Path]
) -> None:
    settings = backend_settings("acl-sim-sync", assets["blazeface_short_range"], tmp_path)
    daemon = start_daemon(
        **{**settings, "max_size": 1},
        daemon_extra="max_consecutive_failures = 5",
        runtime_extra="[runtime.options.sim]\nfail_every_n_executes = 1",
    )
    produce("carphone.mp4", daemon.ingress, source="carphone", encoding="raw", limit=20)
    assert daemon.process.wait(60) == 1
    daemon.close()
    failed = daemon.wait_event("pipeline_failed", 5)
    assert "5 executions failed in a row" in failed["error"]
    # No replica is left to run what is queued: the drain does not wait drain_timeout_s.
    assert daemon.wait_event("draining", 5)["drain_timeout_s"] == 1.0
    final = daemon.final_counts()
    assert final["failed_by_reason"].get("inference_failed", 0) >= 5
    assert final["received"] == final["published"] + final["failed"] + final["dropped"]


def test_a_stop_during_which_every_replica_of_a_stage_fails_exits_1(
    start_daemon: Any, tmp_path: Path, assets: dict[str, Path]
) -> None:
    """The frames wait in the batcher (its deadline is minutes away) when the SIGTERM comes;
    the drain's marker flushes them to the stage's one replica, whose execution fails and
    takes it out of rotation (``max_consecutive_failures = 1``): the stop ends with
    ``pipeline_failed`` and exit 1. It exited 0: only the control loop, ended by then, looked
    for a failure."""
    settings = backend_settings("acl-sim-sync", assets["blazeface_short_range"], tmp_path)
    daemon = start_daemon(
        **settings,
        max_delay_ms=600_000.0,
        daemon_extra="max_consecutive_failures = 1",
        runtime_extra="[runtime.options.sim]\nfail_every_n_executes = 1",
    )
    produce("carphone.mp4", daemon.ingress, source="carphone", encoding="raw", limit=3)
    deadline = time.monotonic() + 30
    while (received := samples(daemon, "streamer_frames_received_total")[0].value) < 3:
        assert time.monotonic() < deadline, received
        time.sleep(0.05)  # no event tells a frame in; none executes before the stop
    assert daemon.stop() == 1
    events = [e.get("event") for e in daemon.logs]
    assert events.index("draining") < events.index("pipeline_failed") < events.index("stopped")
    failed = daemon.wait_event("pipeline_failed", 5)
    assert "model 'face': every replica failed (device 0: " in failed["error"]
    final = daemon.final_counts()
    assert final["received"] == 3 == final["failed_by_reason"]["inference_failed"]


def failing_model(path: Path) -> Path:
    """A model with BlazeFace short range's interface whose every execution fails: input
    ``input`` float32 (N, 3, 128, 128) reshaped to outputs ``regressors`` (N, 896, 16) and
    ``classificators`` (N, 896, 1), sizes it does not have (onnxruntime checks only when it
    runs, as N is dynamic)."""
    shapes = {"regressors": ["N", 896, 16], "classificators": ["N", 896, 1]}
    graph = helper.make_graph(
        [helper.make_node("Reshape", ["input", f"{n}_shape"], [n]) for n in shapes],
        "fails",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, ["N", 3, 128, 128])],
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, s) for n, s in shapes.items()],
        [
            helper.make_tensor(f"{n}_shape", TensorProto.INT64, [3], [0, *s[1:]])
            for n, s in shapes.items()
        ],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    onnx.save(model, str(path))
    return path


def test_a_pipeline_failure_during_a_reload_stops_the_daemon(
    start_daemon: Any, tmp_path: Path
) -> None:
    """The running model's one replica leaves rotation (every execution fails;
    ``max_consecutive_failures = 1``) while a reload's load blocks: the control loop, which
    runs beside the reload, stops the daemon with ``pipeline_failed`` and exit 1, and the
    stop abandons the reload. The reload ran on the control loop, which saw nothing."""
    daemon: Daemon = start_daemon(
        model_path=failing_model(tmp_path / "fails.onnx"),
        daemon_extra="max_consecutive_failures = 1",
    )
    reload_onto_a_fifo(daemon, tmp_path)
    daemon.wait_event("reload_loading")
    produce("carphone.mp4", daemon.ingress, source="carphone", encoding="raw", limit=1)
    assert daemon.process.wait(30) == 1
    daemon.close()
    events = [e.get("event") for e in daemon.logs]
    order = ["reload_loading", "pipeline_failed", "draining", "reload_abandoned", "stopped"]
    assert [events.index(e) for e in order] == sorted(events.index(e) for e in order)
    final = daemon.final_counts()
    assert final["received"] == 1 == final["failed_by_reason"]["inference_failed"]


@pytest.mark.parametrize("mode", ["async", "queue"])
def test_two_devices_share_the_work_and_one_can_fail(
    mode: str, start_daemon: Any, connect: Any, tmp_path: Path, assets: dict[str, Path]
) -> None:
    """In queue mode the lost device's outputs stop coming: its replicas fail after
    result_timeout_ms. Their enqueue threads, waiting for room the lost device would never
    make, used to keep their batches (and the frames in them) forever. The default reorder
    timeout outlasts result_timeout_ms, so the failed frames still come in order. In async
    mode its executions fail, and one failure takes it out of rotation here (by default,
    ten failed probes would, one a second)."""
    settings = backend_settings(f"acl-sim-{mode}", assets["blazeface_short_range"], tmp_path)
    daemon = start_daemon(
        **{**settings, "max_size": 1},
        daemon_extra="max_consecutive_failures = 1",
        runtime_extra="devices = [0, 1]\n[runtime.options]\nresult_timeout_ms = 2000\n"
        '[runtime.options.sim]\ndevice_lost_after_n_executes = { "1" = 40 }',
    )
    client: Client = connect(daemon)
    produce("carphone.mp4", daemon.ingress, source="first", encoding="raw", fps=200)
    first = client.collect(121)[:-1]
    assert [r["seq"] for r in first] == list(range(120))
    executed = metric_by_label(daemon, "streamer_replica_batches_total", "device")
    assert executed["0"] > 0 and executed["1"] > 0  # both devices served
    daemon.wait_event("replica_failed", 30)
    lost = [r for r in first if r["error"] is not None]
    assert all(r["error"]["reason"] == "inference_failed" for r in lost)
    produce("carphone.mp4", daemon.ingress, source="second", encoding="raw", fps=200)
    second = client.collect(121)[:-1]
    assert [r["seq"] for r in second] == list(range(120))
    assert all(r["error"] is None and len(r["detections"]) == 1 for r in second)
    after = metric_by_label(daemon, "streamer_replica_batches_total", "device")
    assert after["1"] == executed["1"]  # device 1 is out of rotation
    assert after["0"] >= executed["0"] + 120
    assert daemon.stop() == 0
    final = daemon.final_counts()
    assert final["received"] == final["published"] + final["failed"] + final["dropped"]


def test_a_lost_device_fails_no_frame_while_the_other_serves(connect: Any, tmp_path: Path) -> None:
    """The shipped config on devices 0 and 1 (two replicas each), device 1 lost after 15
    executions. Its replicas failed at once, so they always had the fewest batches in flight
    and drew most batches until 10 failures in a row took them out: two thirds of the frames
    failed. Each batch that fails there now runs again on device 0, and a replica on a
    failure streak draws only probes; at ``max_consecutive_failures`` (1 here, so that no
    probe need be waited for) it leaves rotation."""

    def lost_device(text: str) -> str:
        sim = '[runtime.options.sim]\ndevice_lost_after_n_executes = { "1" = 15 }'
        text = to_acl_sim(text, sim).replace("devices = [0]", "devices = [0, 1]")
        return text.replace("max_consecutive_failures = 10", "max_consecutive_failures = 1")

    daemon = shipped("default.toml", tmp_path, lost_device, sim_settings("async"))
    client: Client = connect(daemon)
    produce("carphone.mp4", daemon.ingress, source="carphone", encoding="raw", fps=200)
    results = client.collect(121)[:-1]
    assert [r["seq"] for r in results] == list(range(120))
    assert all(r["error"] is None and len(r["detections"]) == 1 for r in results)
    lost = [daemon.wait_event("replica_failed", 30) for _ in range(2)]
    assert [e["device"] for e in lost] == [1, 1]
    up = sorted((s.labels["device"], s.value) for s in samples(daemon, "up"))
    assert up == [("0", 1), ("0", 1), ("1", 0), ("1", 0)]  # device 1's replicas are out
    (retried,) = samples(daemon, "streamer_batches_retried_total")
    assert retried.labels == {"model": "face"} and retried.value > 0
    assert [e for e in daemon.logs if e.get("event") == "batch_retried"]
    assert daemon.stop() == 0
    final = daemon.final_counts()
    assert final["failed"] == 0 and final["published"] == final["received"]


@pytest.mark.parametrize("mode", ["queue", "async", "sync"])
def test_an_abandoned_drain_ends_every_thread_before_the_models_close(
    mode: str, start_daemon: Any, tmp_path: Path, assets: dict[str, Path]
) -> None:
    """SIGTERM with more in flight than ``drain_timeout_s`` lets finish: the enqueue thread
    waiting for room in a full model gives up with the others, so no thread outlives the
    drain and the models are closed after every thread ended, not under one."""
    settings = backend_settings(f"acl-sim-{mode}", assets["blazeface_short_range"], tmp_path)
    daemon = start_daemon(
        **settings,
        drain_timeout_s=0.5,
        runtime_extra="[runtime.options.sim]\nexecute_delay_ms = 400",
    )
    produce("carphone.mp4", daemon.ingress, source="carphone", encoding="raw", limit=40)
    assert daemon.stop() == 0
    events = [e.get("event") for e in daemon.logs]
    assert "drain_timeout" in events and "threads_stuck" not in events
    stopped = events.index("stopped")
    assert not [e for e in daemon.logs[stopped:] if e.get("level") in ("error", "warning")]
    final = daemon.final_counts()
    assert final["received"] == 40
    assert final["received"] == final["published"] + final["failed"] + final["dropped"]


def test_a_model_that_fails_to_release_is_logged_and_everything_else_is_released(
    start_daemon: Any, connect: Any, tmp_path: Path, assets: dict[str, Path]
) -> None:
    """``acl.mdl.unload`` fails: at a reload the old chain's failure is logged and the new
    chain serves; at the stop the rest is still released, the final counts are logged and
    the exit code is 1 instead of a traceback."""
    settings = backend_settings("acl-sim-async", assets["blazeface_short_range"], tmp_path)
    daemon = start_daemon(
        **settings, runtime_extra='[runtime.options.sim]\nfail_calls = {"acl.mdl.unload" = 107000}'
    )
    client: Client = connect(daemon)
    text = daemon.config_path.read_text()
    daemon.config_path.write_text(text.replace("max_size = 4", "max_size = 2"))
    daemon.process.send_signal(signal.SIGHUP)
    failure = daemon.wait_event("release_failed", 60)
    assert failure["resource"] == "retired chain"
    assert "acl.mdl.unload failed: ACL_ERROR_RT_PARAM_INVALID" in failure["error"]
    daemon.wait_event("reloaded", 30)
    produce("carphone.mp4", daemon.ingress, source="after", encoding="raw", limit=20)
    results = client.collect(21)[:-1]
    assert [r["seq"] for r in results] == list(range(20))
    assert all(r["error"] is None and len(r["detections"]) == 1 for r in results)
    assert daemon.stop() == 1
    assert daemon.wait_event("release_failed", 5)["resource"] == "pipeline"
    final = daemon.final_counts()
    assert final["published"] == final["received"]
    assert not [e for e in daemon.logs if e.get("event") == "raw" and "Traceback" in e["line"]]


def test_check_reports_a_failed_release_in_one_line(
    tmp_path: Path, assets: dict[str, Path]
) -> None:
    """``streamer check`` on a device whose ``acl.mdl.unload`` fails: exit 1 with one
    ``error:`` line (beside the loading's log lines) instead of a traceback, and no ``ok``."""
    settings = backend_settings("acl-sim-async", assets["blazeface_short_range"], tmp_path)

    def on_sim(text: str) -> str:
        text = to_acl_sim(text).replace('normalize = "model"', 'normalize = "host"')  # or AIPP
        text = text.replace('asset = "blazeface_short_range"', f'path = "{settings["model_path"]}"')
        return text + '\n[runtime.options.sim]\nfail_calls = {"acl.mdl.unload" = 107000}\n'

    config = shipped_config("default.toml", tmp_path / "check", on_sim)[0]
    result = streamer_check(config)
    assert result.returncode == 1, result.stdout + result.stderr
    (line,) = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert "Traceback" not in result.stderr
    assert line.startswith("error: the models loaded but releasing them failed")
    assert "acl.mdl.unload failed" in line and ": ok" not in result.stdout


@pytest.mark.parametrize(
    ("code", "name", "exit_code"),
    [
        (207001, "ACL_ERROR_RT_MEMORY_ALLOCATION", 1),  # the device is full: a backend failure
        (200000, "ACL_ERROR_BAD_ALLOC", 1),
        (145000, "ACL_ERROR_GE_PARAM_INVALID", 2),  # the runtime refuses the model file
    ],
)
def test_a_model_load_short_of_device_memory_is_a_backend_failure_not_a_bad_model(
    tmp_path: Path, assets: dict[str, Path], code: int, name: str, exit_code: int
) -> None:
    """``acl.mdl.load_from_file`` out of device memory exits 1 (a backend failure: the units
    restart it), as ``acl.rt.malloc`` out of memory does, not 2 (a bad model: the units'
    ``RestartPreventExitStatus=2`` would leave the service down); a model the runtime refuses
    is still exit 2."""
    settings = backend_settings("acl-sim-async", assets["blazeface_short_range"], tmp_path)

    def on_sim(text: str) -> str:
        text = to_acl_sim(text).replace('normalize = "model"', 'normalize = "host"')  # or AIPP
        text = text.replace('asset = "blazeface_short_range"', f'path = "{settings["model_path"]}"')
        fault = f'fail_calls = {{"acl.mdl.load_from_file" = {code}}}'
        return text + f"\n[runtime.options.sim]\n{fault}\n"

    config = shipped_config("default.toml", tmp_path / "check", on_sim)[0]
    result = streamer_check(config)
    assert result.returncode == exit_code, result.stdout + result.stderr
    (line,) = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert "Traceback" not in result.stderr
    assert f"acl.mdl.load_from_file failed: {name} ({code})" in line, line
    assert "model 'face'" in line, line


def test_an_asset_on_the_simulator_is_pointed_to_its_layout_not_a_damaged_cache(
    tmp_path: Path, assets: dict[str, Path]
) -> None:
    """A fetched asset (the ONNX original, batch axis symbolic) named on acl-sim fails to
    load as ATC's loader would fail it; the hint named the cache, which its digest had just
    proved intact, instead of ``streamer models sim-layout``."""

    def on_sim(text: str) -> str:
        return to_acl_sim(text).replace('normalize = "model"', 'normalize = "host"')

    config = shipped_config("default.toml", tmp_path, on_sim)[0]
    result = streamer_check(config)
    assert result.returncode == 2, result.stdout + result.stderr
    (line,) = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert "are dynamic" in line and "`streamer models sim-layout`" in line
    assert "damaged" not in line


@pytest.mark.parametrize("mode", ["queue", "async"])
def test_a_hung_execution_is_abandoned_and_the_stop_does_not_wait_for_it(
    mode: str, start_daemon: Any, tmp_path: Path, assets: dict[str, Path]
) -> None:
    """SIGTERM while executions hang on the device: the model is abandoned instead of freeing
    the memory they use (the simulator reports such a use-after-free as
    ``acl_sim_task_failed``), the device is neither synchronised nor reset, and the daemon
    logs its final counts and exits 1 without waiting the executions out, nor finalising the
    interpreter under them (an execution returning then would abort the process). Not sync mode:
    pyACL's ``acl.mdl.execute`` holds the GIL, so a hung one stops the whole process until
    the watchdog ends it; the simulator, which does not hold the GIL, cannot show that."""
    settings = backend_settings(f"acl-sim-{mode}", assets["blazeface_short_range"], tmp_path)
    daemon = start_daemon(
        **settings,
        drain_timeout_s=0.5,
        runtime_extra="[runtime.options]\nresult_timeout_ms = 2000\n"
        "[runtime.options.sim]\nexecute_delay_ms = 600000",
    )
    produce("carphone.mp4", daemon.ingress, source="carphone", encoding="raw", limit=3)
    wait_metric(daemon, "streamer_frames_received_total", 3)
    wait_metric(daemon, "streamer_batch_flushes_total", 1)  # to the model: its execution hangs
    assert daemon.stop(timeout_s=60) == 1
    events = [e.get("event") for e in daemon.logs]
    abandoned = next(e for e in daemon.logs if e.get("event") == "acl_model_abandoned")
    assert abandoned["mode"] == mode and abandoned["device"] == 0
    assert "acl_device_abandoned" in events and "acl_finalize_skipped" in events
    assert "acl_sim_task_failed" not in events
    forced = next(e for e in daemon.logs if e.get("event") == "exit_forced")
    assert forced["abandoned"] == ["model 'face' on device 0"] and forced["code"] == 1
    final = daemon.final_counts()
    assert final["drained"] is False and final["received"] == 3
    assert final["received"] == final["published"] + final["failed"] + final["dropped"]


def test_a_signal_during_the_drain_is_logged(
    start_daemon: Any, tmp_path: Path, assets: dict[str, Path]
) -> None:
    """A SIGHUP while the frames in flight drain is acknowledged before the last line."""
    settings = backend_settings("acl-sim-async", assets["blazeface_short_range"], tmp_path)
    daemon = start_daemon(
        **settings, runtime_extra="[runtime.options.sim]\nexecute_delay_ms = 1500"
    )
    produce("carphone.mp4", daemon.ingress, source="carphone", encoding="raw", limit=4)
    wait_metric(daemon, "streamer_frames_received_total", 4)  # in before the stop
    daemon.process.send_signal(signal.SIGTERM)
    daemon.wait_event("draining", 30)
    daemon.process.send_signal(signal.SIGHUP)
    assert daemon.process.wait(30) == 0
    daemon.close()
    events = [(e.get("event"), e.get("signal")) for e in daemon.logs]
    assert events.index(("signal_received", "SIGHUP")) < events.index(("stopped", None))
    assert daemon.final_counts()["published"] == 4

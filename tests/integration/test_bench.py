"""``streamer bench --quick``: every mode runs and the report has its shape.

A smoke test: a few frames per mode, so nothing here is a measurement and no timing is
asserted; it checks that every mode of issue 8 produced results and that the report, the
table and the plot are written.
"""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
FRAMES = 16
MODES = {"serial", "naive", "daemon", "daemon_half_rate", "daemon_16_sources", "daemon_device_side"}
STEPS = {"decode", "preprocess", "inference", "postprocess"}


def run_bench(out: Path) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "streamer", "bench", "--quick", "--frames", str(FRAMES)]
    command += ["--rounds", "2"]  # the components of each round, and the cheapest kept
    command += ["--config", str(ROOT / "configs" / "default.toml"), "--out", str(out)]
    return subprocess.run(command, capture_output=True, text=True, timeout=110, cwd=ROOT)


def test_quick_bench_runs_every_mode_and_writes_the_report(
    tmp_path: Path, assets: dict[str, Path]
) -> None:
    done = run_bench(tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads((tmp_path / "report.json").read_text())
    assert {i["name"] for i in report["inputs"]} == {"carphone_raw", "bigbuckbunny_jpeg"}
    for item in report["inputs"]:
        assert set(item["runs"]) == MODES
        for mode, run in item["runs"].items():
            sent = FRAMES * (5 if mode == "daemon_16_sources" else 1)  # 16 connections' fill
            assert run["frames"] == sent and run["failed"] == 0, (item["name"], mode, run)
            assert run["latency"]["p99_ms"] >= run["latency"]["p50_ms"] > 0
            if not mode.startswith("daemon"):  # no pipeline to fill: the whole run is steady
                assert run["whole_run_fps"] is None, (mode, run)
            if mode.startswith("daemon") and mode != "daemon_half_rate":  # 10 ms ticks
                assert 0 <= run["idle_cores"] <= report["settings"]["cores"] + 1, (mode, run)
            else:  # not a daemon, or paced: idle by design
                assert run["idle_cores"] is None, (mode, run)
        assert set(item["components"]) == STEPS | {"every_replica"}
        together = item["components"]["every_replica"]  # each round's cheapest size alone
        assert 1 <= len(together) <= 2 and set(together) <= set(item["components"]["inference"])
        for size, cost in together.items():  # the default's 2 replicas, 16 frames each
            assert cost["frames"] == 2 * math.ceil(FRAMES / int(size)) * int(size)
        ceiling = item["ceiling"]  # the daemon run's producer and subscriber priced in
        assert ceiling["producer_cpu_ms"] > 0 and ceiling["subscriber_cpu_ms"] > 0
        cores = report["settings"]["cores"]
        assert ceiling["fps"] == pytest.approx(cores * 1000 / ceiling["cpu_ms_per_frame"], 1e-3)
        assert ceiling["fps"] <= item["limit"]["fps"] and str(ceiling["batch_size"]) in together
        assert set(item["components"]["inference"]) == {"1", "2", "4", "8", "16"}
        assert item["limit"]["fps"] > 0 and item["limit"]["cores"] >= 1
        stages = item["daemon"]["daemon"]["stages"]
        assert stages["rows_per_run"] == 2  # the default config's, applied
        names = {stage["name"] for stage in stages["stages"]}
        alone = {stage["name"]: stage["alone_cpu_ms"] for stage in stages["stages"]}
        steps = item["components"]  # the stage table's steps alone are the limit's
        steps_ms = steps["decode"]["cpu_ms"] + steps["preprocess"]["cpu_ms"]
        assert alone["decode+preprocess"] == pytest.approx(steps_ms, abs=1e-4)
        assert alone["postprocess"] == pytest.approx(steps["postprocess"]["cpu_ms"], abs=1e-4)
        assert {"ingress", "decode+preprocess", "inference", "postprocess", "egress"} <= names
        assert stages["slowest"]
        device_side = item["daemon"]["daemon_device_side"]["stages"]
        for report_stages in (stages, device_side):  # None without py-spy to name threads
            assert report_stages["host_cpu_ms"] is None or report_stages["host_cpu_ms"] > 0
        assert {t["name"] for t in item["targets"]} >= {"daemon / limit", "daemon / naive"}
        at_pace = item["limit_at_pace"]  # a run per round, each timed before and after
        assert len(at_pace["runs"]) == 2
        daemon_fps = item["runs"]["daemon"]["rounds_fps"]
        for paced, fps in zip(at_pace["runs"], daemon_fps, strict=True):
            pace = paced["pace"]
            assert pace["components_ms"] > 0 and pace["before_ms"] > 0 and pace["after_ms"] > 0
            assert paced["daemon_fps"] == fps and str(pace["batch_size"]) in together
            slowdown = (pace["before_ms"] + pace["after_ms"]) / 2 / pace["components_ms"]
            assert paced["slowdown"] == pytest.approx(slowdown, abs=1e-3)
            extra_ms = (slowdown - 1) * pace["inference_ms"]
            cores = report["settings"]["cores"]
            limit_fps = cores * 1000 / (pace["limit_cpu_ms"] + extra_ms)
            assert paced["limit_fps"] == pytest.approx(limit_fps, abs=0.1)
            assert paced["ratio"] == pytest.approx(fps / paced["limit_fps"], abs=2e-3)
        assert at_pace["best"]["daemon_fps"] == max(daemon_fps)
    assert report["targets"] and report["max_size"]["fastest"] in (1, 2, 4, 8, 16)
    assert any(t["name"].startswith("config rows_per_run 2: ") for t in report["targets"])
    batches = [i["daemon"]["daemon"]["stages"]["mean_batch_size"] for i in report["inputs"]]
    assert ("rows; daemon overhead" in done.stdout) == any(b > 2 for b in batches)
    assert report["settings"]["daemon_cpu_scheduling_policy"] == "batch"
    assert "daemon / limit" in done.stdout and "slowest stage" in done.stdout
    assert "others  idle" in done.stdout  # the table's last two columns
    assert "host CPU per frame" in done.stdout
    assert done.stdout.count("ceiling here: ") == 2
    assert done.stdout.count("limit at the daemon run's pace: ") == 2
    assert (tmp_path / "report.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "no plot will be drawn" not in done.stdout


@pytest.mark.parametrize(
    ("config", "said"),
    [
        ("blazeface_split.toml", "times one model, and this config chains 2 (backbone, head)"),
        ("blazeface_onet.toml", "times one model, and this config chains 2 (face, onet)"),
    ],
)
def test_a_chain_the_bench_cannot_time_is_refused_clearly_and_leaves_no_folder(
    tmp_path: Path, config: str, said: str
) -> None:
    """A chain is refused before anything runs: BlazeFace → O-Net used to be timed as
    BlazeFace alone against a daemon running both."""
    out = tmp_path / "out"
    command = [sys.executable, "-m", "streamer", "bench", "--quick", "--frames", "4"]
    command += ["--config", str(ROOT / "configs" / config), "--out", str(out)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=110, cwd=ROOT)
    assert done.returncode == 2, done.stderr[-3000:]
    assert said in done.stderr
    assert not out.exists()


def children(pid: int) -> set[int]:
    """The processes whose parent is ``pid`` (Linux /proc)."""
    found = set()
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rpartition(")")[2].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            found.add(int(stat.parent.name))
    return found


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]
    except OSError:
        return False
    return state != "Z"


@pytest.mark.parametrize(
    ("signals", "exit_codes"),
    [((signal.SIGTERM,), {143}), ((signal.SIGTERM, signal.SIGINT), {1, 143})],
    ids=["sigterm", "sigterm-then-ctrl-c"],
)
def test_sigterm_stops_the_daemons_and_the_receiver_it_started(
    tmp_path: Path, assets: dict[str, Path], signals: tuple[int, ...], exit_codes: set[int]
) -> None:
    """SIGTERM to the bench (a CI job cancelled, a systemd unit stopped) used to leave its
    two daemons and the naive receiver running, orphaned, with the frame files in --out;
    then a Ctrl-C while it stopped them (or a signal while it stopped them of its own
    accord) skipped the stops after the one under way."""
    out = tmp_path / "out"
    command = [sys.executable, "-m", "streamer", "bench", "--quick", "--frames", "4000"]
    command += ["--config", str(ROOT / "configs" / "default.toml"), "--out", str(out)]
    bench = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    started: set[int] = set()
    try:
        deadline = time.monotonic() + 90
        while len(started := children(bench.pid)) < 3 and time.monotonic() < deadline:
            time.sleep(0.2)  # the receiver, then the two daemons
        assert len(started) >= 3, "the bench did not start its daemons"
        time.sleep(2)  # the daemons loaded, the warm-up under way
        for signum in signals:
            bench.send_signal(signum)
            time.sleep(0.3)  # the bench is stopping its first daemon
        _, stderr = bench.communicate(timeout=60)
    finally:
        bench.kill()
        left = [pid for pid in started if alive(pid)]
        for pid in left:  # a failed run must not leave them to the next tests
            os.kill(pid, signal.SIGKILL)
    assert bench.returncode in exit_codes, stderr.decode()[-2000:]
    assert not left
    assert not list(out.glob("frames-*"))


def test_sigterm_while_the_inputs_are_read_leaves_no_frame_files(tmp_path: Path) -> None:
    """The frames of the first input used to be saved before the cleanup was armed, so a
    bench stopped while it read the second input left them in --out. The report of an
    earlier run in --out used to stay beside the new configs, as if this run had written it."""
    out = tmp_path / "out"
    out.mkdir()
    earlier = [out / "report.json", out / "report.png"]
    for path in earlier:
        path.write_bytes(b"an earlier run's")
    command = [sys.executable, "-m", "streamer", "bench", "--quick", "--frames", "3000"]
    command += ["--config", str(ROOT / "configs" / "default.toml"), "--out", str(out)]
    bench = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 90
        while not (out / "frames-carphone_raw.pickle").exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert (out / "frames-carphone_raw.pickle").exists(), "the bench saved no frames"
        bench.send_signal(signal.SIGTERM)
        _, stderr = bench.communicate(timeout=60)
    finally:
        bench.kill()
    assert bench.returncode == 143, stderr.decode()[-2000:]
    assert not list(out.glob("frames-*"))
    assert (out / "config-daemon.toml").exists()  # what --out is for stays
    assert not any(path.exists() for path in earlier)


def test_a_config_that_does_not_load_is_the_first_thing_said_and_leaves_no_folder(
    tmp_path: Path,
) -> None:
    config = tmp_path / "bad.toml"
    config.write_text("[daemon]\nqueue_size = 0\n")
    out = tmp_path / "out"
    command = [sys.executable, "-m", "streamer", "bench", "--quick", "--config", str(config)]
    done = subprocess.run([*command, "--out", str(out)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 2, done.stderr[-3000:]
    assert "queue_size" in done.stderr and "matplotlib" not in done.stdout + done.stderr
    assert not out.exists()


@pytest.mark.parametrize("settle", ["nan", "inf"])
def test_a_settle_time_that_is_not_a_finite_number_is_refused(tmp_path: Path, settle: str) -> None:
    """NaN was taken, and written into report.json, which is then not JSON."""
    out = tmp_path / "out"
    command = [sys.executable, "-m", "streamer", "bench", "--quick", "--settle", settle]
    done = subprocess.run([*command, "--out", str(out)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 2, done.stderr[-3000:]
    assert "must be a finite number" in done.stderr and not out.exists()

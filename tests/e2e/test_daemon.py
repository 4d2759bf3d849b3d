"""The daemon end to end on the embedded default (onnxruntime, BlazeFace short range)."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import cv2
import numpy as np
import pytest

from streamer.clients.producer import produce
from streamer.errors import ClientError
from streamer.transport.protocol import encode_frame

from .conftest import Client, Daemon, backend_settings

ROOT = Path(__file__).resolve().parents[2]


def iou(a: list[float], b: list[float]) -> float:
    ax, ay, aw, ah = a
    bx, by, bw, bh = b
    w = max(0.0, min(ax + aw, bx + bw) - max(ax, bx))
    h = max(0.0, min(ay + ah, by + bh) - max(ay, by))
    return w * h / (aw * ah + bw * bh - w * h)


def assert_accounted(daemon: Daemon) -> dict[str, Any]:
    final = daemon.final_counts()
    assert final["received"] == final["published"] + final["failed"] + final["dropped"]
    return final


def test_carphone_video_end_to_end(
    start_daemon: Any, connect: Any, backend: dict[str, Any]
) -> None:
    daemon = start_daemon(**backend)
    client: Client = connect(daemon)
    produce("carphone.mp4", daemon.ingress, source="carphone", encoding="jpeg")
    results = client.collect(121)
    assert results[-1].get("eos") is True and results[-1]["seq"] == 119
    frames = results[:-1]
    assert [r["seq"] for r in frames] == list(range(120))
    assert all(r["error"] is None and r["model"] == "face" for r in frames)
    assert all((r["width"], r["height"]) == (176, 144) for r in frames)
    one_face = sum(len(r["detections"]) == 1 for r in frames)
    assert one_face >= 115, one_face
    assert all(r["latency_ms"]["total"] >= r["latency_ms"]["infer"] >= 0 for r in frames)
    assert daemon.stop() == 0
    final = assert_accounted(daemon)
    assert final["received"] == 120 + client.probes
    assert final["published"] == final["received"]


def send_image(client: Client, source: str, image: np.ndarray, encoding: str) -> None:
    ok, data = cv2.imencode(".png" if encoding == "png" else ".jpg", image)
    assert ok
    client.send_parts(encode_frame(source, 0, data.tobytes(), encoding=encoding, meta={"n": 1}))


def test_still_images(
    start_daemon: Any,
    connect: Any,
    backend: dict[str, Any],
    astronaut: np.ndarray,
    coffee: np.ndarray,
    chelsea: np.ndarray,
) -> None:
    daemon = start_daemon(**backend)
    client: Client = connect(daemon)
    send_image(client, "astronaut", astronaut, "png")
    send_image(client, "coffee", coffee, "jpeg")
    send_image(client, "chelsea", chelsea, "png")
    results = {r["source"]: r for r in client.collect(3)}
    faces = results["astronaut"]["detections"]
    assert len(faces) == 1
    assert iou(faces[0]["box"], [177, 81, 95, 95]) >= 0.5
    assert len(faces[0]["keypoints"]) == 6 and faces[0]["label"] == "face"
    assert results["astronaut"]["meta"] == {"n": 1}
    assert (results["astronaut"]["width"], results["astronaut"]["height"]) == (512, 512)
    assert results["coffee"]["detections"] == []
    assert results["chelsea"]["detections"] == []
    assert daemon.stop() == 0


def test_bad_frames_fail_alone(
    start_daemon: Any, connect: Any, backend: dict[str, Any], astronaut: np.ndarray
) -> None:
    daemon = start_daemon(**backend)
    client: Client = connect(daemon)
    jpeg = cv2.imencode(".jpg", cv2.resize(astronaut, (640, 480)))[1].tobytes()
    garbage = np.random.default_rng(0).integers(0, 256, 100, dtype=np.uint8).tobytes()
    cases = [
        ("cut", [jpeg[:1000]], "decode_failed"),
        ("empty", [b""], "decode_failed"),
        ("garbage", [garbage], "decode_failed"),
    ]
    for seq, (source, payload, _) in enumerate(cases):
        header, _ = encode_frame(source, seq, b"", encoding="jpeg")
        client.send_parts([header, *payload])
        client.send_parts(encode_frame("good", seq, jpeg, encoding="jpeg"))
    client.send_parts([b"{not json", jpeg])
    client.send_parts(encode_frame("good", 3, jpeg, encoding="jpeg"))
    results = client.collect(8)
    assert len(results) == 8
    errors = [r for r in results if r["source"] != "good"]
    assert [e["error"]["reason"] for e in errors] == [c[2] for c in cases] + ["bad_header"]
    assert errors[-1]["source"] == "" and errors[-1]["error"]["detail"]
    good = [r for r in results if r["source"] == "good"]
    assert [r["seq"] for r in good] == [0, 1, 2, 3]
    assert all(r["error"] is None and len(r["detections"]) == 1 for r in good)
    assert daemon.stop() == 0
    final = assert_accounted(daemon)
    assert final["failed_by_reason"] == {"decode_failed": 3, "bad_header": 1}


def test_sigterm_mid_stream_drains_and_exits_zero(
    start_daemon: Any, connect: Any, backend: dict[str, Any]
) -> None:
    daemon = start_daemon(drain_timeout_s=10.0, **backend)
    client: Client = connect(daemon)
    errors: list[Exception] = []

    def send_forever() -> None:
        try:
            produce("carphone.mp4", daemon.ingress, loop=0, fps=200, send_timeout_s=1.0)
        except ClientError as exc:  # the daemon has gone away: the expected end
            errors.append(exc)

    sender = threading.Thread(target=send_forever)
    sender.start()
    assert len(client.collect(30)) == 30
    assert daemon.stop(timeout_s=30) == 0
    final = assert_accounted(daemon)
    # Drained: everything in flight published within drain_timeout_s, nothing dropped at
    # the stop (the daemon's own verdict, not a wall-clock bound on a loaded machine).
    assert final["drained"] is True and final["dropped_by_reason"].get("shutdown", 0) == 0
    assert final["received"] > 30 + client.probes
    assert daemon.logs[-1]["event"] == "stopped"
    sender.join(30)
    assert not sender.is_alive() and len(errors) == 1


def test_sigterm_takes_the_frames_already_queued_on_the_socket(
    start_daemon: Any, connect: Any, tmp_path: Path, assets: dict[str, Path]
) -> None:
    """Frames ZeroMQ has delivered but the ingress has not read yet (the admission queue
    was full) are processed at a stop, not dropped unseen with the socket."""
    settings = backend_settings("acl-sim-async", assets["blazeface_short_range"], tmp_path)
    daemon = start_daemon(
        **{**settings, "max_size": 1},
        daemon_extra="queue_size = 4",
        runtime_extra="[runtime.options.sim]\nexecute_delay_ms = 20",
    )
    client: Client = connect(daemon)
    frame = np.zeros((144, 176, 3), np.uint8)
    trackers = [
        client.push.send_multipart(
            encode_frame("queued", seq, frame, encoding="raw"), copy=False, track=True
        )
        for seq in range(60)
    ]
    for tracker in trackers:  # every message has left the client; few are executed yet
        tracker.wait(10)
    assert daemon.stop(timeout_s=30) == 0
    final = assert_accounted(daemon)
    assert final["received"] == 60 + client.probes
    assert final["published"] == final["received"]


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "streamer", *args], capture_output=True, text=True, timeout=120
    )


def test_check_prints_the_model_and_opens_no_socket(assets: dict[str, Path]) -> None:
    result = run_cli("check", "--config", str(ROOT / "configs" / "default.toml"))
    assert result.returncode == 0, result.stderr
    # normalize = "model": the graph takes the letterboxed uint8 pixels, NHWC
    assert "input input: [-1, 128, 128, 3] uint8" in result.stdout
    assert "output regressors: [-1, 896, 16] float32" in result.stdout
    assert result.stdout.splitlines()[-1].endswith("default.toml: ok")
    assert "preprocess_in_graph" in result.stderr  # logs beside the report, not in it
    assert "preprocess_in_graph" not in result.stdout


def test_check_rejects_bad_configs(tmp_path: Path) -> None:
    default = (ROOT / "configs" / "default.toml").read_text()
    cases = {
        "typo.toml": (default.replace("max_delay_ms", "max_delay"), "max_delay"),
        "missing.toml": (
            default.replace('asset = "blazeface_short_range"', 'path = "none.onnx"'),
            "no file",
        ),
        "kind.toml": (default.replace('kind = "blazeface"', 'kind = "yolo"'), "known: blazeface"),
        "param.toml": (default.replace("iou_threshold", "iou"), "iou"),
        "uri.toml": (default.replace("pull+bind:", "pul+bind:"), "socket type 'pul'"),
        "port.toml": (default.replace("127.0.0.1:5555", "127.0.0.1:99999"), "tcp port"),
        "host.toml": (
            default.replace("127.0.0.1:5555", "10.255.255.1:5555"),  # `run` fails its bind
            "the host is no address or interface of this machine",
        ),
        "asset.toml": (
            default.replace('"blazeface_short_range"', '"blazeface_shortrange"'),
            "unknown 'blazeface_shortrange'",
        ),
    }
    for name, (text, message) in cases.items():
        path = tmp_path / name
        path.write_text(text)
        result = run_cli("check", "--config", str(path))
        assert result.returncode == 2, (name, result.stdout, result.stderr)
        assert message in result.stderr, (name, result.stderr)
    invalid = tmp_path / "invalid.onnx"
    invalid.write_bytes(b"\x00" * 64)
    path = tmp_path / "invalid.toml"
    path.write_text(default.replace('asset = "blazeface_short_range"', f'path = "{invalid}"'))
    result = run_cli("check", "--config", str(path))
    assert result.returncode == 2 and "cannot load" in result.stderr


def test_a_config_run_cannot_use_is_one_json_event_where_the_log_is_json(tmp_path: Path) -> None:
    """A deploy that fails on its config says why in the log's own format: one
    ``start_failed`` JSON line on stdout (exit 2), or the text on stderr for a terminal."""
    bad = tmp_path / "bad.toml"
    bad.write_text("[daemon]\nbogus = 1\n")
    cases = (
        (bad, "daemon.bogus: unknown key"),
        (tmp_path / "none.toml", "cannot read config: No such file"),
        (tmp_path, "cannot read config: Is a directory"),
    )
    for path, why in cases:
        result = run_cli("run", "--config", str(path), "--log-format", "json")
        assert result.returncode == 2 and result.stderr == "", result.stderr
        (line,) = result.stdout.splitlines()
        event = json.loads(line)
        assert event["event"] == "start_failed" and event["level"] == "error"
        assert why in event["error"] and event["config"] == str(path)
    console = run_cli("run", "--config", str(bad), "--log-format", "console")
    assert console.returncode == 2 and console.stdout == ""
    assert console.stderr.startswith(f"error: {bad}: invalid configuration\n")


def test_port_in_use_fails_start(tmp_path: Path, start_daemon: Any) -> None:
    daemon = start_daemon()
    clash = tmp_path / "clash.toml"
    clash.write_text(daemon.config_path.read_text())
    result = subprocess.run(
        [sys.executable, "-m", "streamer", "run", "--config", str(clash)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 1
    assert "start_failed" in result.stdout and "Address already in use" in result.stdout
    assert str(clash) in result.stdout
    assert daemon.stop() == 0


@pytest.mark.slow
def test_readme_demo_runs_by_itself(tmp_path: Path, assets: dict[str, Path]) -> None:
    """`make demo`'s script on the default config and ports: it must stop by itself."""
    result = subprocess.run(
        [sys.executable, str(ROOT / "tools" / "demo.py"), "--out", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert len((tmp_path / "carphone.jsonl").read_text().splitlines()) == 121  # with eos
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["per_source"] == {"carphone": 120} and summary["out_of_order"] == 0
    assert (tmp_path / "carphone_annotated.mp4").stat().st_size > 0
    assert "seq=119" in result.stdout

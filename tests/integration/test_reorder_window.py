"""The pipeline's reorder window against what its chain can have in flight."""

from __future__ import annotations

from pathlib import Path

from structlog.testing import capture_logs

from streamer.config import RuntimeConfig, load_config
from streamer.pipeline import Pipeline, reorder_timeout_s
from streamer.runtime import open_backend
from streamer.scheduling.replica import RETRY_WAIT_S

ROOT = Path(__file__).resolve().parents[2]


def load_with(tmp_path: Path, edit: tuple[str, str]) -> tuple[Pipeline, list[dict[str, object]]]:
    path = tmp_path / "default.toml"
    path.write_text((ROOT / "configs" / "default.toml").read_text().replace(*edit))
    with capture_logs() as logs:
        pipeline = Pipeline.load(load_config(path))
    pipeline.close()
    return pipeline, logs


def test_the_window_follows_the_replicas_and_a_small_one_is_logged(
    assets: dict[str, Path], tmp_path: Path
) -> None:
    deep, logs = load_with(tmp_path, ("max_in_flight = 2 ", "max_in_flight = 300 "))
    assert deep.reorder.window == 64 + (2 * (300 + 2) + 1) * 8  # above the 4096 floor
    assert not [e for e in logs if e["event"] == "reorder_window_small"]
    small, logs = load_with(tmp_path, ("# reorder_window = 256 ", "reorder_window = 8 "))
    assert small.reorder.window == 8
    (warning,) = [e for e in logs if e["event"] == "reorder_window_small"]
    assert (warning["reorder_window"], warning["frames_in_flight"]) == (8, 136)


def test_the_reorder_timeout_outlasts_the_backend_s_result_timeout(tmp_path: Path) -> None:
    """On ACL a lost batch is given up after result_timeout_ms (10 s): a 1 s reorder
    timeout published its frames' error results out of order, after later frames and after
    the source's end of stream. It then runs again on another replica, where the same may
    happen: result_timeout_ms + 1 s published the retried results out of order. The base is
    half the stall timeout: 1 s published a chain's results out of order, as frames with no
    detection left after the first stage, ahead of earlier ones still in the next stages;
    held results must leave before they read as a stall."""
    config = load_config(ROOT / "configs" / "default.toml")
    base_s = config.daemon.stall_timeout_s / 2
    with open_backend(config.runtime) as onnx:
        assert reorder_timeout_s(config, onnx) == base_s == 15.0
    acl = RuntimeConfig(backend="acl-sim", options={"result_timeout_ms": 2000})
    with open_backend(acl) as simulated:
        assert reorder_timeout_s(config, simulated) == base_s + 4 * 2.0 + RETRY_WAIT_S
        path = tmp_path / "default.toml"
        explicit = (ROOT / "configs" / "default.toml").read_text()
        path.write_text(explicit.replace("# reorder_timeout_s = 15.0 ", "reorder_timeout_s = 0.5 "))
        assert reorder_timeout_s(load_config(path), simulated) == 0.5

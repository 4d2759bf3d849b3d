"""What a reload hands back: a long-running daemon reloaded on every config change (SIGHUP)
must not keep its retired chains' models, replicas or sessions alive."""

from __future__ import annotations

import gc
import re
import threading
import weakref
from pathlib import Path

import onnxruntime as ort
import pytest

from streamer.bench.bench_config import free_port
from streamer.config import Config, load_config
from streamer.pipeline import Pipeline
from streamer.runtime.base import QueueModel

pytestmark = pytest.mark.timeout(120)

ROOT = Path(__file__).resolve().parents[2]


def short_and_full_range(tmp_path: Path) -> list[Config]:
    """The default config on free ports, with the full-range model, then the short-range."""
    text = (ROOT / "configs" / "default.toml").read_text()
    text = text.replace('"127.0.0.1:9555"', '""')
    text = re.sub(r"127\.0\.0\.1:5555\b", f"127.0.0.1:{free_port()}", text)
    text = re.sub(r"127\.0\.0\.1:5556\b", f"127.0.0.1:{free_port()}", text)
    configs = []
    for asset in ("blazeface_full_range", "blazeface_short_range"):
        path = tmp_path / f"{asset}.toml"
        path.write_text(text.replace('"blazeface_short_range"', f'"{asset}"'))
        configs.append(load_config(path))
    return configs


def live_sessions() -> int:
    """onnxruntime sessions the interpreter holds, unreachable ones awaiting collection
    included."""
    return sum(isinstance(o, ort.InferenceSession) for o in gc.get_objects())


def test_reloads_release_every_retired_chain(tmp_path: Path) -> None:
    """Six reloads alternate the short- and full-range models. Each retired model's session
    is freed as its chain is closed, without waiting for Python's cycle collector (a daemon
    reloaded under load piled up hundreds of MB of sessions between two full collections);
    once collected, no retired model is referenced any more (nor, then, its chain or
    stage), and the chain in service is the last one loaded."""
    configs = short_and_full_range(tmp_path)
    pipeline = Pipeline.load(configs[1])
    try:
        pipeline.start()
        in_service = live_sessions()
        retired: list[weakref.ref[QueueModel]] = []
        gc.disable()
        try:
            for turn in range(6):
                retired += [weakref.ref(model) for model in pipeline.models]
                assert pipeline.reload(configs[turn % 2], threading.Event(), None)
            assert live_sessions() == in_service
        finally:
            gc.enable()
        gc.collect()
        assert [ref() for ref in retired if ref() is not None] == []
        assert len(pipeline.models) == 1
        assert pipeline.config.models[0].asset == "blazeface_short_range"
    finally:
        pipeline.stop(5.0)
        pipeline.close()


def test_a_reload_sizes_the_prepare_ahead_window_for_its_first_stage(tmp_path: Path) -> None:
    """drop_oldest / latest frames prepared ahead: two batches of the chain's first stage and
    two per decode worker, again after a reload that changes the batch size; the workers
    are the pool's, which keeps its size until a restart, whatever the reload's
    decode_workers."""
    short_and_full_range(tmp_path)
    text = (tmp_path / "blazeface_short_range.toml").read_text()
    text = text.replace("decode_workers = 0", "decode_workers = 3")
    eight = tmp_path / "eight.toml"
    eight.write_text(text)
    four = tmp_path / "four.toml"
    four.write_text(
        text.replace("max_size = 8 ", "max_size = 4 ").replace(
            "decode_workers = 3", "decode_workers = 1"
        )
    )
    pipeline = Pipeline.load(load_config(eight))
    try:
        pipeline.start()
        assert pipeline._inbox.prepare_ahead == 2 * (3 + 8)
        # False: its decode_workers waits for a restart (reload_needs_restart); models swapped.
        assert not pipeline.reload(load_config(four), threading.Event(), None)
        assert pipeline.config.models[0].batch.max_size == 4
        assert pipeline._inbox.prepare_ahead == 2 * (3 + 4)
    finally:
        pipeline.stop(5.0)
        pipeline.close()

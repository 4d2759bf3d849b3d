"""``bench_config``: the config a benchmark's daemon runs, written under ``--out``."""

from __future__ import annotations

from pathlib import Path

from streamer.bench.bench_config import Ports, bench_config
from streamer.config import load_config
from streamer.config_writer import write_config

ROOT = Path(__file__).resolve().parents[2]


def test_a_relative_model_path_still_names_the_base_configs_model_from_out(
    tmp_path: Path,
) -> None:
    """The daemon's config is written under ``--out`` and read back from there: a model's
    relative ``path`` (relative to the config's folder, README "Configuration") was taken
    from ``--out`` instead, and ``streamer bench --config`` failed with "no file at
    OUT/models/face.onnx"."""
    (tmp_path / "etc").mkdir()
    shipped = (ROOT / "configs" / "default.toml").read_text()
    relative = shipped.replace('asset = "blazeface_short_range"', 'path = "models/face.onnx"')
    (tmp_path / "etc" / "c.toml").write_text(relative)
    base = load_config(tmp_path / "etc" / "c.toml")
    out = tmp_path / "out"
    out.mkdir()
    config = bench_config(
        base,
        backend="onnxruntime",
        max_size=4,
        ports=Ports.free(),
        models_dir=out / "models",
        batch_sizes=(1, 2, 4),
    )
    written = write_config(config, out / "config-daemon.toml")
    expected = tmp_path.resolve() / "etc" / "models" / "face.onnx"
    assert base.model_path(base.models[0]) == expected
    assert written.model_path(written.models[0]) == expected

"""What ``streamer bench`` plans before it starts anything: its daemons and --out."""

from __future__ import annotations

from pathlib import Path

import pytest

from streamer.bench import runner
from streamer.errors import ConfigError

ROOT = Path(__file__).resolve().parents[2]
CONFIG = ROOT / "configs" / "default.toml"


def test_a_max_size_given_twice_plans_one_daemon(tmp_path: Path) -> None:
    """Two daemons named alike shared one config file (the second one's ports), so the
    first could not bind its own and the run failed."""
    options = runner.BenchOptions(CONFIG, max_sizes=(4, 8, 4), out_dir=tmp_path)
    plan = runner._plan(options)
    assert plan.max_sizes == (4, 8)
    modes = [daemon.mode for daemon in plan.daemons]
    assert len(modes) == len(set(modes)) == 3  # and the device-side one
    assert len({daemon.path for daemon in plan.daemons}) == 3


def test_an_out_folder_that_cannot_be_made_is_a_usage_error(tmp_path: Path) -> None:
    (tmp_path / "a-file").write_text("")
    options = runner.BenchOptions(CONFIG, out_dir=tmp_path / "a-file" / "out")
    with pytest.raises(ConfigError, match="--out .*a-file/out: Not a directory"):
        runner._plan(options)

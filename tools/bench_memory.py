"""Resident memory of onnxruntime under varying batch sizes, with and without gears.

Runs BlazeFace (short range) through the onnxruntime backend on ``--batches`` batches of
random sizes 1..``--max-size`` twice, in two fresh processes: once cut into the default gears
(powers of two, what the daemon does) and once at the exact sizes. Reports the resident set
size (RSS, MiB) after a warm-up and at the end, and the growth in percent. Every distinct input
shape makes onnxruntime keep another set of buffers, so without gears memory creeps up.

Usage::

    python tools/bench_memory.py [--batches 2000] [--max-size 16] [--json out.json]
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import click
import numpy as np

from streamer.assets import asset_path
from streamer.assets.catalog import ASSETS
from streamer.config import BatchConfig, RuntimeConfig
from streamer.runtime import ModelSpec, open_backend
from streamer.scheduling.policy import BatchPolicy


def _rss_mib() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS in /proc/self/status")


def _measure(batches: int, max_size: int, gears: bool, warmup: int) -> dict[str, float]:
    model_file = asset_path(next(a for a in ASSETS if a.name == "blazeface_short_range"))
    rng = np.random.default_rng(0)
    sizes = rng.integers(1, max_size + 1, batches)
    frame = rng.uniform(-1, 1, (3, 128, 128)).astype(np.float32)
    with open_backend(RuntimeConfig(options={"intra_op_threads": 1})) as backend:
        with backend.load(ModelSpec("face", model_file, max_in_flight=1)) as model:
            policy = BatchPolicy.for_model(BatchConfig(max_size=max_size), model.info)
            if not gears:
                policy = BatchPolicy(max_size, 0, ())
            after_warmup = 0.0
            for index, size in enumerate(sizes):
                for execution in policy.plan(int(size)):
                    model.enqueue([np.repeat(frame[None], execution.rows, axis=0)])
                    assert model.dequeue(60_000) is not None
                if index + 1 == warmup:
                    after_warmup = _rss_mib()
            end = _rss_mib()
    return {"warm_mib": after_warmup, "end_mib": end, "growth_pct": 100 * (end / after_warmup - 1)}


@click.command()
@click.option("--batches", default=2000, show_default=True)
@click.option("--max-size", default=16, show_default=True)
@click.option("--warmup", default=200, show_default=True, help="batches before the baseline")
@click.option("--json", "json_path", type=click.Path(dir_okay=False, path_type=Path))
@click.option("--child", type=click.Choice(["gears", "exact"]), hidden=True)
def main(
    batches: int, max_size: int, warmup: int, json_path: Path | None, child: str | None
) -> None:
    """Measure RSS growth with gears and with exact batch sizes, each in a fresh process."""
    if child is not None:
        click.echo(json.dumps(_measure(batches, max_size, child == "gears", warmup)))
        return
    report = {}
    for mode in ("gears", "exact"):
        args = [sys.executable, __file__, "--batches", str(batches), "--max-size", str(max_size)]
        out = subprocess.run(
            [*args, "--warmup", str(warmup), "--child", mode],
            check=True,
            capture_output=True,
            text=True,
        ).stdout
        report[mode] = json.loads(out.strip().splitlines()[-1])
    click.echo(f"{'mode':6} {'RSS after warm-up':>18} {'RSS at end':>11} {'growth':>8}")
    for mode, row in report.items():
        click.echo(
            f"{mode:6} {row['warm_mib']:15.1f} MiB {row['end_mib']:7.1f} MiB"
            f" {row['growth_pct']:7.2f}%"
        )
    if json_path is not None:
        json_path.write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()

"""The report as a PNG: throughput bars and latency CDFs, one column per input.

Needs matplotlib (``pip install 'streamer[bench]'``); :func:`plot_available` says whether
it is installed, and the benchmark skips the plot, saying so, when it is not.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

import numpy as np

from streamer.bench.modes import DAEMON, HALF_RATE, MANY_SOURCES_MODE, NAIVE, SERIAL
from streamer.bench.report import BenchReport, InputReport
from streamer.bench.stats import CDF_POINTS

__all__ = ["INSTALL_HINT", "plot_available", "write_plot"]

INSTALL_HINT = "pip install 'streamer[bench]'"
_LATENCY_MODES = (SERIAL, NAIVE, DAEMON, HALF_RATE, MANY_SOURCES_MODE)
_TARGET_RATIO = 0.85


def plot_available() -> bool:
    """Whether matplotlib can be imported."""
    return importlib.util.find_spec("matplotlib") is not None


def write_plot(report: BenchReport, path: Path) -> None:
    """Draw ``report`` into the PNG file ``path``.

    Raises:
        ImportError: matplotlib is not installed (see :data:`INSTALL_HINT`).
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    columns = len(report.inputs)
    figure, axes = plt.subplots(2, columns, figsize=(7 * columns, 10), squeeze=False)
    for column, item in enumerate(report.inputs):
        _throughput(axes[0][column], item)
        _latency(axes[1][column], item)
    figure.suptitle(
        f"streamer bench ({report.settings['backend']}, {report.settings['cores']} cores)"
    )
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)


def _throughput(axis: Any, item: InputReport) -> None:
    labels = ["limit", *item.runs]
    values = [item.limit.fps, *(run.fps for run in item.runs.values())]
    colors = ["tab:gray" if not label.startswith("daemon") else "tab:blue" for label in labels]
    positions = np.arange(len(labels))
    axis.bar(positions, values, color=colors)
    axis.axhline(_TARGET_RATIO * item.limit.fps, color="tab:red", linestyle="--", linewidth=1)
    axis.set_xticks(positions, labels, rotation=30, ha="right", fontsize=8)
    axis.set_ylabel("frames/s")
    axis.set_title(f"{item.name}: throughput (dashed: {_TARGET_RATIO} x limit)")


def _latency(axis: Any, item: InputReport) -> None:
    quantiles = np.linspace(0, 1, CDF_POINTS)
    for mode in _LATENCY_MODES:
        run = item.runs.get(mode)
        if run is not None and run.latency is not None:
            axis.plot(run.latency.cdf_ms, quantiles, label=mode)
    axis.set_xscale("log")
    axis.set_xlabel("latency, ms (log)")
    axis.set_ylabel("fraction of frames")
    axis.set_title(f"{item.name}: latency CDF")
    axis.grid(True, which="both", alpha=0.3)
    axis.legend(fontsize=8)

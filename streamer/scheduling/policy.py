"""Batch sizing: how many frames a batch takes and the executions that run them.

A model executes only certain batch sizes, its *gears*: the one size of a static-batch
model, the gear list of an ACL dynamic-batch model (``acl.mdl.get_dynamic_batch``), or for an
onnxruntime model with a symbolic batch dim the configured ``gears`` (by default the powers
of two up to ``max_size``, so onnxruntime sees a bounded set of shapes and its memory stays
flat). A batch of n frames is cut into executions by the ``strategy`` (the names of MindX
SDK's ``dynamicStrategy``):

- ``upper`` (default): the smallest gear >= n, padded; beyond the largest gear, full
  executions at the largest gear and the rest as above. Fewest executions.
- ``lower``: the largest gear <= n, repeated; a remainder below the smallest gear is padded
  up to it. Least padding.
- ``nearest``: the gear closest to n (ties go up), then the same for what is left.

Padding rows are zeros; their outputs are never read.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass
from typing import Literal

from streamer.config import BatchConfig
from streamer.runtime.base import ModelInfo

__all__ = ["BatchPolicy", "Execution", "Strategy", "default_gears"]

Strategy = Literal["upper", "nearest", "lower"]


@dataclass(frozen=True, slots=True)
class Execution:
    """One model execution: ``frames`` real rows padded to ``rows`` (a gear)."""

    frames: int
    rows: int


def default_gears(max_size: int) -> tuple[int, ...]:
    """Powers of two below ``max_size``, and ``max_size`` itself: (1, 2, 4, 8) for 8."""
    gears = {1 << i for i in range(max_size.bit_length()) if 1 << i < max_size}
    return tuple(sorted(gears | {max_size}))


@dataclass(frozen=True)
class BatchPolicy:
    """When to flush a batch and how to run it.

    Attributes:
        max_size: frames per batch at most (a batch may take several executions).
        max_delay_ns: how long the oldest frame (since it was received) may wait, ns.
        gears: batch sizes the model executes, ascending; empty: any size, no padding.
        strategy: how a batch is cut into executions (module docstring).
    """

    max_size: int
    max_delay_ns: int
    gears: tuple[int, ...]
    strategy: Strategy = "upper"

    @classmethod
    def for_model(cls, config: BatchConfig, info: ModelInfo) -> BatchPolicy:
        """The policy for ``info``: its own gears, or default ones for a free batch dim."""
        gears = tuple(sorted(info.batch_gears))
        if not gears and info.dynamic_batch:
            gears = default_gears(config.max_size)
        return cls(config.max_size, int(config.max_delay_ms * 1e6), gears, config.strategy)

    @property
    def executed_sizes(self) -> tuple[int, ...]:
        """Every batch size its executions can have: the gears, or 1 to ``max_size``."""
        return self.gears or tuple(range(1, self.max_size + 1))

    @property
    def largest_execution(self) -> int:
        """The most rows one execution has: the first of a full batch (``max_size`` frames;
        a gear never shrinks as the frames left grow, so no smaller batch has a bigger one)."""
        return max(execution.rows for execution in self.plan(self.max_size))

    def plan(self, frames: int) -> list[Execution]:
        """The executions for a batch of ``frames`` frames (1 <= frames)."""
        if not self.gears:
            return [Execution(frames, frames)]
        plan: list[Execution] = []
        while frames > 0:
            rows = self._gear_for(frames)
            plan.append(Execution(min(rows, frames), rows))
            frames -= rows
        return plan

    def _gear_for(self, frames: int) -> int:
        """The gear of the next execution when ``frames`` frames are left."""
        gears = self.gears
        if frames >= gears[-1]:
            return gears[-1]
        above = bisect.bisect_left(gears, frames)
        upper = gears[above]
        if upper == frames or self.strategy == "upper" or above == 0:
            return upper
        lower = gears[above - 1]
        if self.strategy == "lower" or frames - lower < upper - frames:
            return lower
        return upper

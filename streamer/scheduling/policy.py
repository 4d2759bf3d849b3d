"""Batch sizing: how many frames a batch takes and the size the model executes."""

from __future__ import annotations

import bisect
from dataclasses import dataclass

from streamer.config import BatchConfig
from streamer.errors import ConfigError
from streamer.runtime.base import ModelInfo

__all__ = ["BatchPolicy"]


@dataclass(frozen=True)
class BatchPolicy:
    """When to flush a batch and how to pad it.

    Attributes:
        max_size: frames per batch at most.
        max_delay_ns: how long the oldest frame (since it was received) may wait, ns.
        gears: batch sizes the model executes (ascending); a batch of n frames is padded to
            the smallest gear >= n (the ``upper`` strategy of MindX's ``dynamicStrategy``).
            Empty: the model takes any size and batches are not padded.
    """

    max_size: int
    max_delay_ns: int
    gears: tuple[int, ...]

    @classmethod
    def for_model(cls, config: BatchConfig, info: ModelInfo, where: str) -> BatchPolicy:
        """Fit ``config`` to what the model accepts.

        A static batch B (gears ``(B,)``) pads every batch to B; ``max_size`` above the
        largest gear is an error, since no execution could take such a batch.

        Raises:
            ConfigError: ``max_size`` exceeds the largest batch the model executes.
        """
        gears = tuple(sorted(info.batch_gears))
        if gears and config.max_size > gears[-1]:
            raise ConfigError(
                f"{where}.batch.max_size = {config.max_size}, but model {info.name!r} executes "
                f"batches of at most {gears[-1]} (gears {list(gears)}); lower max_size or "
                "export the model with a dynamic batch"
            )
        return cls(config.max_size, int(config.max_delay_ms * 1e6), gears)

    def rows_for(self, frames: int) -> int:
        """The batch size to execute for ``frames`` frames (1 <= frames <= max_size)."""
        if not self.gears:
            return frames
        return self.gears[bisect.bisect_left(self.gears, frames)]

"""The ``letterbox`` keys a backend reads from a ``[models.preprocess]`` table to take over
its normalisation: into the graph (onnxruntime, ``normalize = "model"``) or into dynamic AIPP
(ACL, ``normalize = "device"``, ``aipp = "dynamic"``)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, ValidationError

from streamer.config import PluginConfig, validate_strict
from streamer.config_errors import error_lines
from streamer.errors import ConfigError
from streamer.runtime.graph_preprocess import InputNormalization, per_channel_mean_std

__all__ = ["LetterboxKeys", "letterbox_keys"]


class LetterboxKeys(BaseModel):
    """The keys the backends need; the letterbox plug-in validates the whole table (same
    defaults as :class:`streamer.vision.preprocess.LetterboxParams`)."""

    model_config = ConfigDict(extra="ignore", frozen=True, allow_inf_nan=False)

    normalize: Literal["host", "model", "device"] = "host"
    aipp: Literal["static", "dynamic"] = "static"
    color: Literal["rgb", "bgr"] = "rgb"
    mean: float | tuple[float, float, float] = 0.5
    std: float | tuple[float, float, float] = 0.5
    layout: Literal["NCHW", "NHWC"] = "NCHW"
    size: tuple[int, int] | None = None

    def normalization(self) -> InputNormalization:
        """``(x / 255 - mean) / std`` with the channel swap and layout these keys ask for.

        Raises:
            ConfigError: see :func:`per_channel_mean_std`.
        """
        mean, std = per_channel_mean_std(self.mean, self.std, "preprocess.")
        return InputNormalization.from_mean_std(mean, std, self.color == "rgb", self.layout)


def letterbox_keys(table: PluginConfig | None) -> LetterboxKeys | None:
    """The keys of a ``letterbox`` table; None for no table or another kind.

    Raises:
        ConfigError: a key is invalid, named as ``preprocess.<key>``.
    """
    if table is None or table.kind != "letterbox":
        return None
    try:
        return validate_strict(LetterboxKeys, table.params())
    except ValidationError as exc:
        raise ConfigError(error_lines(exc, LetterboxKeys, "preprocess")[0]) from exc

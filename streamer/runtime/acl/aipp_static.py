"""Static AIPP: the ``aipp_op`` config that ATC bakes into an ``.om`` (issue 9, item 1).

With static AIPP (ATC ``--insert_op_conf=face.aipp.cfg``) the model's image input becomes
uint8 NHWC pixels and the AI Core normalises them per channel before the first layer::

    out[c] = (in[c'] - mean_chn_c - min_chn_c) * var_reci_chn_c

where ``c'`` is ``c`` with R and B exchanged when ``rbuv_swap_switch`` is on (CANN ATC guide,
"AIPP配置" / ``aipp_conf.proto``). streamer's letterbox ``(x / 255 - mean) / std`` maps to
``mean_chn = 0``, ``min_chn = 255 · mean``, ``var_reci_chn = 1 / (255 · std)``; the daemon
sends the decoded BGR pixels, so an RGB model gets ``rbuv_swap_switch: true`` (no colour-space
conversion: ``csc_switch`` stays off, it converts YUV ↔ RGB). The letterbox borders are drawn
on the host (they vary per frame), so ``crop`` and ``padding`` stay off.

The combination rules with dynamic shapes are in :mod:`streamer.runtime.acl.aipp_rules`;
dynamic AIPP (parameters set per execution) in :mod:`streamer.runtime.acl.aipp_dynamic`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from streamer.errors import ConfigError
from streamer.runtime.graph_preprocess import InputNormalization

__all__ = [
    "MIN_CHN_RANGE",
    "VAR_RECI_LIMIT",
    "VAR_RECI_SMALLEST",
    "StaticAipp",
    "aipp_op_text",
    "checked_aipp_values",
]

VAR_RECI_LIMIT = 65504.0
"""The largest ``|var_reci_chn|`` AIPP takes, a float16 (RT ``aclmdlSetAIPPPixelVarReci``:
value range [-65504, 65504]; the static ``var_reci_chn_n`` is the same field)."""
VAR_RECI_SMALLEST = 2.0**-14
"""The smallest ``|var_reci_chn|`` kept to float16's precision (its smallest normal number,
about 6.1e-5); below it the value rounds coarsely, below 3e-8 to 0."""
MIN_CHN_RANGE = (0.0, 255.0)
"""The range of ``min_chn`` (RT ``aclmdlSetAIPPDtcPixelMin``: [0, 255]; the static
``min_chn_n`` is the same field)."""


def checked_aipp_values(
    norm: InputNormalization,
) -> tuple[tuple[float, float, float], tuple[float, float, float]]:
    """The normalisation's ``offset`` and ``scale`` as AIPP's ``min_chn`` and
    ``var_reci_chn``.

    Raises:
        ConfigError: an offset outside :data:`MIN_CHN_RANGE` (``mean`` outside 0..1), or a
            scale beyond :data:`VAR_RECI_LIMIT` (``std`` below 1 / (255 · 65504), about
            6e-8) or below :data:`VAR_RECI_SMALLEST` (``std`` above about 64).
    """
    low, high = MIN_CHN_RANGE
    if not all(low <= v <= high for v in norm.offset):
        raise ConfigError(
            f"preprocess.mean: AIPP would subtract 255 * mean = {list(norm.offset)}, outside its "
            f"min_chn range [{low:g}, {high:g}]"
        )
    worst = max(abs(v) for v in norm.scale)
    if worst > VAR_RECI_LIMIT:
        raise ConfigError(
            f"preprocess.std: AIPP would multiply by 1 / (255 * std) = {worst:.6g}, beyond "
            f"its var_reci_chn range of +-{VAR_RECI_LIMIT:g}"
        )
    least = min(abs(v) for v in norm.scale)
    if least < VAR_RECI_SMALLEST:
        raise ConfigError(
            f"preprocess.std: AIPP would multiply by 1 / (255 * std) = {least:.6g}, below "
            f"{VAR_RECI_SMALLEST:.4g}, where its float16 var_reci_chn loses precision"
        )
    return norm.offset, norm.scale


class StaticAipp(BaseModel):
    """One ``aipp_op`` block (static mode), keys as in ATC's AIPP config file.

    Attributes:
        input_format: pixel format of the input; only ``RGB888_U8`` (interleaved HWC uint8).
        src_image_size_w, src_image_size_h: input image size, pixels; 0 = the model's (and
            required with dynamic resolution).
        crop, load_start_pos_w, load_start_pos_h, crop_size_w, crop_size_h: crop window,
            pixels.
        padding, left/right/top/bottom_padding_size: borders added after the crop, pixels.
        csc_switch: colour-space conversion (YUV ↔ RGB); off for RGB888 input.
        rbuv_swap_switch: exchange the R and B channels of the input.
        mean_chn_0..2: per-channel mean, uint8 levels; min_chn_0..2: per-channel minimum,
            float levels; var_reci_chn_0..2: per-channel variance reciprocal (multiplier).
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    aipp_mode: Literal["static"] = "static"
    related_input_rank: int = Field(0, ge=0)
    input_format: Literal["RGB888_U8"] = "RGB888_U8"
    src_image_size_w: int = Field(0, ge=0)
    src_image_size_h: int = Field(0, ge=0)
    crop: bool = False
    load_start_pos_w: int = Field(0, ge=0)
    load_start_pos_h: int = Field(0, ge=0)
    crop_size_w: int = Field(0, ge=0)
    crop_size_h: int = Field(0, ge=0)
    padding: bool = False
    left_padding_size: int = Field(0, ge=0)
    right_padding_size: int = Field(0, ge=0)
    top_padding_size: int = Field(0, ge=0)
    bottom_padding_size: int = Field(0, ge=0)
    csc_switch: bool = False
    rbuv_swap_switch: bool = False
    mean_chn_0: int = Field(0, ge=0, le=255)
    mean_chn_1: int = Field(0, ge=0, le=255)
    mean_chn_2: int = Field(0, ge=0, le=255)
    min_chn_0: float = 0.0
    min_chn_1: float = 0.0
    min_chn_2: float = 0.0
    var_reci_chn_0: float = 1.0
    var_reci_chn_1: float = 1.0
    var_reci_chn_2: float = 1.0

    @classmethod
    def from_normalization(cls, norm: InputNormalization, height: int, width: int) -> StaticAipp:
        """The AIPP that computes ``norm`` on ``height`` × ``width`` pixels (0 × 0 for a
        dynamic-resolution model): ``min_chn = offset``, ``var_reci_chn = scale``."""
        o, s = checked_aipp_values(norm)
        return cls(
            src_image_size_w=width,
            src_image_size_h=height,
            rbuv_swap_switch=norm.swap_rb,
            min_chn_0=o[0],
            min_chn_1=o[1],
            min_chn_2=o[2],
            var_reci_chn_0=s[0],
            var_reci_chn_1=s[1],
            var_reci_chn_2=s[2],
        )

    def normalization(self, layout: Literal["NCHW", "NHWC"]) -> InputNormalization:
        """The same arithmetic as an :class:`InputNormalization` for a ``layout`` model."""
        means = (self.mean_chn_0, self.mean_chn_1, self.mean_chn_2)
        mins = (self.min_chn_0, self.min_chn_1, self.min_chn_2)
        offset = tuple(float(m + n) for m, n in zip(means, mins, strict=True))
        scale = (self.var_reci_chn_0, self.var_reci_chn_1, self.var_reci_chn_2)
        return InputNormalization(offset, scale, self.rbuv_swap_switch, layout)  # type: ignore[arg-type]

    def to_config(self) -> str:
        """The ATC ``--insert_op_conf`` file text: one ``aipp_op { key : value }`` block."""
        return aipp_op_text(self.model_dump())


def aipp_op_text(values: Mapping[str, Any]) -> str:
    """One ``aipp_op { key : value }`` block of an ATC AIPP config file, booleans in lower
    case, keys in the order given."""
    lines = ["aipp_op {"]
    for key, value in values.items():
        text = str(value).lower() if isinstance(value, bool) else str(value)
        lines.append(f"    {key} : {text}")
    lines.append("}")
    return "\n".join(lines) + "\n"

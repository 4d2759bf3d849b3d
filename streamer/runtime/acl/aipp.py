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

The combination rules with dynamic shapes (seeds "动态Batch/动态分辨率/动态维度", 须知):
    - *static AIPP with dynamic resolution*: no crop and no padding, and ``src_image_size_w``
      = ``src_image_size_h`` = 0 (the image size is the gear's).
    - *AIPP with dynamic dims*: never (static or dynamic AIPP).
:func:`check_static_aipp` raises :class:`AippRuleError` naming the rule broken; the simulator
calls it when it loads a manifest with an ``aipp`` section, as ATC refuses such a build.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from streamer.runtime.graph_preprocess import InputNormalization

__all__ = ["AippRuleError", "StaticAipp", "check_static_aipp"]

RULES_PAGE = 'seeds "动态Batch/动态分辨率/动态维度"'


class AippRuleError(ValueError):
    """An AIPP setting breaks a documented combination rule; the message names the rule."""


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
        o, s = norm.offset, norm.scale
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
        lines = ["aipp_op {"]
        for key, value in self.model_dump().items():
            text = str(value).lower() if isinstance(value, bool) else str(value)
            lines.append(f"    {key} : {text}")
        lines.append("}")
        return "\n".join(lines) + "\n"


def check_static_aipp(aipp: StaticAipp, dynamic: Literal["batch", "hw", "dims"] | None) -> None:
    """Refuse static AIPP combined with a dynamic option the docs forbid it with.

    Args:
        aipp: the model's static AIPP.
        dynamic: the model's dynamic option (ATC ``--dynamic_batch_size`` = ``batch``,
            ``--dynamic_image_size`` = ``hw``, ``--dynamic_dims`` = ``dims``), or None.

    Raises:
        AippRuleError: the message names the rule and the settings at fault.
    """
    if dynamic == "dims":
        raise AippRuleError(
            f"rule 'AIPP never with dynamic dims': static AIPP and dynamic_dims cannot be "
            f"used on one model ({RULES_PAGE}: AIPP与动态维度不能同时使用)"
        )
    if dynamic != "hw":
        return
    if aipp.crop or aipp.padding:
        raise AippRuleError(
            f"rule 'static AIPP with dynamic resolution: no crop or padding': crop = "
            f"{aipp.crop}, padding = {aipp.padding} with dynamic_image_size ({RULES_PAGE})"
        )
    if aipp.src_image_size_w or aipp.src_image_size_h:
        raise AippRuleError(
            f"rule 'static AIPP with dynamic resolution: source size 0': src_image_size_w = "
            f"{aipp.src_image_size_w}, src_image_size_h = {aipp.src_image_size_h} with "
            f"dynamic_image_size; set both to 0 ({RULES_PAGE})"
        )

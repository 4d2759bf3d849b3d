"""Dynamic AIPP (issue 9, item 2): the ATC config, the parameter values, and the plan.

With dynamic AIPP, ATC inserts an AIPP operator whose parameters are not baked in: the
``aipp_op`` block only says ``aipp_mode: dynamic`` and how large a source image may be
(``max_src_image_size``), and the ``.om`` gets one more input, ``ascend_dynamic_aipp_data``
(:data:`~streamer.runtime.acl.constants.ACL_DYNAMIC_AIPP_NAME`), that carries them. Before each
execution the application fills an ``aclmdlAIPP`` (``acl.mdl.create_aipp(batch_size)`` and the
``acl.mdl.set_aipp_*`` calls) and writes it into that input of the batch's input dataset with
``acl.mdl.set_input_aipp`` (RT ``python/docs/zh/api_ref/ge/function-set_input_aipp.md``; ATC
guide "AIPP配置", 配置文件模板: ``max_src_image_size`` ≥ N · W · H · 3 for ``RGB888_U8``, N
the largest batch gear).

The arithmetic is the static one (:mod:`streamer.runtime.acl.aipp_static`): ``out[c] =
(in[c'] - mean_chn_c - min_chn_c) · var_reci_chn_c``, set per batch index. streamer sets the
letterbox's normalisation on every batch index: ``mean_chn = 0``, ``min_chn = 255 · mean``,
``var_reci_chn = 1 / (255 · std)``, R/B swapped for an RGB model, no colour-space
conversion, and no crop, resize or padding (the letterbox is drawn on the host).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from streamer.runtime.acl.aipp_static import aipp_op_text, checked_aipp_values
from streamer.runtime.acl.gears import GearKind
from streamer.runtime.graph_preprocess import InputNormalization

__all__ = ["DynamicAippConfig", "DynamicAippParams", "DynamicAippPlan", "RGB_CHANNELS"]

RGB_CHANNELS = 3
"""Bytes per pixel of ``RGB888_U8``."""

Channels = tuple[float, float, float, float]


class DynamicAippConfig(BaseModel):
    """One ``aipp_op`` block in dynamic mode, keys as in ATC's AIPP config file (the keys
    marked "动态AIPP需设置" in its template; the others are set at run time).

    Attributes:
        related_input_rank: which model input gets the AIPP (0 = the first).
        max_src_image_size: bytes of the largest source input one execution takes: at least
            N · W · H · 3 for ``RGB888_U8`` (N the largest batch gear, W × H the largest
            resolution); ATC sizes the image input's memory by it.
        support_rotation: reserved by ATC, off.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    aipp_mode: Literal["dynamic"]
    related_input_rank: int = Field(0, ge=0)
    max_src_image_size: int = Field(gt=0)
    support_rotation: bool = False

    @classmethod
    def for_images(cls, batch: int, height: int, width: int) -> DynamicAippConfig:
        """The config for up to ``batch`` RGB888 images of ``height`` × ``width`` pixels."""
        return cls(aipp_mode="dynamic", max_src_image_size=batch * height * width * RGB_CHANNELS)

    def to_config(self) -> str:
        """The ATC ``--insert_op_conf`` file text: one ``aipp_op { key : value }`` block."""
        return aipp_op_text(self.model_dump())


@dataclass(frozen=True)
class DynamicAippParams:
    """The values streamer sets on an ``aclmdlAIPP``, the same for every batch index.

    The input format is always ``RGB888_U8`` and colour-space conversion is off.

    Attributes:
        source_size: (height, width) of the source images, pixels
            (``set_aipp_src_image_size`` takes width first).
        swap_rb: exchange R and B (``set_aipp_rbuv_swap_switch``).
        mean_chn: per channel, uint8 levels (``set_aipp_dtc_pixel_mean``; 4 channels, the
            fourth unused).
        min_chn: per channel, float levels (``set_aipp_dtc_pixel_min``).
        var_reci_chn: per channel multiplier (``set_aipp_pixel_var_reci``).
    """

    source_size: tuple[int, int]
    swap_rb: bool
    mean_chn: tuple[int, int, int, int]
    min_chn: Channels
    var_reci_chn: Channels

    @classmethod
    def from_normalization(
        cls, norm: InputNormalization, source_size: tuple[int, int]
    ) -> DynamicAippParams:
        """The parameters that compute ``norm`` on images of ``source_size`` (height, width):
        ``min_chn = offset``, ``var_reci_chn = scale``; the unused fourth channel gets the
        defaults 0 and 1.0 (RT ``function-set_aipp_dtc_pixel_min.md``,
        ``function-set_aipp_pixel_var_reci.md``)."""
        o, s = checked_aipp_values(norm)
        return cls(source_size, norm.swap_rb, (0, 0, 0, 0), (*o, 0.0), (*s, 1.0))


@dataclass(frozen=True)
class DynamicAippPlan:
    """What streamer will set through dynamic AIPP on one model, with the model facts the
    combination rules (:func:`~streamer.runtime.acl.aipp_rules.check_dynamic_aipp`) are about.

    Attributes:
        model: the model (stage) name, for messages.
        kind: the model's dynamic option.
        batch_size: the ``aclmdlAIPP`` batch size (``acl.mdl.create_aipp``).
        largest_batch: the model's largest batch: its largest batch gear, or its static N.
        params: the values to set; ``params.source_size`` is the source image size.
        largest_resolution: (height, width) of the largest resolution gear, or the model's
            static H × W, pixels.
        input_bytes: the image input's memory (``get_input_size_by_index``), bytes.
        crop, resize, padding: whether the parameters switch these on.
    """

    model: str
    kind: GearKind
    batch_size: int
    largest_batch: int
    params: DynamicAippParams
    largest_resolution: tuple[int, int]
    input_bytes: int
    crop: bool = False
    resize: bool = False
    padding: bool = False

    @property
    def largest_input_bytes(self) -> int:
        """Bytes of the largest batch of source images at the largest resolution."""
        height, width = self.largest_resolution
        return self.largest_batch * height * width * RGB_CHANNELS

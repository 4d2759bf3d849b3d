"""The MTCNN item-stage key a backend reads from a ``[models.postprocess]`` table to take over
the nets' input normalisation, and that normalisation.

MTCNN's nets (``mtcnn_pnet``, ``mtcnn_rnet``, ``mtcnn_onet``, and ``mtcnn_classify`` on R-Net
or O-Net) take RGB ``(x - 127.5) / 128`` in NHWC with height and width exchanged
(:mod:`streamer.vision.mtcnn.layout`; ipazc/mtcnn 0.1 ``__scale_image``). Their item stages
prepare the inputs themselves, so their table is the one a backend reads
(:attr:`streamer.runtime.base.ModelSpec.preprocess`): with ``normalize = "model"`` onnxruntime
composes :data:`MTCNN_NORMALIZATION` into the graph at load time; with ``"device"`` the
``.om``'s static AIPP does the same arithmetic and the backend has nothing to do at load.

The two send different pixels: the rewritten graph exchanges H and W itself, AIPP cannot, so
with ``device`` the host sends them exchanged. A backend that runs compiled models (ACL)
therefore refuses ``model`` (:func:`refuse_in_graph`): on an ``.om`` with AIPP it would run on
transposed images without an error, and onnxruntime refuses ``device``.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, ValidationError

from streamer.config import PluginConfig, validate_strict
from streamer.config_errors import error_lines
from streamer.errors import ConfigError
from streamer.runtime.graph_preprocess import InputNormalization

__all__ = ["MTCNN_KINDS", "MTCNN_NORMALIZATION", "MtcnnKeys", "mtcnn_keys", "refuse_in_graph"]

MTCNN_KINDS = frozenset({"mtcnn_pnet", "mtcnn_rnet", "mtcnn_onet", "mtcnn_classify"})
"""The item-stage kinds that feed MTCNN's nets (:mod:`streamer.vision.stages`)."""

MTCNN_NORMALIZATION = InputNormalization(
    offset=(127.5, 127.5, 127.5),
    scale=(0.0078125, 0.0078125, 0.0078125),  # 1 / 128, exact in float32
    swap_rb=True,
    layout="NWHC",
)
"""MTCNN's input arithmetic on BGR uint8 pixels: RGB, ``(x - 127.5) / 128``, H and W
exchanged. As static AIPP: ``min_chn_i = 127.5``, ``var_reci_chn_i = 0.0078125``,
``rbuv_swap_switch = true`` (the exchange of H and W stays on the host: AIPP has none)."""


class MtcnnKeys(BaseModel):
    """The key the backends need; the item stage validates the whole table (same default as
    ``normalize`` of :class:`streamer.vision.mtcnn.layout.InputParams`)."""

    model_config = ConfigDict(extra="ignore", frozen=True, allow_inf_nan=False)

    normalize: Literal["host", "model", "device"] = "host"

    def normalization(self) -> InputNormalization:
        """:data:`MTCNN_NORMALIZATION`: the nets' arithmetic is fixed, not configured."""
        return MTCNN_NORMALIZATION


def mtcnn_keys(table: PluginConfig | None) -> MtcnnKeys | None:
    """The keys of an MTCNN item-stage table; None for no table or another kind.

    Raises:
        ConfigError: ``normalize`` is invalid, named as ``postprocess.normalize``.
    """
    if table is None or table.kind not in MTCNN_KINDS:
        return None
    try:
        return validate_strict(MtcnnKeys, table.params())
    except ValidationError as exc:
        raise ConfigError(error_lines(exc, MtcnnKeys, "postprocess")[0]) from exc


def refuse_in_graph(table: PluginConfig | None) -> None:
    """Refuse ``normalize = "model"`` on an MTCNN table, for a backend without the in-graph
    rewrite (ACL: the ``.om`` is compiled; see the module docstring).

    Raises:
        ConfigError: the table is an MTCNN item stage's with ``normalize = "model"``, or its
            ``normalize`` is invalid.
    """
    keys = mtcnn_keys(table)
    if keys is not None and keys.normalize == "model":
        raise ConfigError(
            'postprocess.normalize: "model" is the onnxruntime backend\'s in-graph rewrite; an '
            '.om normalises on the device with static AIPP and normalize = "device"; for the '
            "simulator, `streamer models sim-layout` lays the models out and writes the config "
            "that runs them"
        )

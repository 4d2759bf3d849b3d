"""The static AIPP config for a configured model's letterbox (``streamer models aipp``).

ATC bakes it into the ``.om`` (``--insert_op_conf``); the daemon then runs that model with
``normalize = "device"`` and sends uint8 pixels (docs/ascend.md, "Static AIPP").
"""

from __future__ import annotations

from pathlib import Path

import onnx

from streamer.config import Config
from streamer.errors import ConfigError
from streamer.runtime.acl.aipp import StaticAipp
from streamer.runtime.acl.sim.manifest import onnx_path
from streamer.runtime.graph_preprocess import InputNormalization
from streamer.vision.preprocess import LetterboxParams

__all__ = ["letterbox_aipp"]


def letterbox_aipp(config: Config, model: str, size: tuple[int, int] | None = None) -> StaticAipp:
    """The ``aipp_op`` that does model ``model``'s letterbox normalisation on the device.

    Args:
        config: the daemon config.
        model: the ``[[models]]`` name.
        size: (height, width) of the image input, pixels; ``(0, 0)`` for a model built with
            dynamic resolution (rule: static AIPP with dynamic resolution, source size 0).
            None: the letterbox ``size``, else the static H × W of the model's ONNX file (the
            ``.onnx`` beside a configured ``.om``).

    Raises:
        ConfigError: no such model, its preprocess is not a ``letterbox``, or the size is
            unknown.
    """
    stage = next((m for m in config.models if m.name == model), None)
    if stage is None:
        raise ConfigError(f"no model {model!r}; known: {[m.name for m in config.models]}")
    table = stage.preprocess
    if table is None or table.kind != "letterbox":
        raise ConfigError(f"model {model!r}: AIPP is generated from a letterbox preprocess")
    params = LetterboxParams.model_validate(table.params())
    mean, std = params.per_channel()
    norm = InputNormalization.from_mean_std(mean, std, params.color == "rgb", params.layout)
    height, width = size or params.size or _onnx_size(config.model_path(stage), params.layout)
    return StaticAipp.from_normalization(norm, height, width)


def _onnx_size(model: Path, layout: str) -> tuple[int, int]:
    """The static (height, width) of the first input of the ONNX file for ``model``.

    Raises:
        ConfigError: no ONNX file, or its H or W is dynamic.
    """
    path = onnx_path(model)
    if not path.is_file():
        raise ConfigError(f"no ONNX file {path} to read the input size from; pass --size H W")
    dims = onnx.load(str(path), load_external_data=False).graph.input[0].type.tensor_type.shape
    values = [d.dim_value if d.HasField("dim_value") else 0 for d in dims.dim]
    height, width = values[2:4] if layout == "NCHW" else values[1:3]
    if not (height and width):
        raise ConfigError(
            f"{path}: input height/width are dynamic; pass --size H W (0 0 for gears)"
        )
    return height, width

"""The AIPP config for a configured model's letterbox (``streamer models aipp``).

ATC bakes it into the ``.om`` (``--insert_op_conf``); the daemon then runs that model with
``normalize = "device"`` and sends uint8 pixels (docs/ascend.md, "Static AIPP" and "Dynamic
AIPP"). With ``aipp = "static"`` the config holds the normalisation; with ``aipp = "dynamic"``
it only sizes the source input (``max_src_image_size``) and the backend sets the
normalisation on every execution.
"""

from __future__ import annotations

from pathlib import Path

import onnx

from streamer.config import Config, ModelConfig
from streamer.errors import ConfigError
from streamer.runtime.acl.aipp_dynamic import DynamicAippConfig
from streamer.runtime.acl.aipp_static import StaticAipp
from streamer.runtime.acl.sim.manifest import onnx_path
from streamer.runtime.graph_preprocess import InputNormalization
from streamer.vision.preprocess import LetterboxParams

__all__ = ["letterbox_aipp"]


def letterbox_aipp(
    config: Config, model: str, size: tuple[int, int] | None = None
) -> StaticAipp | DynamicAippConfig:
    """The ``aipp_op`` that does model ``model``'s letterbox normalisation on the device.

    Args:
        config: the daemon config.
        model: the ``[[models]]`` name.
        size: (height, width) of the image input, pixels; ``(0, 0)`` for a static-AIPP model
            built with dynamic resolution (rule: static AIPP with dynamic resolution, source
            size 0), the largest gear for a dynamic-AIPP one. None: the letterbox ``size``,
            else the static H × W of the model's ONNX file (the ``.onnx`` beside a configured
            ``.om``).

    Returns:
        With ``aipp = "static"``, the static block. With ``aipp = "dynamic"``, the dynamic
        block whose ``max_src_image_size`` holds the largest batch (the largest of
        ``batch.gears``, else ``batch.max_size``) of RGB888 images of that size.

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
    height, width = size or params.size or _onnx_size(config.model_path(stage), params.layout)
    if params.aipp == "dynamic":
        return DynamicAippConfig.for_images(_largest_batch(stage), height, width)
    mean, std = params.per_channel()
    norm = InputNormalization.from_mean_std(mean, std, params.color == "rgb", params.layout)
    return StaticAipp.from_normalization(norm, height, width)


def _largest_batch(stage: ModelConfig) -> int:
    """The largest batch the stage runs: its largest batch gear, else ``batch.max_size``."""
    return max(stage.batch.gears) if stage.batch.gears else stage.batch.max_size


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

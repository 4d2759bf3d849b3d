"""The AIPP config for a configured model's letterbox or MTCNN stage (``streamer models
aipp``).

ATC bakes it into the ``.om`` (``--insert_op_conf``); the daemon then runs that model with
``normalize = "device"`` and sends uint8 pixels (docs/ascend.md, "Static AIPP" and "Dynamic
AIPP"). With ``aipp = "static"`` the config holds the normalisation; with ``aipp = "dynamic"``
it only sizes the source input (``max_src_image_size``) and the backend sets the
normalisation on every execution. MTCNN's stages take static AIPP with the nets' fixed
arithmetic (:data:`~streamer.runtime.mtcnn_keys.MTCNN_NORMALIZATION`).
"""

from __future__ import annotations

from pathlib import Path
from typing import cast

import onnx

from streamer.config import Config, ModelConfig
from streamer.errors import ConfigError
from streamer.runtime.acl.aipp_dynamic import DynamicAippConfig
from streamer.runtime.acl.aipp_static import StaticAipp, checked_aipp_values
from streamer.runtime.acl.sim.manifest import onnx_path
from streamer.runtime.graph_preprocess import InputNormalization
from streamer.runtime.mtcnn_keys import MTCNN_KINDS, MTCNN_NORMALIZATION
from streamer.vision.preprocess import LetterboxParams
from streamer.vision.registry import PREPROCESSORS

__all__ = ["letterbox_aipp", "model_aipp", "mtcnn_aipp"]

INT32_MAX = 2**31 - 1


def model_aipp(
    config: Config, model: str, size: tuple[int, int] | None = None
) -> StaticAipp | DynamicAippConfig:
    """The ``aipp_op`` for model ``model``: :func:`mtcnn_aipp` for an MTCNN item stage,
    :func:`letterbox_aipp` otherwise (same arguments and errors; a negative ``size``, or one
    with a single 0 or one past int32, is a :class:`~streamer.errors.ConfigError` too: the
    runtime's ``aclmdlAIPP`` keeps ``srcImageSizeW/H`` as ``int32_t``, CANN's
    ``aipp_param_check.cpp``)."""
    stage = _stage(config, model)
    if size is not None and min(size) < 0:
        raise ConfigError(
            f"size {size[0]} {size[1]}: height and width are pixels, not negative "
            "(0 0 for resolution gears)"
        )
    if size is not None and max(size) > INT32_MAX:
        raise ConfigError(
            f"size {size[0]} {size[1]}: height and width are at most {INT32_MAX} pixels "
            "(ACL holds the AIPP source size as int32)"
        )
    if size is not None and 0 in size and any(size):
        raise ConfigError(
            f"size {size[0]} {size[1]}: an image has no {'height' if size[0] == 0 else 'width'}"
            "; give both in pixels, or 0 0 for resolution gears"
        )
    post = stage.postprocess
    if post is not None and post.kind in MTCNN_KINDS:
        return mtcnn_aipp(config, model, size)
    return letterbox_aipp(config, model, size)


def mtcnn_aipp(config: Config, model: str, size: tuple[int, int] | None = None) -> StaticAipp:
    """The static ``aipp_op`` that does an MTCNN net's input normalisation on the device.

    Args:
        config: the daemon config.
        model: the ``[[models]]`` name of an MTCNN item stage.
        size: (height, width) of the AIPP source in the net's orientation (the image's width
            and height: MTCNN's nets see images transposed), pixels. None: ``(0, 0)`` for
            ``mtcnn_pnet``, whose pyramid gears are resolution gears (rule: static AIPP with
            dynamic resolution, source size 0), else the static H × W of the ONNX input.

    Raises:
        ConfigError: no such model, or the size is unknown.
    """
    stage = _stage(config, model)
    pnet = stage.postprocess is not None and stage.postprocess.kind == "mtcnn_pnet"
    default = (0, 0) if pnet else None
    height, width = size or default or _onnx_size(config.model_path(stage), "NHWC")
    return StaticAipp.from_normalization(MTCNN_NORMALIZATION, height, width)


def _stage(config: Config, model: str) -> ModelConfig:
    """The ``[[models]]`` table named ``model``.

    Raises:
        ConfigError: none has that name.
    """
    stage = next((m for m in config.models if m.name == model), None)
    if stage is None:
        raise ConfigError(f"no model {model!r}; known: {[m.name for m in config.models]}")
    return stage


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
        ConfigError: no such model, its preprocess is not a ``letterbox``, the size is
            unknown (or 0 with ``aipp = "dynamic"``), or its mean or std are beyond AIPP's ranges
            (:func:`~streamer.runtime.acl.aipp_static.checked_aipp_values`).
    """
    stage = _stage(config, model)
    table = stage.preprocess
    if table is None or table.kind != "letterbox":
        raise ConfigError(f"model {model!r}: AIPP is generated from a letterbox preprocess")
    where = f"{config.model_key(stage)}.preprocess"
    params = cast("LetterboxParams", PREPROCESSORS.params(table, where))
    height, width = size or params.size or _onnx_size(config.model_path(stage), params.layout)
    mean, std = params.per_channel()
    norm = InputNormalization.from_mean_std(mean, std, params.color == "rgb", params.layout)
    if params.aipp == "dynamic":
        if not (height and width):
            raise ConfigError(
                f"model {model!r}: dynamic AIPP is sized by its largest image: the size "
                f"{height} {width} has no pixels; pass the largest gear's H W"
            )
        checked_aipp_values(norm)  # set on every execution: refused now, not at load
        return DynamicAippConfig.for_images(_largest_batch(stage), height, width)
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

"""The sidecar manifest: what ATC would have baked into an ``.om`` file.

The simulator executes an ONNX model with onnxruntime; ATC options that change the model's
interface (static shape, batch / resolution / dims gears) live in a JSON file next to it, so a
config written for an Ascend box (``path = "models/face.om"``) runs unchanged on a laptop that
has ``models/face.onnx`` and ``models/face.acl.json``::

    {
      "input_shape": {"input": [-1, 3, 128, 128]},   # ATC --input_shape="input:-1,3,128,128"
      "dynamic_batch_size": [1, 2, 4, 8]             # ATC --dynamic_batch_size="1,2,4,8"
    }

Keys (all optional; no manifest = the ONNX shapes, which must then be static):
    input_shape: input name -> dims; ``-1`` marks the dims a dynamic option fills.
    dynamic_batch_size: batch gears (``-1`` at dim 0).
    dynamic_image_size: ``[height, width]`` gears (``-1`` at dims 2 and 3, NCHW).
    dynamic_dims: per gear, the values of every ``-1`` dim, inputs in order.
    om2: the file is in OM2 format (``aclmdlLoadFromFileWithQ`` refuses it).

At most one of the three dynamic options, and 2 to 100 gears, as ATC requires (S16; HA
``canncommercial/850/devaids/atctool/atlasatcparam_16_0018.html`` for --dynamic_batch_size,
``…_0020.html`` for --dynamic_dims), which also keeps ``get_dynamic_batch`` within
``ACL_MAX_BATCH_NUM`` = 128 gears (S14).
"""

from __future__ import annotations

import json
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

__all__ = ["Manifest", "ManifestError", "manifest_path", "onnx_path", "read_manifest"]

_MIN_GEARS = 2
_MAX_GEARS = 100


class ManifestError(ValueError):
    """The manifest is missing pieces, unreadable or contradicts the model."""


class Manifest(BaseModel):
    """Parsed ``<model>.acl.json``."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    input_shape: dict[str, tuple[int, ...]] = Field(default_factory=dict)
    dynamic_batch_size: tuple[int, ...] | None = Field(
        default=None, min_length=_MIN_GEARS, max_length=_MAX_GEARS
    )
    dynamic_image_size: tuple[tuple[int, int], ...] | None = Field(
        default=None, min_length=_MIN_GEARS, max_length=_MAX_GEARS
    )
    dynamic_dims: tuple[tuple[int, ...], ...] | None = Field(
        default=None, min_length=_MIN_GEARS, max_length=_MAX_GEARS
    )
    om2: bool = False

    @model_validator(mode="after")
    def _one_dynamic_kind(self) -> Manifest:
        kinds = [self.dynamic_batch_size, self.dynamic_image_size, self.dynamic_dims]
        if sum(kind is not None for kind in kinds) > 1:
            raise ValueError(
                "dynamic_batch_size, dynamic_image_size and dynamic_dims are mutually exclusive"
            )
        values = [v for kind in kinds if kind is not None for v in _flatten(kind)]
        if any(v < 1 for v in values):
            raise ValueError("gear values must be positive")
        return self


def _flatten(gears: tuple[int | tuple[int, ...], ...]) -> list[int]:
    return [v for gear in gears for v in (gear if isinstance(gear, tuple) else (gear,))]


def manifest_path(model: Path) -> Path:
    """``models/face.om`` or ``models/face.onnx`` → ``models/face.acl.json``."""
    return model.with_suffix(".acl.json")


def onnx_path(model: Path) -> Path:
    """The ONNX file the simulator runs for ``model`` (``face.om`` → ``face.onnx``)."""
    return model if model.suffix == ".onnx" else model.with_suffix(".onnx")


def read_manifest(model: Path) -> Manifest:
    """The manifest next to ``model``, or an empty one when there is none.

    Raises:
        ManifestError: the file is not valid JSON or not a valid manifest.
    """
    path = manifest_path(model)
    if not path.is_file():
        return Manifest()
    try:
        return Manifest.model_validate(json.loads(path.read_text(encoding="utf-8")))
    except (OSError, json.JSONDecodeError, ValidationError) as exc:
        raise ManifestError(f"{path}: {exc}") from exc

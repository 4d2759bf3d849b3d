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
    input_format: ``NCHW`` (default for images) | ``NHWC`` | ``ND`` (ATC ``--input_format``).
    dynamic_batch_size: batch gears (``-1`` at dim 0).
    dynamic_image_size: ``[height, width]`` gears (``-1`` at H and W: dims 2 and 3 in NCHW,
        1 and 2 in NHWC; not with ND).
    dynamic_dims: per gear, the values of every ``-1`` dim, inputs in order; ND format only
        ("动态维度（ND格式）", seeds page "动态Batch/动态分辨率/动态维度").
    om2: the file is in OM2 format (``aclmdlLoadFromFileWithQ`` refuses it).
    aipp: AIPP (ATC ``--insert_op_conf``), the keys of the ``aipp_op`` block as JSON
        (``streamer models aipp --json`` writes it); ``aipp_mode`` picks the kind:

        - ``static`` (:class:`~streamer.runtime.acl.aipp_static.StaticAipp`): the image input
          (``related_input_rank``, the only data input) takes uint8 NHWC pixels of
          ``src_image_size`` (or the gear's size) and the AIPP arithmetic is composed into the
          graph (:mod:`streamer.runtime.graph_preprocess`). The combination rules are checked
          first (:func:`~streamer.runtime.acl.aipp_rules.check_static_aipp`); the simulator
          does not implement ``crop``, ``padding`` or ``csc_switch`` and refuses them after
          the rules.
        - ``dynamic`` (:class:`~streamer.runtime.acl.aipp_dynamic.DynamicAippConfig`): the
          image input takes uint8 NHWC pixels in ``max_src_image_size`` bytes, and the model
          gets the ``ascend_dynamic_aipp_data`` input that ``acl.mdl.set_input_aipp`` fills
          before each execution (:mod:`streamer.runtime.acl.sim.aipp_image`).

        ``input_shape`` and the gears still describe the model before AIPP.

At most one of the three dynamic options, and 2 to 100 gears, as ATC requires (S16; HA
``canncommercial/850/devaids/atctool/atlasatcparam_16_0018.html`` for --dynamic_batch_size,
``…_0020.html`` for --dynamic_dims), which also keeps ``get_dynamic_batch`` within
``ACL_MAX_BATCH_NUM`` = 128 gears (S14). A refused manifest's message names the options at
fault and the ``input_shape``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from streamer.runtime.acl.aipp_dynamic import DynamicAippConfig
from streamer.runtime.acl.aipp_static import StaticAipp

__all__ = ["Manifest", "ManifestError", "manifest_path", "onnx_path", "read_manifest"]

_MIN_GEARS = 2
_MAX_GEARS = 100


class ManifestError(ValueError):
    """The manifest is missing pieces, unreadable or contradicts the model."""


class Manifest(BaseModel):
    """Parsed ``<model>.acl.json``."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    input_shape: dict[str, tuple[int, ...]] = Field(default_factory=dict)
    input_format: Literal["NCHW", "NHWC", "ND"] | None = None
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
    aipp: StaticAipp | DynamicAippConfig | None = None

    @model_validator(mode="after")
    def _one_dynamic_kind(self) -> Manifest:
        kinds = {
            "dynamic_batch_size": self.dynamic_batch_size,
            "dynamic_image_size": self.dynamic_image_size,
            "dynamic_dims": self.dynamic_dims,
        }
        given = {name: gears for name, gears in kinds.items() if gears is not None}
        if len(given) > 1:
            settings = " and ".join(f"{name} {_listed(gears)}" for name, gears in given.items())
            shapes = {name: list(dims) for name, dims in self.input_shape.items()}
            raise ValueError(
                f"{settings} are mutually exclusive (ATC takes one dynamic option per model); "
                f"input_shape {shapes}"
            )
        values = [v for gears in given.values() for v in _flatten(gears)]
        if any(v < 1 for v in values):
            raise ValueError("gear values must be positive")
        return self


def _flatten(gears: tuple[int | tuple[int, ...], ...]) -> list[int]:
    return [v for gear in gears for v in (gear if isinstance(gear, tuple) else (gear,))]


def _listed(gears: tuple[int | tuple[int, ...], ...]) -> list[object]:
    return [list(g) if isinstance(g, tuple) else g for g in gears]


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
    except ValidationError as exc:
        raise ManifestError(f"{path}: {_describe(exc)}") from exc
    except (OSError, json.JSONDecodeError) as exc:
        raise ManifestError(f"{path}: {exc}") from exc


def _describe(exc: ValidationError) -> str:
    """Each problem on one line: ``key: message`` (no pydantic banner)."""
    problems = []
    for error in exc.errors():
        where = ".".join(str(part) for part in error["loc"])
        problems.append(f"{where}: {error['msg']}" if where else str(error["msg"]))
    return "; ".join(problems)

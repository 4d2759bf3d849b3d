"""A config's models laid out as on an Ascend box, for the ACL simulator (``streamer models
sim-layout``).

ATC turns each ONNX model into an ``.om`` with its input shapes and gears baked in
(docs/ascend.md section 2); the simulator runs ``<name>.onnx`` for ``<name>.om`` and reads
what ATC would have baked in from the manifest ``<name>.acl.json`` beside it
(:mod:`streamer.runtime.acl.sim.manifest`). :func:`sim_layout` writes those three per model
stage, derived from the model and its ``[[models]]`` table, and rewrites the config to run them
on ``backend = "acl-sim"``:

- **Batch.** A model whose ONNX batch dim (dim 0 of every input) is free gets the batch gears
  of its ``[models.batch]`` (``gears``, else the powers of two up to ``max_size`` and
  ``max_size``, :func:`~streamer.scheduling.policy.default_gears`), as ATC
  ``--dynamic_batch_size``; one size, or ``mode = "queue"`` (static shapes only), makes it a
  static batch (``--input_shape``), ``max_size`` by default. A ``:tensor`` stage runs its
  upstream's batches, so it gets the upstream's batch sizes.
- **P-Net** (``mtcnn_pnet``): batch 1 and its pyramid levels as resolution gears
  (``--dynamic_image_size``, each gear's (height, width) in the net's orientation, i.e. the
  image's width and height; :func:`~streamer.vision.mtcnn.pnet.pnet_gears`). One dynamic
  option per model (docs/ascend.md section 2), so no batch gears; and no queue mode.
- **Input format** (``--input_format``): a letterbox's ``layout``; ``NHWC`` for MTCNN's nets.
- **AIPP** (``--insert_op_conf``): with ``normalize = "device"`` on a letterbox or an MTCNN
  stage, its ``aipp_op`` (:func:`~streamer.vision.aipp.model_aipp`): static, or dynamic with
  ``aipp = "dynamic"``, sized for the largest batch laid out. ``normalize = "model"``
  (onnxruntime's in-graph rewrite, which ACL refuses) becomes what ATC builds for it: static
  AIPP, ``normalize = "device"``.

Any other free dim (an input size only ATC's user knows) is an error: build that model with
ATC, or write its manifest by hand (docs/ascend.md section 4).
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal, cast

import onnx

from streamer.config import BatchConfig, Config, ModelConfig, PluginConfig, RuntimeConfig
from streamer.errors import ConfigError
from streamer.model_stages import check_plug_in_params
from streamer.runtime.acl.sim.manifest import manifest_path, onnx_path
from streamer.runtime.letterbox_keys import letterbox_keys
from streamer.runtime.mtcnn_keys import mtcnn_keys
from streamer.scheduling.policy import default_gears
from streamer.vision.aipp import model_aipp
from streamer.vision.mtcnn.pnet import PNetParams, pnet_gears
from streamer.vision.stages import ITEM_STAGES

__all__ = ["Mode", "sim_layout"]

Mode = Literal["auto", "queue", "async", "sync"]
"""A model stage's ACL execution mode (``[[models]] mode``)."""

Dims = list[int]
"""One input's dims, ``-1`` where ATC leaves a dim to a dynamic option."""


def sim_layout(
    config: Config,
    folder: Path,
    *,
    mode: Mode | None = None,
    batch_sizes: Sequence[int] | None = None,
) -> Config:
    """Lay out every model stage of ``config`` in ``folder`` for the simulator, and return the
    config that runs them (module docstring for what each manifest holds).

    Writes ``<name>.onnx`` (a copy of the stage's model) and ``<name>.acl.json`` per stage.

    Args:
        config: the validated config; its models' ONNX files must exist (fetched assets,
            or ``path`` to an ``.onnx``, or to an ``.om`` with its ``.onnx`` beside it).
        folder: where the layout goes; created if missing.
        mode: every stage's execution mode; None keeps each stage's own.
        batch_sizes: the batch sizes of every model with a free batch dim, instead of its
            ``[models.batch]``: one is a static batch, several are batch gears (e.g. ``(4,)``
            for queue mode, ``(1, 2, 4, 8)``). None: from each stage's ``[models.batch]``.

    Returns:
        ``config`` with ``backend = "acl-sim"`` (``runtime.options`` kept only from an ACL
        backend), and per stage ``path = "<folder>/<name>.om"``, absolute, and ``mode``.

    Raises:
        ConfigError: a stage's plug-in parameters are invalid
            (:func:`~streamer.model_stages.check_plug_in_params`), a model file is missing,
            an input has a free dim other than the batch
            (and P-Net's height and width), or a queue-mode stage would need gears (P-Net,
            several ``batch_sizes``, or a ``:tensor`` stage after a stage with gears) or
            dynamic AIPP.
    """
    folder.mkdir(parents=True, exist_ok=True)
    folder = folder.resolve()
    batches: dict[str, tuple[int, ...]] = {}
    stages: dict[str, ModelConfig] = {}
    for stage in config.chain():
        check_plug_in_params(config, stage)
        stage = _in_model_on_device(stage)
        stage_mode = mode or stage.mode
        batches[stage.name] = _batch(stage, stage_mode, batch_sizes, batches)
        om = _lay_out(config, stage, batches[stage.name], folder)
        stages[stage.name] = stage.model_copy(
            update={
                "path": om,
                "asset": None,
                "mode": stage_mode,
                "batch": _batch_config(stage, batches[stage.name]),
            }
        )
    acl = config.runtime.backend in ("acl", "acl-sim")
    runtime = RuntimeConfig(
        backend="acl-sim",
        devices=config.runtime.devices,
        options=dict(config.runtime.options) if acl else {},
    )
    models = tuple(stages[m.name] for m in config.models)
    return config.model_copy(update={"runtime": runtime, "models": models})


def _batch(
    stage: ModelConfig,
    mode: Mode,
    batch_sizes: Sequence[int] | None,
    laid_out: dict[str, tuple[int, ...]],
) -> tuple[int, ...]:
    """The batch sizes ``stage``'s model runs, ascending: one = a static batch.

    Raises:
        ConfigError: ``queue`` mode with more than one size, on P-Net, or with dynamic AIPP.
    """
    where = f"models {stage.name!r}: mode 'queue' loads static shapes only"
    if _is_pnet(stage):
        if mode == "queue":
            raise ConfigError(
                f"{where}, and P-Net runs its pyramid levels as resolution gears: use async"
            )
        return (1,)
    upstream = stage.source.upstream
    if stage.source.adapter == "tensor" and upstream is not None:
        sizes = laid_out[upstream]
    elif batch_sizes:
        sizes = tuple(sorted(set(batch_sizes)))
    elif mode == "queue":
        sizes = (stage.batch.max_size,)
    else:
        sizes = stage.batch.gears or default_gears(stage.batch.max_size)
    if mode == "queue" and len(sizes) > 1:
        raise ConfigError(f"{where}, and it would run batch gears {list(sizes)}")
    if mode == "queue" and _dynamic_aipp(stage):
        raise ConfigError(
            f"models {stage.name!r}: mode 'queue' cannot run a model with dynamic AIPP (its "
            "parameters are set on every execution): use async"
        )
    return sizes


def _dynamic_aipp(stage: ModelConfig) -> bool:
    """Whether the stage normalises with dynamic AIPP (``normalize = "device"``, ``aipp =
    "dynamic"`` on its letterbox)."""
    letterbox = letterbox_keys(stage.preprocess)
    return letterbox is not None and letterbox.normalize == "device" and letterbox.aipp == "dynamic"


def _batch_config(stage: ModelConfig, sizes: tuple[int, ...]) -> BatchConfig:
    """``stage``'s ``[models.batch]`` for its laid-out model: configured gears the model does
    not run (a queue-mode static batch) become the sizes it runs, or it would not load."""
    batch = stage.batch
    if batch.gears and not set(batch.gears) <= set(sizes):
        return batch.model_copy(update={"gears": sizes})
    return batch


def _lay_out(config: Config, stage: ModelConfig, batch: tuple[int, ...], folder: Path) -> Path:
    """Write ``stage``'s ``.onnx`` and manifest into ``folder``; the ``.om`` path.

    Raises:
        ConfigError: see :func:`sim_layout`.
    """
    source = onnx_path(config.model_path(stage))
    if not source.is_file():
        hint = " (streamer models fetch)" if stage.asset is not None else ""
        raise ConfigError(f"models {stage.name!r}: no ONNX file {source}{hint}")
    om = folder / f"{stage.name}.om"
    manifest = _manifest(config, stage, batch, _onnx_inputs(source))
    if source.resolve() != onnx_path(om):
        shutil.copyfile(source, onnx_path(om))
    manifest_path(om).write_text(json.dumps(manifest, indent=2) + "\n", encoding="utf-8")
    return om


def _manifest(
    config: Config, stage: ModelConfig, batch: tuple[int, ...], inputs: dict[str, Dims]
) -> dict[str, Any]:
    """The manifest of ``stage``'s model with ONNX ``inputs`` (module docstring).

    Raises:
        ConfigError: an input has a free dim the layout cannot fill.
    """
    free_batch = any(dims[0] < 0 for dims in inputs.values())
    static = batch[0] if len(batch) == 1 else -1
    shapes = {
        name: [static if d < 0 else d for d in dims[:1]] + dims[1:] for name, dims in inputs.items()
    }
    manifest: dict[str, Any] = {"input_shape": shapes}
    input_format, device_side = _input_format(stage)
    if input_format is not None:
        manifest["input_format"] = input_format
    if _is_pnet(stage):
        manifest["dynamic_image_size"] = _pnet_gears(stage)
    else:
        _check_static(stage, shapes)
        if free_batch and len(batch) > 1:
            manifest["dynamic_batch_size"] = list(batch)
    if device_side:
        manifest["aipp"] = _aipp(config, stage, batch)
    return manifest


def _onnx_inputs(model: Path) -> dict[str, Dims]:
    """The data inputs of ONNX file ``model`` (initializers left out): name → dims, ``-1``
    for a symbolic or unknown dim."""
    graph = onnx.load(str(model), load_external_data=False).graph
    weights = {init.name for init in graph.initializer}
    return {
        value.name: [
            d.dim_value if d.HasField("dim_value") else -1 for d in value.type.tensor_type.shape.dim
        ]
        for value in graph.input
        if value.name not in weights
    }


def _check_static(stage: ModelConfig, shapes: dict[str, Dims]) -> None:
    """Raises: ConfigError: a dim after the batch is free."""
    free = [(name, axis) for name, dims in shapes.items() for axis, d in enumerate(dims) if d < 0]
    free = [(name, axis) for name, axis in free if axis > 0]
    if free:
        raise ConfigError(
            f"models {stage.name!r}: dims {free} of its ONNX inputs are free and only batch "
            "gears are laid out; build it with ATC, or write its manifest (docs/ascend.md)"
        )


def _in_model_on_device(stage: ModelConfig) -> ModelConfig:
    """``stage`` with ``normalize = "model"`` on its letterbox or MTCNN table turned into
    ``"device"`` with static AIPP: the normalisation composed into the ``.om`` by ATC, as
    onnxruntime composes it into the graph."""
    if (keys := letterbox_keys(stage.preprocess)) is not None and keys.normalize == "model":
        return stage.model_copy(update={"preprocess": _on_device(stage.preprocess, aipp=True)})
    if (mtcnn := mtcnn_keys(stage.postprocess)) is not None and mtcnn.normalize == "model":
        return stage.model_copy(update={"postprocess": _on_device(stage.postprocess, aipp=False)})
    return stage


def _on_device(table: PluginConfig | None, *, aipp: bool) -> PluginConfig:
    """A plug-in table with ``normalize = "device"`` (and ``aipp = "static"`` where it has
    that key)."""
    assert table is not None
    device = {"normalize": "device", **({"aipp": "static"} if aipp else {})}
    return PluginConfig(kind=table.kind, **{**table.params(), **device})


def _input_format(stage: ModelConfig) -> tuple[str | None, bool]:
    """ATC ``--input_format`` of the stage's model (None: ATC's default), and whether the
    stage normalises on the device (``normalize = "device"``: AIPP)."""
    letterbox = letterbox_keys(stage.preprocess)
    if letterbox is not None:
        return letterbox.layout, letterbox.normalize == "device"
    mtcnn = mtcnn_keys(stage.postprocess)
    if mtcnn is not None:
        return "NHWC", mtcnn.normalize == "device"
    return None, False


def _is_pnet(stage: ModelConfig) -> bool:
    return stage.postprocess is not None and stage.postprocess.kind == "mtcnn_pnet"


def _pnet_gears(stage: ModelConfig) -> list[list[int]]:
    """P-Net's pyramid levels as ``[height, width]`` of its (N, W, H, 3) input: the image's
    width and height (MTCNN's nets see images transposed)."""
    assert stage.postprocess is not None
    where = f"model {stage.name!r} postprocess"
    params = cast("PNetParams", ITEM_STAGES.params(stage.postprocess, where))
    gears = pnet_gears(*params.max_size, params.min_face_px, params.factor)
    return [list(gear.input_shape[:2]) for gear in gears]


def _aipp(config: Config, stage: ModelConfig, batch: tuple[int, ...]) -> dict[str, Any]:
    """The manifest's ``aipp``: the stage's ``aipp_op`` for a model whose largest batch is
    ``max(batch)`` (dynamic AIPP sizes its source memory for it)."""
    gears = stage.batch.model_copy(update={"gears": batch})
    sized = stage.model_copy(update={"batch": gears})
    return model_aipp(config.model_copy(update={"models": (sized,)}), stage.name).model_dump()

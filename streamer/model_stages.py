"""A chain's model stages: each model loaded on every device, its plug-ins, and the links
between stages, all checked against the config before anything runs.

A stage is one of:

- *single* (``input = "frame"``): a preprocessor makes each frame's tensor and transform, a
  postprocessor its results.
- *item* (``postprocess.kind`` an item stage of :mod:`streamer.vision.stages`, e.g. behind
  ``input = "<stage>:crops"``): it makes several inputs per frame and folds their outputs
  into the frame's results.
- *tensor* (``input = "<stage>:tensor[:<map>]"``, :mod:`streamer.scheduling.tensor_link`): it
  runs the upstream's batches as they are, so it has no preprocessor, and its postprocessor
  sees the chain up to it as one model: the image input of the stage that made the frames'
  transform (a letterbox, say) and this stage's outputs. A BlazeFace head after its backbone
  thus takes ``kind = "blazeface"``, which finds its variant from the 128x128 image input
  and maps boxes to frame pixels with each frame's letterbox transform.

A stage that feeds a tensor stage has no postprocessor: its dequeue threads hand its outputs
on (:meth:`ModelStage.postprocess_batch`), and it is loaded with ``device_outputs`` so that on
ACL they stay in device memory for the next model. So is a stage whose postprocessor runs
single operators on its outputs where they are (its parameters'
:attr:`~streamer.vision.registry.PluginParams.device_outputs`, e.g. ``blazeface`` with
``nms = "operator"``): the stage releases them once the postprocessor returned.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from typing import cast

import numpy as np

from streamer.assets import ASSETS, SPLITS, Asset, Split, asset_state
from streamer.config import Config, ModelConfig, PluginConfig
from streamer.errors import ConfigError, ModelError
from streamer.frames import Frame
from streamer.release import close_logged
from streamer.runtime import Backend, ModelInfo, ModelSpec, QueueModel
from streamer.runtime.base import Tensor, TensorInfo, release_inputs
from streamer.runtime.ops.base import Operators
from streamer.scheduling.chain import store_outputs
from streamer.scheduling.policy import BatchPolicy
from streamer.scheduling.tensor_link import TensorLink, check_batch_sizes
from streamer.vision.postprocess import Postprocessor
from streamer.vision.preprocess import Preprocessor
from streamer.vision.registry import POSTPROCESSORS, PREPROCESSORS
from streamer.vision.stages import ITEM_STAGES, ItemStage

__all__ = ["ModelStage", "check_plug_in_params", "load_chain"]


@dataclass
class ModelStage:
    """One model stage: its replicas (one model per device and replica), plug-ins and batch
    policy, loaded and checked (module docstring for the kinds of stage).

    Attributes:
        config: its ``[[models]]`` table.
        models: ``(device, model)`` per replica.
        policy: its batch policy (a tensor stage runs its upstream's batches instead).
        preprocess: frame → tensor and transform; only for a stage that reads the frame.
        postprocess: outputs → results; None for an item stage or one that hands on.
        items: an item stage's logic.
        link: for a stage that feeds a tensor stage, which of its outputs feed which input.
    """

    config: ModelConfig
    models: list[tuple[int, QueueModel]]
    policy: BatchPolicy
    preprocess: Preprocessor | None
    postprocess: Postprocessor | None
    items: ItemStage | None = None
    link: TensorLink | None = None

    @property
    def name(self) -> str:
        """The stage's (model's) name."""
        return self.config.name

    @property
    def tensor_fed(self) -> bool:
        """Whether it reads the previous stage's outputs through the ``tensor`` adapter."""
        return self.config.source.adapter == "tensor"

    @property
    def model(self) -> QueueModel:
        """The first replica's model (they all have the same ModelInfo)."""
        return self.models[0][1]

    def close(self) -> None:
        """Close every replica's model, each on its own thread; idempotent.

        A model whose execution is wedged waits out its close timeout (onnxruntime 10 s, an
        ACL stream its ``result_timeout_ms``): the replicas' waits overlap instead of adding
        up to more than systemd's stop timeout. Every model is closed even when one fails.

        Raises:
            Exception: the first replica's failure, once every close has returned.
        """
        models = [model for _, model in self.models]
        if len(models) == 1:
            models[0].close()
            return
        with ThreadPoolExecutor(len(models), thread_name_prefix=f"close-{self.name}") as pool:
            closes = [pool.submit(model.close) for model in models]
        for close in closes:
            close.result()

    def postprocess_batch(self, outputs: Sequence[Tensor], frames: list[Frame]) -> None:
        """Fill ``frame.results`` of each frame (item) from the batch-first ``outputs``; a
        stage that feeds a tensor stage gives every frame the batch's handover instead."""
        if self.link is not None:
            handover = self.link.hand_over(outputs)
            for frame in frames:
                frame.handover = handover
            return
        if self.postprocess is None:
            # Device tensors come only to a link or a postprocessor that asked for them.
            store_outputs(cast("Sequence[np.ndarray]", outputs), frames)
            return
        try:
            results = self.postprocess(outputs, [f.transform for f in frames])
        finally:
            release_inputs(outputs)  # the device outputs it read, on every path
        for frame, result in zip(frames, results, strict=True):
            frame.results = result


def load_chain(backend: Backend, config: Config) -> list[ModelStage]:
    """Every stage in chain order, loaded and checked; all or nothing.

    Raises:
        ConfigError, ModelError, BackendError: what was loaded is released first.
    """
    chain = config.chain()
    stages: list[ModelStage] = []
    try:
        for model, feeds in zip(chain, [*chain[1:], None], strict=True):
            hands_on = feeds is not None and feeds.source.adapter == "tensor"
            stages.append(_load_stage(backend, config, model, stages, hands_on))
    except BaseException:
        for stage in reversed(stages):
            close_logged(stage.close, f"model {stage.name!r}")
        raise
    return stages


def _load_stage(
    backend: Backend,
    config: Config,
    model_config: ModelConfig,
    upstream: list[ModelStage],
    hands_on: bool,
) -> ModelStage:
    """Load one stage after ``upstream`` (the stages before it), linking it to the last of
    them if it is a tensor stage."""
    where = config.model_key(model_config)
    check_plug_in_params(config, model_config)
    models = _load_replicas(backend, config, model_config, where, hands_on)
    try:
        stage = _plug_in(model_config, models, where, upstream, backend.operators())
        if stage.tensor_fed:
            _link(upstream[-1], stage)
        return stage
    except BaseException:
        for _, model in models:
            close_logged(model.close, f"model {model_config.name!r}")
        raise


def check_plug_in_params(config: Config, model_config: ModelConfig) -> None:
    """Validate a stage's plug-in tables without its model: before it is loaded (loading may
    take long, and a backend reads some of their keys while loading) or laid out, with
    messages naming the stage (``models[0] ('face').preprocess.<key>``).

    Raises:
        ConfigError: an unknown plug-in kind, or an invalid or unknown parameter.
    """
    where = config.model_key(model_config)
    post = model_config.postprocess
    if post is not None:
        registry = ITEM_STAGES if post.kind in ITEM_STAGES else POSTPROCESSORS
        registry.params(post, f"{where}.postprocess")
    pre, adapter = model_config.preprocess, model_config.source.adapter
    if pre is not None and adapter is not None:
        raise ConfigError(
            f"{where}.preprocess: a stage fed through the {adapter} adapter takes its inputs "
            "from the stage before it and has no preprocess; remove the table"
        )
    if pre is not None:
        PREPROCESSORS.params(pre, f"{where}.preprocess")


def _check_asset(model: ModelConfig, config: Config, where: str) -> bool:
    """A named ``asset`` must be a model of the catalog, fetched and not damaged since (one
    without a digest, made by an older version, is taken as it is).

    Returns:
        True when the model is an asset whose file matches its digest.

    Raises:
        ConfigError: an unknown asset (the message lists the known ones), one not fetched, or
            a cache this user cannot read.
        ModelError: the cached file no longer matches its digest (a full disk, another
            model copied over it).
    """
    if model.asset is None:
        return False
    models: list[Asset | Split] = [*ASSETS, *SPLITS]
    catalog = {a.name: a for a in models if a.kind != "media"}
    if model.asset not in catalog:
        known = ", ".join(sorted(catalog))
        raise ConfigError(f"{where}.asset: unknown {model.asset!r}; known: {known}")
    path = config.model_path(model)
    fetch = f"`streamer models fetch {model.asset}` with STREAMER_CACHE={path.parent.parent}"
    try:
        state = asset_state(catalog[model.asset], path.parent.parent)
    except OSError as exc:  # a cache folder this user may not search
        raise ConfigError(f"{where}.asset: cannot read {exc.filename}: {exc.strerror}") from exc
    if state == "missing":
        raise ConfigError(f"{where}.asset: {model.asset!r} is not fetched (no {path}): run {fetch}")
    if state == "damaged":
        raise ModelError(
            f"{where}.asset: {path} is damaged (it no longer matches the digest written when it "
            f"was made): run {fetch} to make it again"
        )
    return state == "ready"


def _asset_hint(model_config: ModelConfig, verified: bool, backend: str) -> str:
    """What to do about an ``asset`` model that did not load: make it again when its file
    could not be verified; on the ACL backends, which load ATC's layout of a model, lay the
    config out (an asset is the ONNX original); else nothing."""
    if model_config.asset is None:
        return ""
    if not verified:
        return (
            "`streamer models list` tells whether the cache is damaged; "
            f"`streamer models fetch {model_config.asset}` makes it again"
        )
    if backend.startswith("acl"):
        return (
            f"the asset {model_config.asset!r} is the ONNX original: ACL loads its ATC "
            "conversion, which `streamer models sim-layout` lays out for acl-sim "
            "(docs/ascend.md)"
        )
    return ""


def _reads_device_outputs(model_config: ModelConfig, where: str) -> bool:
    """Whether the stage's postprocessor reads the outputs where the backend leaves them.

    Raises:
        ConfigError: an unknown postprocess kind or invalid parameters.
    """
    post = model_config.postprocess
    if post is None:
        return False
    registry = ITEM_STAGES if post.kind in ITEM_STAGES else POSTPROCESSORS
    return registry.params(post, f"{where}.postprocess").device_outputs


def _input_table(model_config: ModelConfig) -> PluginConfig | None:
    """The table of the plug-in that prepares the model's inputs, for the backend
    (:attr:`ModelSpec.preprocess`): an item stage's ``[models.postprocess]`` (it makes its own
    inputs), else the ``[models.preprocess]``."""
    post = model_config.postprocess
    if post is not None and post.kind in ITEM_STAGES:
        return post
    return model_config.preprocess


def _load_replicas(
    backend: Backend, config: Config, model_config: ModelConfig, where: str, hands_on: bool
) -> list[tuple[int, QueueModel]]:
    """Load the model ``replicas`` times on every device; all or nothing. A model that hands
    its outputs on, or whose postprocessor reads them where they are, keeps them in device
    memory where the backend has any."""
    verified = _check_asset(model_config, config, where)
    device_outputs = hands_on or _reads_device_outputs(model_config, where)
    loaded: list[tuple[int, QueueModel]] = []
    try:
        for device in config.runtime.devices:
            for _ in range(model_config.replicas):
                spec = ModelSpec(
                    name=model_config.name,
                    path=config.model_path(model_config),
                    device=device,
                    mode=model_config.mode,
                    max_in_flight=model_config.max_in_flight,
                    batch_gears=model_config.batch.gears,
                    preprocess=_input_table(model_config),
                    device_outputs=device_outputs,
                )
                loaded.append((device, backend.load(spec)))
    except BaseException as exc:
        for _, model in loaded:
            close_logged(model.close, f"model {model_config.name!r}")
        hint = _asset_hint(model_config, verified, config.runtime.backend)
        if isinstance(exc, ModelError) and hint:
            raise ModelError(f"{exc} ({hint})") from exc
        raise
    return loaded


def _plug_in(
    model_config: ModelConfig,
    models: list[tuple[int, QueueModel]],
    where: str,
    upstream: Sequence[ModelStage],
    operators: Operators,
) -> ModelStage:
    """The stage's plug-ins, checked against the loaded model; those with ``nms =
    "operator"`` get the backend's ``operators``.

    Raises:
        ConfigError: a bad plug-in, a missing preprocess table, a crops stage that is not an
            item stage, a tensor stage that is one, or an item stage that crops upstream
            detections reading the frame.
    """
    info = models[0][1].info
    policy = BatchPolicy.for_model(model_config.batch, info)
    _check_batch_memory(policy, info, where)
    post = model_config.postprocess
    adapter = model_config.source.adapter
    is_items = post is not None and post.kind in ITEM_STAGES
    if (adapter == "crops" and not is_items) or (adapter == "tensor" and is_items):
        kind = post.kind if post is not None else None
        needs = "needs an item stage" if adapter == "crops" else "cannot be an item stage"
        raise ConfigError(
            f"{where}.postprocess.kind: a stage fed through the {adapter} adapter {needs} "
            f"({', '.join(ITEM_STAGES.names())}), got {kind!r}"
        )
    if adapter == "crops":
        _check_crops_source(model_config, upstream, where)
    if is_items:
        assert post is not None
        items = ITEM_STAGES.create(post, info, f"{where}.postprocess", operators)
        if adapter is None and items.crops_upstream:
            raise ConfigError(
                f"{where}.input: a {post.kind!r} stage crops the detections of the stage "
                f'before it; with input = "frame" it has none and would never run'
            )
        return ModelStage(model_config, models, policy, None, None, items)
    preprocess = _preprocessor(model_config, info, where) if adapter is None else None
    postprocess = None
    if post is not None:
        view = _image_view(info, upstream) if adapter == "tensor" else info
        postprocess = POSTPROCESSORS.create(post, view, f"{where}.postprocess", operators)
    return ModelStage(model_config, models, policy, preprocess, postprocess)


def _check_crops_source(
    model_config: ModelConfig, upstream: Sequence[ModelStage], where: str
) -> None:
    """A ``crops`` stage crops its upstream's detections: refuse an upstream whose results
    have none (``mtcnn_classify``), behind which the stage would never run.

    Raises:
        ConfigError: naming the upstream stage and its postprocess kind.
    """
    name = model_config.source.upstream
    source = next(stage for stage in upstream if stage.name == name)
    plug_in = source.items or source.postprocess
    if plug_in is None or not plug_in.detects:
        post = source.config.postprocess
        kind = post.kind if post is not None else None
        raise ConfigError(
            f"{where}.input: {model_config.input!r} crops the detections of {name!r}, whose "
            f"postprocess ({kind!r}) has none: this stage would never run"
        )


def _check_batch_memory(policy: BatchPolicy, info: ModelInfo, where: str) -> None:
    """Refuse a batch gear whose one execution's inputs cannot fit in this machine's memory
    (the batcher allocates them for each execution: it failed at the first frame, and the
    daemon stopped). Inputs with a dynamic dimension other than the batch are not counted.

    Raises:
        ConfigError: naming the gear, its bytes and the machine's memory.
    """
    try:
        memory = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError):  # no such figure on this system: nothing to check against
        return
    rows = policy.largest_execution
    row_bytes = sum(_row_bytes(tensor) for tensor in info.inputs)
    if rows * row_bytes > memory:
        raise ConfigError(
            f"{where}.batch: an execution of {rows} rows (gear {rows}, for max_size "
            f"{policy.max_size}) needs {rows * row_bytes / 2**30:.1f} GiB of model input, "
            f"more than this machine's {memory / 2**30:.1f} GiB: use gears up to max_size"
        )


def _row_bytes(tensor: TensorInfo) -> int:
    """Bytes of one batch row of ``tensor``; 0 when another dimension is dynamic."""
    try:
        return tensor.nbytes(1)
    except ValueError:
        return 0


def _preprocessor(model_config: ModelConfig, info: ModelInfo, where: str) -> Preprocessor:
    """The preprocessor of a stage that reads the frame.

    Raises:
        ConfigError: no ``[models.preprocess]``, or a bad one.
    """
    if model_config.preprocess is None:
        post = model_config.postprocess
        kind = f" for postprocess kind {post.kind!r}" if post is not None else ""
        raise ConfigError(f"{where}.preprocess: required{kind}")
    return PREPROCESSORS.create(model_config.preprocess, info, f"{where}.preprocess")


def _image_view(info: ModelInfo, upstream: Sequence[ModelStage]) -> ModelInfo:
    """What a tensor stage's postprocessor sees: the inputs of the stage that made the
    frames' transform (the last one before it that is not a tensor stage) and its own
    outputs (module docstring)."""
    root = next(s for s in reversed(upstream) if not s.tensor_fed)
    return replace(
        root.model.info, name=info.name, outputs=info.outputs, batch_gears=info.batch_gears
    )


def _link(upstream: ModelStage, stage: ModelStage) -> None:
    """Resolve and check the tensor link into ``stage``; ``upstream`` then hands on.

    Raises:
        ConfigError: see :meth:`TensorLink.resolve` and :func:`check_batch_sizes`.
    """
    info = stage.model.info
    link = TensorLink.resolve(stage.config.source, upstream.model.info, info)
    check_batch_sizes(link, upstream.policy.executed_sizes, info)
    upstream.link = link

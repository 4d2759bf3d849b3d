"""Dynamic AIPP at model load: match the letterbox config to the model, plan, check, fill.

A model built with ATC ``aipp_mode: dynamic`` has an ``ascend_dynamic_aipp_data`` input
(:attr:`~streamer.runtime.acl.description.ModelDescription.aipp_index`); the daemon runs it
only when its ``[models.preprocess]`` letterbox says ``normalize = "device"`` and
``aipp = "dynamic"``, and refuses the other combinations at start-up (a dynamic-AIPP model run
without parameters computes nothing meaningful; a config asking for dynamic AIPP on a model
without that input cannot be honoured). The letterbox's ``color``, ``mean``, ``std`` and
``size`` give the parameters (:class:`~streamer.runtime.acl.aipp_dynamic.DynamicAippParams`);
the plan is checked against the combination rules
(:func:`~streamer.runtime.acl.aipp_rules.check_dynamic_aipp`) and the ``aclmdlAIPP`` is
created and filled (:class:`~streamer.runtime.acl.aipp_set.AippSet`).

A model with resolution gears runs at its largest gear only (rule: dynamic AIPP with dynamic
resolution, source size = the largest gear), so its ``ModelInfo.hw_gears`` is narrowed to
that gear and the letterbox sizes every frame to it.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from streamer.config import PluginConfig
from streamer.errors import ModelError
from streamer.runtime.acl.aipp_dynamic import (
    RGB_CHANNELS,
    DynamicAippParams,
    DynamicAippPlan,
)
from streamer.runtime.acl.aipp_rules import AippRuleError, check_dynamic_aipp
from streamer.runtime.acl.aipp_set import AippSet
from streamer.runtime.acl.description import ModelDescription
from streamer.runtime.acl.gears import GearKind
from streamer.runtime.acl.loaded import LoadedModel
from streamer.runtime.acl.teardown import Teardown
from streamer.runtime.base import DYNAMIC, TensorInfo
from streamer.runtime.graph_preprocess import InputNormalization
from streamer.runtime.letterbox_keys import letterbox_keys

__all__ = [
    "DynamicAippRequest",
    "agreed_dynamic_aipp",
    "attach_dynamic_aipp",
    "dynamic_aipp_request",
]

_NHWC_DIMS = 4


@dataclass(frozen=True)
class DynamicAippRequest:
    """What a letterbox with ``normalize = "device"``, ``aipp = "dynamic"`` asks for.

    Attributes:
        normalization: ``(x / 255 - mean) / std`` with the channel swap, as AIPP computes it.
        size: the letterbox ``size`` (height, width), pixels, or None.
    """

    normalization: InputNormalization
    size: tuple[int, int] | None


def dynamic_aipp_request(table: PluginConfig | None) -> DynamicAippRequest | None:
    """The dynamic AIPP a ``[models.preprocess]`` table asks for, or None when it is not a
    ``letterbox`` with ``normalize = "device"`` and ``aipp = "dynamic"``.

    Raises:
        ConfigError: a key it needs is invalid (named as ``preprocess.<key>``), or a ``std``
            is not positive.
    """
    keys = letterbox_keys(table)
    if keys is None or keys.normalize != "device" or keys.aipp != "dynamic":
        return None
    return DynamicAippRequest(keys.normalization(), keys.size)


def agreed_dynamic_aipp(
    preprocess: PluginConfig | None, description: ModelDescription
) -> DynamicAippRequest | None:
    """The dynamic AIPP the config asks for when the model has it too; None when neither.

    Raises:
        ConfigError: the letterbox keys are invalid.
        ModelError: one has dynamic AIPP and the other not (module docstring).
    """
    request = dynamic_aipp_request(preprocess)
    name = description.info.name
    if description.aipp_index is None and request is not None:
        raise ModelError(
            f'model {name!r}: preprocess.aipp = "dynamic" needs a model built with ATC '
            "aipp_mode: dynamic, which has an ascend_dynamic_aipp_data input; this one "
            'has none (use aipp = "static" for a model with static AIPP)'
        )
    if description.aipp_index is not None and request is None:
        raise ModelError(
            f"model {name!r} has dynamic AIPP (an ascend_dynamic_aipp_data input): its "
            'letterbox needs normalize = "device" and aipp = "dynamic" so that the AIPP '
            "parameters are set on every execution"
        )
    return request


def attach_dynamic_aipp(
    acl: Any, preprocess: PluginConfig | None, loaded: LoadedModel, teardown: Teardown
) -> tuple[LoadedModel, AippSet | None]:
    """The model (its resolution gears narrowed, module docstring) and its filled
    ``aclmdlAIPP``, or ``(loaded, None)`` for a model without dynamic AIPP.

    Args:
        acl: the pyACL module; the model's context is current.
        preprocess: the model's ``[models.preprocess]`` table.
        loaded: the loaded model.
        teardown: gets the set's release.

    Raises:
        ConfigError: the letterbox keys are invalid.
        ModelError: the config and the model disagree on dynamic AIPP, the model's image
            input is not uint8 (N, H, W, 3), or a combination rule is broken (the message
            starts with ``rule '<name>'``).
        AclError: creating or filling the set failed.
    """
    description = loaded.description
    request = agreed_dynamic_aipp(preprocess, description)
    if request is None or description.aipp_index is None:
        return loaded, None
    plan = _plan(loaded, request)
    try:
        check_dynamic_aipp(plan)
    except AippRuleError as exc:
        raise ModelError(str(exc)) from exc
    aipp = AippSet(
        acl, loaded.model_id, description.aipp_index, plan.batch_size, plan.params, teardown
    )
    return _narrowed(loaded, plan), aipp


def _plan(loaded: LoadedModel, request: DynamicAippRequest) -> DynamicAippPlan:
    """Raises: ModelError: the image input is not uint8 (N, H, W, 3)."""
    description = loaded.description
    image = _image_input(description.info.name, description.info.inputs)
    gears = description.gears
    if gears.kind == GearKind.BATCH:
        largest_batch = max(g[0] for g in gears.gears)
    else:
        largest_batch = image.shape[0]
    if gears.kind == GearKind.HW:
        largest = max(gears.gears, key=lambda g: g[0] * g[1])
        resolution = (largest[0], largest[1])
    else:
        resolution = (image.shape[1], image.shape[2])
    source = request.size if gears.kind == GearKind.HW and request.size else resolution
    return DynamicAippPlan(
        model=description.info.name,
        kind=gears.kind,
        batch_size=largest_batch,
        largest_batch=largest_batch,
        params=DynamicAippParams.from_normalization(request.normalization, source),
        largest_resolution=resolution,
        input_bytes=description.input_sizes[description.data_input_indices[0]],
    )


def _image_input(name: str, inputs: tuple[TensorInfo, ...]) -> TensorInfo:
    """The AIPP image input: the first data input, uint8 (N, H, W, 3).

    Raises:
        ModelError: it is not.
    """
    image = inputs[0]
    shape = image.shape
    if (
        image.dtype != np.uint8
        or len(shape) != _NHWC_DIMS
        or shape[3] not in (RGB_CHANNELS, DYNAMIC)
    ):
        raise ModelError(
            f"model {name!r}: dynamic AIPP needs the first input to take uint8 (N, H, W, 3) "
            f"RGB888 pixels; {image.name!r} is {list(shape)} {image.dtype}"
        )
    return image


def _narrowed(loaded: LoadedModel, plan: DynamicAippPlan) -> LoadedModel:
    """``loaded`` with its resolution gears narrowed to the largest one (module docstring)."""
    if plan.kind != GearKind.HW:
        return loaded
    info = replace(loaded.description.info, hw_gears=(plan.largest_resolution,))
    return replace(loaded, description=replace(loaded.description, info=info))

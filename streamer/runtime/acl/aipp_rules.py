"""The documented rules for AIPP combined with dynamic shapes, as errors that name the rule.

From the seeds page "动态Batch/动态分辨率/动态维度" (须知):

- *dynamic AIPP with dynamic batch*: ``acl.mdl.create_aipp`` takes the largest batch gear as
  ``batchSize``, and the image input's memory is sized for the largest batch.
- *dynamic AIPP with dynamic resolution*: no crop, resize or padding; the source size
  (``set_aipp_src_image_size``) is the largest resolution gear, the one
  ``set_dynamic_hw_size`` must then set too; the image input's memory is sized for the
  largest resolution.
- *static AIPP with dynamic resolution*: no crop and no padding, and ``src_image_size_w`` =
  ``src_image_size_h`` = 0 in the ATC config (the size is the gear's).
- *AIPP with dynamic dims*: never, static or dynamic.

:func:`check_aipp_build` runs where an AIPP model is built (the simulator's manifest, as ATC
refuses such a build); :func:`check_dynamic_aipp` runs when the daemon loads a
dynamic-AIPP model, before the first batch (the runtime would refuse each
``acl.mdl.set_input_aipp`` with ``ACL_ERROR_INVALID_PARAM`` instead: GE
``api/acl/acl_model/model/acl_aipp.cpp``, ``GetAndCheckAippOutputShape``). Each raises
:class:`AippRuleError`, whose message starts with ``rule '<name>'``.
"""

from __future__ import annotations

from typing import Literal

from streamer.runtime.acl.aipp_dynamic import DynamicAippConfig, DynamicAippPlan
from streamer.runtime.acl.aipp_static import StaticAipp
from streamer.runtime.acl.gears import GearKind

__all__ = ["AippRuleError", "check_aipp_build", "check_dynamic_aipp"]

RULES_PAGE = 'seeds "动态Batch/动态分辨率/动态维度"'

DIMS_RULE = "AIPP never with dynamic dims"
BATCH_SIZE_RULE = "dynamic AIPP with dynamic batch: batchSize = the largest gear"
BATCH_MEMORY_RULE = "dynamic AIPP with dynamic batch: input memory for the largest batch"
HW_TRANSFORM_RULE = "dynamic AIPP with dynamic resolution: no crop, resize or padding"
HW_SOURCE_RULE = "dynamic AIPP with dynamic resolution: source size = the largest gear"
HW_MEMORY_RULE = "dynamic AIPP with dynamic resolution: input memory for the largest resolution"


class AippRuleError(ValueError):
    """An AIPP setting breaks a documented combination rule; the message names the rule."""


def check_aipp_build(
    aipp: StaticAipp | DynamicAippConfig, dynamic: Literal["batch", "hw", "dims"] | None
) -> None:
    """Refuse an AIPP config combined with a dynamic option the docs forbid it with (the
    rules a build can break; the dynamic-AIPP parameters are checked by
    :func:`check_dynamic_aipp` when they are known).

    Args:
        aipp: the model's ``aipp_op`` block, static or dynamic.
        dynamic: the model's dynamic option (ATC ``--dynamic_batch_size`` = ``batch``,
            ``--dynamic_image_size`` = ``hw``, ``--dynamic_dims`` = ``dims``), or None.

    Raises:
        AippRuleError: the message names the rule and the settings at fault.
    """
    if dynamic == "dims":
        raise AippRuleError(
            f"rule '{DIMS_RULE}': {aipp.aipp_mode} AIPP and dynamic_dims cannot be used on one "
            f"model ({RULES_PAGE}: AIPP与动态维度不能同时使用)"
        )
    if dynamic != "hw" or not isinstance(aipp, StaticAipp):
        return
    if aipp.crop or aipp.padding:
        raise AippRuleError(
            f"rule 'static AIPP with dynamic resolution: no crop or padding': crop = "
            f"{aipp.crop}, padding = {aipp.padding} with dynamic_image_size ({RULES_PAGE})"
        )
    if aipp.src_image_size_w or aipp.src_image_size_h:
        raise AippRuleError(
            f"rule 'static AIPP with dynamic resolution: source size 0': src_image_size_w = "
            f"{aipp.src_image_size_w}, src_image_size_h = {aipp.src_image_size_h} with "
            f"dynamic_image_size; set both to 0 ({RULES_PAGE})"
        )


def check_dynamic_aipp(plan: DynamicAippPlan) -> None:
    """Refuse a dynamic-AIPP plan that breaks a combination rule (module docstring).

    Raises:
        AippRuleError: the message names the rule, the model and the values at fault.
    """
    where = f"model {plan.model!r}"
    if plan.kind == GearKind.DIMS:
        raise AippRuleError(
            f"rule '{DIMS_RULE}': {where} has dynamic AIPP and dynamic_dims gears; rebuild it "
            f"with one of them ({RULES_PAGE}: AIPP与动态维度不能同时使用)"
        )
    if plan.batch_size != plan.largest_batch:
        raise AippRuleError(
            f"rule '{BATCH_SIZE_RULE}': {where} would create its aclmdlAIPP with batchSize "
            f"{plan.batch_size}, its largest batch is {plan.largest_batch} ({RULES_PAGE})"
        )
    if plan.kind == GearKind.HW:
        _check_resolution(plan, where)
    if plan.input_bytes < plan.largest_input_bytes:
        rule = HW_MEMORY_RULE if plan.kind == GearKind.HW else BATCH_MEMORY_RULE
        height, width = plan.largest_resolution
        raise AippRuleError(
            f"rule '{rule}': {where}'s image input holds {plan.input_bytes} bytes, "
            f"{plan.largest_batch} × {height} × {width} × 3 = {plan.largest_input_bytes} "
            f"needed; build it with ATC max_src_image_size ≥ {plan.largest_input_bytes} "
            f"({RULES_PAGE})"
        )


def _check_resolution(plan: DynamicAippPlan, where: str) -> None:
    """Raises: AippRuleError: the two dynamic-resolution rules of :func:`check_dynamic_aipp`."""
    if plan.crop or plan.resize or plan.padding:
        raise AippRuleError(
            f"rule '{HW_TRANSFORM_RULE}': {where} has resolution gears and the AIPP parameters "
            f"switch on crop = {plan.crop}, resize = {plan.resize}, padding = {plan.padding} "
            f"({RULES_PAGE})"
        )
    if plan.params.source_size != plan.largest_resolution:
        raise AippRuleError(
            f"rule '{HW_SOURCE_RULE}': {where} would set source size (h, w) "
            f"{list(plan.params.source_size)}, its largest resolution gear is "
            f"{list(plan.largest_resolution)}; every frame is letterboxed to that gear "
            f"(leave the letterbox `size` unset or set it to that gear) ({RULES_PAGE})"
        )

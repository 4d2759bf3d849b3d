"""The simulated dynamic AIPP functions of ``acl.mdl`` (pyACL formats from RT
``python/pyACL/mdl/mdl_wrap.cpp``; pages RT ``python/docs/zh/api_ref/ge/function-*.md``).

Function (argument format) → result:

- ``create_aipp(batch_size)`` (``K``) → handle, 0 on failure
- ``destroy_aipp(set)`` (``k``) → code
- ``get_aipp_data_size(batch_size)`` (``K``) → ``(bytes, code)``
- ``set_aipp_input_format(set, fmt)`` (``kI``) → code
- ``set_aipp_csc_params(set, switch, 9 × matrix, 3 × output bias, 3 × input bias)``
  (``kbhhhhhhhhhBBBBBB``) → code
- ``set_aipp_rbuv_swap_switch(set, switch)`` (``kb``) → code
- ``set_aipp_src_image_size(set, width, height)`` (``kii``) → code
- ``set_aipp_dtc_pixel_mean(set, 4 × int, batch_index)`` (``khhhhK``) → code
- ``set_aipp_dtc_pixel_min(set, 4 × float, batch_index)`` (``kffffK``) → code
- ``set_aipp_pixel_var_reci(set, 4 × float, batch_index)`` (``kffffK``) → code
- ``set_input_aipp(model_id, dataset, index, set)`` (``Ikkk``) → code
- ``get_first_aipp_info(model_id, index)`` (``Ik``) → ``(aclAippInfo as a dict, code)``:
  a static AIPP's parameters under the struct's member names; for a dynamic AIPP only the
  members the page says are valid then (none of them is simulated: an empty dict); no AIPP
  on that input → 145015 ``ACL_ERROR_GE_AIPP_NOT_EXIST``

The rules are in :mod:`~streamer.runtime.acl.sim.aipp_sets` (the setters) and
:mod:`~streamer.runtime.acl.sim.aipp_model` (``set_input_aipp`` and execution).
"""

from __future__ import annotations

from types import ModuleType
from typing import TYPE_CHECKING, Any

from streamer.runtime.acl.aipp_static import StaticAipp
from streamer.runtime.acl.constants import AclCode
from streamer.runtime.acl.sim.aipp_data import aipp_data_size
from streamer.runtime.acl.sim.binding import SimError

if TYPE_CHECKING:
    from streamer.runtime.acl.sim.simulator import Simulator

__all__ = ["build_aipp"]


def build_aipp(sim: Simulator, mdl: ModuleType) -> None:
    """Add the dynamic AIPP functions to ``acl.mdl``."""
    _lifecycle(sim, mdl)
    _setters(sim, mdl)
    _per_batch(sim, mdl)


def _lifecycle(sim: Simulator, mdl: ModuleType) -> None:
    export, sets = sim.binder.export, sim.aipp_sets

    def destroy_aipp(handle: int) -> int:
        sets.destroy(handle)
        return 0

    def get_aipp_data_size(batch_size: int) -> tuple[int, int]:
        if batch_size == 0:
            raise SimError(AclCode.ERROR_INVALID_PARAM, "AIPP", "batch_size must be positive")
        return aipp_data_size(batch_size), 0

    def set_input_aipp(model_id: int, dataset: int, index: int, handle: int) -> int:
        model = sim.models.find(model_id)
        sim.models.set_input_aipp(model, dataset, index, sets.get(handle))
        return 0

    export(mdl, "acl.mdl.create_aipp", "K", "handle", sets.create)
    export(mdl, "acl.mdl.destroy_aipp", "k", "ret", destroy_aipp)
    export(mdl, "acl.mdl.get_aipp_data_size", "K", "pair", get_aipp_data_size)

    def get_first_aipp_info(model_id: int, index: int) -> tuple[dict[str, Any], int]:
        image = sim.models.find(model_id).image
        if index == 0 and image.static_aipp is not None:
            return _aipp_info(image.static_aipp), 0
        if index == 0 and image.aipp is not None:
            return {}, 0
        raise SimError(AclCode.ERROR_GE_AIPP_NOT_EXIST, None, f"no AIPP on input {index}")

    export(mdl, "acl.mdl.set_input_aipp", "Ikkk", "ret", set_input_aipp)
    export(mdl, "acl.mdl.get_first_aipp_info", "Ik", "pair", get_first_aipp_info)


def _aipp_info(aipp: StaticAipp) -> dict[str, Any]:
    """``aclAippInfo`` of a static ``aipp_op``, as pyACL's dict (its member names)."""
    info: dict[str, Any] = {
        "srcImageSizeW": aipp.src_image_size_w,
        "srcImageSizeH": aipp.src_image_size_h,
        "cropSwitch": int(aipp.crop),
        "paddingSwitch": int(aipp.padding),
        "cscSwitch": int(aipp.csc_switch),
        "rbuvSwapSwitch": int(aipp.rbuv_swap_switch),
    }
    for channel in range(3):
        info[f"meanChn{channel}"] = getattr(aipp, f"mean_chn_{channel}")
        info[f"minChn{channel}"] = getattr(aipp, f"min_chn_{channel}")
        info[f"varReciChn{channel}"] = getattr(aipp, f"var_reci_chn_{channel}")
    return info


def _setters(sim: Simulator, mdl: ModuleType) -> None:
    export, sets = sim.binder.export, sim.aipp_sets

    def input_format(handle: int, value: int) -> int:
        sets.set_input_format(handle, value)
        return 0

    def csc_params(handle: int, switch: int, *values: int) -> int:
        sets.set_csc(handle, switch, values[:9], values[9:])
        return 0

    def rbuv_swap_switch(handle: int, switch: int) -> int:
        sets.set_rbuv_swap(handle, switch)
        return 0

    def src_image_size(handle: int, width: int, height: int) -> int:
        sets.set_src_image_size(handle, width, height)
        return 0

    export(mdl, "acl.mdl.set_aipp_input_format", "kI", "ret", input_format)
    export(mdl, "acl.mdl.set_aipp_csc_params", "kb" + "h" * 9 + "B" * 6, "ret", csc_params)
    export(mdl, "acl.mdl.set_aipp_rbuv_swap_switch", "kb", "ret", rbuv_swap_switch)
    export(mdl, "acl.mdl.set_aipp_src_image_size", "kii", "ret", src_image_size)


def _per_batch(sim: Simulator, mdl: ModuleType) -> None:
    export, sets = sim.binder.export, sim.aipp_sets

    def mean(handle: int, c0: int, c1: int, c2: int, c3: int, batch_index: int) -> int:
        sets.set_mean(handle, (c0, c1, c2, c3), batch_index)
        return 0

    def minimum(handle: int, c0: float, c1: float, c2: float, c3: float, index: int) -> int:
        sets.set_min(handle, (c0, c1, c2, c3), index)
        return 0

    def var_reci(handle: int, c0: float, c1: float, c2: float, c3: float, index: int) -> int:
        sets.set_var_reci(handle, (c0, c1, c2, c3), index)
        return 0

    export(mdl, "acl.mdl.set_aipp_dtc_pixel_mean", "khhhhK", "ret", mean)
    export(mdl, "acl.mdl.set_aipp_dtc_pixel_min", "kffffK", "ret", minimum)
    export(mdl, "acl.mdl.set_aipp_pixel_var_reci", "kffffK", "ret", var_reci)

"""Static AIPP at model load: the parameters baked into the ``.om`` against the letterbox's.

ATC bakes a static ``aipp_op`` into the model (``--insert_op_conf``). A model built before the
letterbox's ``mean``, ``std`` or ``color`` changed normalises differently, silently: its
detections degrade and nothing fails. So when the letterbox says ``normalize = "device"``
with static AIPP, the model's own parameters are read back with
``acl.mdl.get_first_aipp_info`` and compared with what the letterbox asks for
(:meth:`~streamer.runtime.acl.aipp_static.StaticAipp.from_normalization`). pyACL returns
``aclAippInfo`` as a dict keyed by its member names (``rbuvSwapSwitch``, ``meanChn0``,
``minChn0``, ``varReciChn0``, …; RT ``python/pyACL/mdl/mdl_wrap.cpp``). AIPP computes
``(x - mean_chn - min_chn) · var_reci_chn``, so the offsets are compared as
``mean_chn + min_chn``, and within float16 rounding (the AI Core's precision).
"""

from __future__ import annotations

import math
from typing import Any

from streamer.config import PluginConfig
from streamer.errors import ModelError
from streamer.runtime.acl.aipp_static import StaticAipp
from streamer.runtime.acl.constants import AclCode
from streamer.runtime.letterbox_keys import letterbox_keys

__all__ = ["verify_static_aipp"]

_SWITCHES_OFF = ("cscSwitch", "cropSwitch", "paddingSwitch")
_FLOAT16_RELATIVE = 1e-3  # float16 keeps 11 significant bits: 2**-11 ≈ 4.9e-4


def verify_static_aipp(acl: Any, model_id: int, name: str, table: PluginConfig | None) -> None:
    """Check the static AIPP of the model's image input (input 0) against the letterbox
    ``table``; nothing to do unless it says ``normalize = "device"``, ``aipp = "static"``.

    Raises:
        ConfigError: the letterbox keys are invalid.
        ModelError: the model has no static AIPP, or its channel swap, offsets or scales are
            not the letterbox's (the message lists each, and how to rebuild the model).
    """
    keys = letterbox_keys(table)
    if keys is None or keys.normalize != "device" or keys.aipp != "static":
        return
    info, ret = acl.mdl.get_first_aipp_info(model_id, 0)
    if ret != 0 or not info:
        why = "it has none" if ret == AclCode.ERROR_GE_AIPP_NOT_EXIST else f"error {ret}"
        raise ModelError(
            f'model {name!r}: preprocess.normalize = "device" needs a model built with static '
            f"AIPP (ATC --insert_op_conf, `streamer models aipp`); reading it back: {why}"
        )
    expected = StaticAipp.from_normalization(keys.normalization(), 0, 0)
    problems = _differences(info, expected)
    if problems:
        raise ModelError(
            f"model {name!r}: its static AIPP does not do what preprocess says (an .om built "
            f"for another mean, std or color?): {'; '.join(problems)}; rebuild it with "
            f"`streamer models aipp --model {name}` as ATC's --insert_op_conf"
        )


def _differences(info: dict[str, Any], expected: StaticAipp) -> list[str]:
    """What the model's ``aclAippInfo`` does differently from ``expected``."""
    problems = [f"{key} is on" for key in _SWITCHES_OFF if info.get(key)]
    if bool(info.get("rbuvSwapSwitch")) != expected.rbuv_swap_switch:
        problems.append(
            f"rbuvSwapSwitch {bool(info.get('rbuvSwapSwitch'))}, the letterbox needs "
            f"{expected.rbuv_swap_switch}"
        )
    for channel in range(3):
        offset = float(info.get(f"meanChn{channel}", 0)) + float(info.get(f"minChn{channel}", 0))
        want = getattr(expected, f"mean_chn_{channel}") + getattr(expected, f"min_chn_{channel}")
        if not _close(offset, want):
            problems.append(f"channel {channel} offset (mean + min) {offset:g}, needs {want:g}")
        scale = float(info.get(f"varReciChn{channel}", 0))
        want = getattr(expected, f"var_reci_chn_{channel}")
        if not _close(scale, want):
            problems.append(f"channel {channel} var_reci {scale:g}, needs {want:g}")
    return problems


def _close(actual: float, expected: float) -> bool:
    return math.isclose(actual, expected, rel_tol=_FLOAT16_RELATIVE, abs_tol=1e-6)

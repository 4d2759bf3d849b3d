"""An ``aclmdlAIPP`` parameter set: filled once at load, written into each batch's dataset.

Calls (pyACL formats from RT ``python/pyACL/mdl/mdl_wrap.cpp``; pages RT
``python/docs/zh/api_ref/ge/function-<name>.md``):

=============================================  ==============================================
``create_aipp(batch_size)`` → handle           0 on failure (``batch_size`` 0)
``set_aipp_input_format(set, fmt)``            ``aclAippInputFormat``; ``RGB888_U8`` here
``set_aipp_csc_params(set, switch, 9 × m,``    colour-space conversion; switched off here
``  3 × output bias, 3 × input bias)``
``set_aipp_rbuv_swap_switch(set, 0 | 1)``      exchange R and B before the conversion
``set_aipp_src_image_size(set, w, h)``         mandatory; width first
``set_aipp_dtc_pixel_mean(set, 4 × int, i)``   per batch index ``i`` < ``batch_size``
``set_aipp_dtc_pixel_min(set, 4 × float, i)``  idem
``set_aipp_pixel_var_reci(set, 4 × float, i)`` idem
``set_input_aipp(model, dataset, index, set)`` ``index`` of ``ascend_dynamic_aipp_data``
``destroy_aipp(set)``
=============================================  ==============================================

``set_input_aipp`` writes the parameters into the dataset's buffer at ``index`` (GE
``GeExecutor::SetDynamicAippData``), so it is called once per batch, on the enqueue thread
that builds the batch's input dataset. The memory of that input is not written by the
application (seeds "动态Batch/动态分辨率/动态维度": "无需用户设置该内存中的数据").
"""

from __future__ import annotations

from typing import Any

from streamer.runtime.acl.aipp_dynamic import DynamicAippParams
from streamer.runtime.acl.constants import AippInputFormat
from streamer.runtime.acl.errors import check_handle, check_ret
from streamer.runtime.acl.teardown import Teardown

__all__ = ["AippSet"]

_CSC_OFF = (0,) + (0,) * 9 + (0,) * 6
"""``set_aipp_csc_params`` arguments after the handle: switch off, matrix and biases zero."""


class AippSet:
    """The ``aclmdlAIPP`` of one dynamic-AIPP model.

    Args:
        acl: the pyACL module.
        model_id: the loaded model.
        index: the model input index of ``ascend_dynamic_aipp_data``.
        batch_size: the set's batch size: the model's largest batch.
        params: the values, set on every batch index.
        teardown: gets ``acl.mdl.destroy_aipp``.

    Raises:
        AclError: ``create_aipp`` returned 0 or a setter failed (the set is destroyed by
            ``teardown``).
    """

    def __init__(
        self,
        acl: Any,
        model_id: int,
        index: int,
        batch_size: int,
        params: DynamicAippParams,
        teardown: Teardown,
    ) -> None:
        self._acl = acl
        self._model_id = model_id
        self.index = index
        self.handle = check_handle(acl.mdl.create_aipp(batch_size), "acl.mdl.create_aipp")
        teardown.push("acl.mdl.destroy_aipp", acl.mdl.destroy_aipp, self.handle)
        self._fill(params, batch_size)

    def apply(self, dataset: int) -> None:
        """Write the parameters into the dynamic AIPP input of the input ``dataset``
        (``acl.mdl.set_input_aipp``); call with the model's context current, from the
        thread that executes the dataset, before the execution.

        Raises:
            AclError: the runtime refused the parameters or the dataset.
        """
        ret = self._acl.mdl.set_input_aipp(self._model_id, dataset, self.index, self.handle)
        check_ret(ret, "acl.mdl.set_input_aipp")

    def _fill(self, params: DynamicAippParams, batch_size: int) -> None:
        mdl, handle = self._acl.mdl, self.handle
        height, width = params.source_size
        _call(mdl.set_aipp_input_format, "input_format", handle, int(AippInputFormat.RGB888_U8))
        _call(mdl.set_aipp_csc_params, "csc_params", handle, *_CSC_OFF)
        _call(mdl.set_aipp_rbuv_swap_switch, "rbuv_swap_switch", handle, int(params.swap_rb))
        _call(mdl.set_aipp_src_image_size, "src_image_size", handle, width, height)
        for index in range(batch_size):
            _call(mdl.set_aipp_dtc_pixel_mean, "dtc_pixel_mean", handle, *params.mean_chn, index)
            _call(mdl.set_aipp_dtc_pixel_min, "dtc_pixel_min", handle, *params.min_chn, index)
            _call(
                mdl.set_aipp_pixel_var_reci, "pixel_var_reci", handle, *params.var_reci_chn, index
            )


def _call(fn: Any, name: str, *args: Any) -> None:
    """``acl.mdl.set_aipp_<name>(*args)``, checked.

    Raises:
        AclError: it returned non-zero.
    """
    check_ret(fn(*args), f"acl.mdl.set_aipp_{name}")

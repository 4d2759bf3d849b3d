"""Dynamic AIPP on a simulated model: the checks of ``set_input_aipp`` and the run-time feeds.

``acl.mdl.set_input_aipp`` checks the parameters against the model before writing them (GE
``api/acl/acl_model/model/acl_aipp.cpp``, ``aclmdlSetInputAIPPImpl``; ``aipp_param_check.cpp``),
each failure ``ACL_ERROR_INVALID_PARAM``:

- the input format and the source size must have been set;
- the source images, batch size × width × height × 3 bytes for ``RGB888_U8``, must fit the
  ATC ``max_src_image_size`` (rule: input memory for the largest batch / resolution);
- the AIPP output must have the model's shape at its largest gear: batch size = N (rule:
  dynamic AIPP with dynamic batch, batchSize = the largest gear) and, with no crop or padding,
  source width × height = the model's W × H (rule: dynamic AIPP with dynamic resolution,
  source size = the largest gear).

The simulator runs ``RGB888_U8`` without colour-space conversion only; other formats and CSC
are refused with ``ACL_ERROR_FEATURE_UNSUPPORTED``. At execution the parameters are read back
from the AIPP input; a dataset whose AIPP input was never written fails with
``ACL_ERROR_GE_AIPP_NOT_EXIST`` (what the device does with such memory is not documented),
and a resolution gear other than the source size, which the rules forbid, with
``ACL_ERROR_INVALID_PARAM``. The parameters of batch index ``n`` normalise image ``n``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np
import onnxruntime as ort

from streamer.runtime.acl.aipp_dynamic import RGB_CHANNELS
from streamer.runtime.acl.aipp_rules import (
    BATCH_MEMORY_RULE,
    BATCH_SIZE_RULE,
    HW_MEMORY_RULE,
    HW_SOURCE_RULE,
)
from streamer.runtime.acl.constants import AclCode, AippInputFormat
from streamer.runtime.acl.sim.aipp_data import AippParameters
from streamer.runtime.acl.sim.binding import SimError
from streamer.runtime.graph_preprocess import RUNTIME_OFFSET, RUNTIME_ORDER, RUNTIME_SCALE

if TYPE_CHECKING:
    from streamer.runtime.acl.sim.image import ModelImage

__all__ = ["check_parameters", "neutral_feeds", "parameter_feeds", "runtime_dtype"]

_RULE = "AIPP"
_FLOAT_TYPES: dict[str, np.dtype[Any]] = {
    "tensor(float)": np.dtype(np.float32),
    "tensor(float16)": np.dtype(np.float16),
    "tensor(double)": np.dtype(np.float64),
}
_KEEP = np.array([0, 1, 2], np.int64)
_SWAP = np.array([2, 1, 0], np.int64)


def check_parameters(image: ModelImage, params: AippParameters) -> None:
    """The checks of ``set_input_aipp`` (module docstring) for the dynamic-AIPP ``image``.

    Raises:
        SimError: ``ACL_ERROR_INVALID_PARAM`` for a broken check, the rule named where the
            seeds give one; ``ACL_ERROR_FEATURE_UNSUPPORTED`` for what is not simulated.
    """
    assert image.aipp is not None, "a dynamic-AIPP model"
    _check_set(params)
    width, height = params.src_image_size
    source_bytes = params.batch_size * width * height * RGB_CHANNELS
    if source_bytes > image.aipp.max_src_image_size:
        rule = HW_MEMORY_RULE if image.kind.value == "hw" else BATCH_MEMORY_RULE
        raise _invalid(
            f"rule '{rule}': the dynamic aipp size {source_bytes} is bigger than "
            f"max_src_image_size {image.aipp.max_src_image_size}"
        )
    largest = max(image.shapes.values(), key=lambda shapes: int(np.prod(shapes[0])))[0]
    if params.batch_size != largest[0]:
        raise _invalid(
            f"rule '{BATCH_SIZE_RULE}': aclmdlAIPP batch size {params.batch_size}, the model's "
            f"largest batch is {largest[0]}"
        )
    if (height, width) != (largest[1], largest[2]):
        raise _invalid(
            f"rule '{HW_SOURCE_RULE}': source size (h, w) {[height, width]}, the model's "
            f"input at its largest gear is {[largest[1], largest[2]]}"
        )


def _check_set(params: AippParameters) -> None:
    """Raises: SimError: format or size not set, or what the simulator does not run."""
    if not params.input_format:
        raise _invalid("the input format must be set (acl.mdl.set_aipp_input_format)")
    if not all(params.src_image_size):
        raise _invalid("srcImageSizeW and srcImageSizeH must be set")
    if params.input_format != AippInputFormat.RGB888_U8 or params.csc_switch:
        raise SimError(
            AclCode.ERROR_FEATURE_UNSUPPORTED,
            _RULE,
            "the simulator runs dynamic AIPP on RGB888_U8 without colour-space conversion only",
        )


def runtime_dtype(session: ort.InferenceSession) -> np.dtype[Any]:
    """The float type of the graph's runtime AIPP parameters."""
    arg = next(a for a in session.get_inputs() if a.name == RUNTIME_OFFSET)
    return _FLOAT_TYPES[arg.type]


def parameter_feeds(
    params: AippParameters, shape: tuple[int, ...], dtype: np.dtype[Any]
) -> dict[str, np.ndarray]:
    """The graph inputs that apply ``params`` to pixels of ``shape`` (N, H, W, 3).

    Raises:
        SimError: ``ACL_ERROR_INVALID_PARAM`` when the pixels' H × W is not the source size
            (rule: dynamic AIPP with dynamic resolution, source size = the largest gear).
    """
    batch, height, width = shape[:3]
    if (width, height) != params.src_image_size:
        raise _invalid(
            f"rule '{HW_SOURCE_RULE}': executing at (h, w) {[height, width]} with AIPP source "
            f"size {[params.src_image_size[1], params.src_image_size[0]]}"
        )
    offset = (
        params.mean[:batch, :RGB_CHANNELS].astype(np.float64) + params.min[:batch, :RGB_CHANNELS]
    )
    scale = params.var_reci[:batch, :RGB_CHANNELS]
    return {
        RUNTIME_OFFSET: offset.astype(dtype).reshape(batch, 1, 1, RGB_CHANNELS),
        RUNTIME_SCALE: scale.astype(dtype).reshape(batch, 1, 1, RGB_CHANNELS),
        RUNTIME_ORDER: _SWAP if params.rbuv_swap_switch else _KEEP,
    }


def neutral_feeds(batch: int, dtype: np.dtype[Any]) -> dict[str, np.ndarray]:
    """Graph inputs that leave ``batch`` images' pixels as they are (offset 0, scale 1)."""
    shape = (batch, 1, 1, RGB_CHANNELS)
    return {
        RUNTIME_OFFSET: np.zeros(shape, dtype),
        RUNTIME_SCALE: np.ones(shape, dtype),
        RUNTIME_ORDER: _KEEP,
    }


def _invalid(message: str) -> SimError:
    return SimError(AclCode.ERROR_INVALID_PARAM, _RULE, message)

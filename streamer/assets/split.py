"""Cutting a model in two at intermediate tensors, for a chain of models (the ``tensor``
adapter): :data:`~streamer.assets.catalog.SPLITS`.

The part between the named inputs and outputs is extracted with onnx's ``Extractor``
(``onnx.utils``) after shape inference, so the cut tensors get their full shapes; the batch
dim stays the symbolic ``batch`` of the source. The two parts compute exactly what the whole
model computes (the same nodes and weights).
"""

from __future__ import annotations

from pathlib import Path

import onnx
import onnx.utils
from onnx import shape_inference

from streamer.assets.catalog import Split
from streamer.errors import AssetError

__all__ = ["split_model"]


def split_model(split: Split, source: Path, target: Path) -> None:
    """Write the part ``split`` of the ONNX model ``source`` to ``target``.

    Raises:
        AssetError: ``source`` is unreadable, lacks one of the tensors, or the part is not
            a valid model.
    """
    try:
        model = shape_inference.infer_shapes(onnx.load(str(source)))
        part = onnx.utils.Extractor(model).extract_model(list(split.inputs), list(split.outputs))
        onnx.checker.check_model(part)
    except Exception as exc:  # onnx raises DecodeError, ValueError, OSError, ValidationError
        raise AssetError(f"cannot cut {split.name} out of {source.name}: {exc}") from exc
    onnx.save(part, str(target))

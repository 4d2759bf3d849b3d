"""The operators on onnxruntime: one single-node graph session per operator kind and dtype.

Each session is built on first use from :mod:`streamer.runtime.ops.graphs` and reused by every
later call, from any thread (``InferenceSession.run`` is thread-safe). ONNX
``NonMaxSuppression`` has a data-dependent output shape (``[k, 3]``), which onnxruntime sizes
itself; nothing here pads or trims. onnxruntime's models return host arrays, and these
operators read host arrays only (:func:`~streamer.runtime.ops.views.host_view`).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import onnx
import onnxruntime as ort

from streamer.errors import FrameError, Reason
from streamer.runtime.ops.base import (
    NO_SCORE_THRESHOLD,
    Operators,
    check_gather_inputs,
    check_nms_inputs,
    check_top_k_inputs,
)
from streamer.runtime.ops.graphs import (
    GATHER_INPUTS,
    NMS_INPUTS,
    TOP_K_INPUTS,
    gather_graph,
    nms_graph,
    top_k_graph,
)
from streamer.runtime.ops.views import host_view, view_shape

if TYPE_CHECKING:
    from streamer.runtime.base import Tensor

__all__ = ["OnnxOperators"]


class OnnxOperators(Operators):
    """NMS and top-k as onnxruntime single-node graphs.

    Args:
        providers: execution providers of the sessions (default: the CPU provider).
        intra_op_threads: threads per ``session.run`` (0 = onnxruntime's choice).
    """

    name = "onnxruntime"

    def __init__(self, providers: list[str] | None = None, intra_op_threads: int = 1) -> None:
        self._providers = providers or ["CPUExecutionProvider"]
        self._threads = intra_op_threads
        self._lock = threading.Lock()
        self._sessions: dict[tuple[str, str], ort.InferenceSession] = {}

    def nms(
        self,
        boxes: np.ndarray,
        scores: np.ndarray,
        max_output_boxes_per_class: int,
        iou_threshold: float,
        score_threshold: float = NO_SCORE_THRESHOLD,
    ) -> np.ndarray:
        check_nms_inputs(boxes, scores, max_output_boxes_per_class)
        feed: dict[str, np.ndarray] = dict(
            zip(
                NMS_INPUTS,
                (
                    np.ascontiguousarray(boxes),
                    np.ascontiguousarray(scores),
                    np.array([max_output_boxes_per_class], np.int64),
                    np.array([iou_threshold], np.float32),
                    np.array([score_threshold], np.float32),
                ),
                strict=True,
            )
        )
        (selected,) = self._run("NonMaxSuppression", np.dtype(np.float32), nms_graph, feed)
        return np.asarray(selected, np.int64).reshape(-1, 3)

    def top_k(
        self, x: Tensor, k: int, shape: Sequence[int] | None = None
    ) -> tuple[np.ndarray, np.ndarray]:
        dims = view_shape(x, shape)
        check_top_k_inputs(x.dtype, dims, k)
        feed = dict(zip(TOP_K_INPUTS, (host_view(x, dims), np.array([k], np.int64)), strict=True))
        values, indices = self._run("TopK", x.dtype, lambda: top_k_graph(x.dtype), feed)
        return values, indices

    def gather_rows(
        self, x: Tensor, rows: np.ndarray, shape: Sequence[int] | None = None
    ) -> np.ndarray:
        dims = view_shape(x, shape)
        check_gather_inputs(x.dtype, dims, rows)
        feed = dict(zip(GATHER_INPUTS, (host_view(x, dims), rows.astype(np.int64)), strict=True))
        (gathered,) = self._run("Gather", x.dtype, lambda: gather_graph(x.dtype), feed)
        return gathered

    def close(self) -> None:
        """Drop the sessions (onnxruntime frees them with the last reference)."""
        with self._lock:
            self._sessions.clear()

    def _run(
        self,
        kind: str,
        dtype: np.dtype[Any],
        build: Callable[[], onnx.ModelProto],
        feed: Mapping[str, np.ndarray],
    ) -> list[np.ndarray]:
        """Run the session of (``kind``, ``dtype``), building it with ``build`` the first time.

        Raises:
            FrameError: ``postprocess_failed``: onnxruntime refused the inputs or failed.
        """
        session = self._session(kind, dtype, build)
        try:
            outputs: list[np.ndarray] = session.run(None, dict(feed))
        except Exception as exc:  # onnxruntime raises its own untyped pybind exceptions
            raise FrameError(Reason.POSTPROCESS_FAILED, f"operator {kind}: {exc}") from exc
        return outputs

    def _session(
        self, kind: str, dtype: np.dtype[Any], build: Callable[[], onnx.ModelProto]
    ) -> ort.InferenceSession:
        key = (kind, dtype.str)
        with self._lock:
            session = self._sessions.get(key)
            if session is None:
                options = ort.SessionOptions()
                options.intra_op_num_threads = self._threads
                options.log_severity_level = 3
                session = ort.InferenceSession(
                    build().SerializeToString(), options, providers=self._providers
                )
                self._sessions[key] = session
        return session

"""A check that a backend's operators run, and run right, before any frame needs them.

A postprocessor with ``nms = "operator"`` fails every frame when an operator cannot run
where the pipeline runs it: on an Ascend device an operator that is neither in the operator
library's dynamic-shape kernels nor compiled beforehand, an output with no bound and no
``runtime.options.op_max_shapes``, an output bound too large for the device's memory. Running
each operator once on a small case with a known answer at load turns that into a start (or
``streamer check``, or reload) that fails with the reason, instead of a daemon that serves
nothing but ``postprocess_failed``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from streamer.errors import BackendError, ConfigError, FrameError

if TYPE_CHECKING:
    from streamer.runtime.ops.base import Operators

__all__ = ["check_operators"]

_BOXES = np.array([[[0, 0, 10, 10], [1, 1, 11, 11], [20, 20, 30, 30]]], np.float32)
_SCORES = np.array([[[0.9, 0.8, 0.7]]], np.float32)
_KEPT = np.array([[0, 0, 0], [0, 0, 2]], np.int64)
"""Box 1 overlaps box 0 (IoU 0.68 > 0.5) and has the lower score; box 2 overlaps nothing."""
_VALUES = np.array([[0.1, 0.9, 0.5]], np.float32)
_ROWS = np.arange(6, dtype=np.float32).reshape(3, 2)


def check_operators(operators: Operators) -> None:
    """Run ``nms``, ``top_k`` and ``gather_rows`` once each on the calling thread, on cases
    with a known answer.

    Raises:
        ConfigError: an operator cannot run for want of a setting (the message names it).
        BackendError: an operator failed to run (the backend's reason), or gave a wrong
            answer.
    """
    try:
        kept = operators.nms(_BOXES, _SCORES, 10, 0.5)
        values, indices = operators.top_k(_VALUES, 2)
        gathered = operators.gather_rows(_ROWS, np.array([2, 0]))
    except FrameError as error:
        kind = ConfigError if isinstance(error.__cause__, ConfigError) else BackendError
        raise kind(f"operators on {operators.name}: {error.detail}") from error
    wrong = [
        name
        for name, right in (
            ("nms", np.array_equal(kept, _KEPT)),
            (
                "top_k",
                np.array_equal(values, _VALUES[:, [1, 2]]) and np.array_equal(indices, [[1, 2]]),
            ),
            ("gather_rows", np.array_equal(gathered, [[4, 5], [0, 1]])),
        )
        if not right
    ]
    if wrong:
        raise BackendError(f"operators on {operators.name}: wrong results from {', '.join(wrong)}")

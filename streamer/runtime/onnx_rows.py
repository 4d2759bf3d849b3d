"""A batch cut into onnxruntime runs of a few rows (``[runtime.options] rows_per_run``).

A batch of more rows than ``rows_per_run`` runs as consecutive ``session.run`` calls over row
slices, their outputs joined along the batch axis. On a CPU a small run keeps a model's
activations in the core's cache: ``streamer bench`` measured BlazeFace at 1.18 ms a frame in
runs of 2 rows against 1.36 in runs of 8, while the pipeline's own cost per batch (hand-offs
between threads, postprocessing, metrics) favours batches of 8.

Cutting is exact for a model whose rows are independent and whose outputs are batch-first,
which the daemon's batching assumes anyway (its batches mix sources and pad with zero rows).
It applies to a model whose inputs and outputs all have the same named dynamic first
dimension (``batch``, ``N``). The first batch a model cuts whose rows differ also runs
whole, and the two results are compared (again on later batches until outputs with finite
values were compared; unless the whole run fails: ``rows_per_run_unchecked``); the shape of
every cut batch's outputs is checked too. A model that fails
either check (its rows mix, an output is not batch-first after all, or its shape varies by
batch) runs whole batches from then on, with one ``rows_per_run_off`` warning.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import onnxruntime as ort
import structlog

from streamer.runtime.base import Tensor

__all__ = ["RowRuns", "applied_rows"]

_RTOL = 1e-3
_ATOL = 1e-3
"""How far a cut batch's outputs may be from the whole batch's: a kernel picked for another
batch size sums in another order (BlazeFace: under 1e-4)."""
_log = structlog.get_logger(__name__)


def applied_rows(session: ort.InferenceSession, rows_per_run: int) -> int:
    """``rows_per_run`` where it applies to ``session``'s model, else 0 (whole batches): it
    applies when every input and output has the same named dynamic first dimension, the
    batch axis along which runs can be cut and joined."""
    tensors = (*session.get_inputs(), *session.get_outputs())
    firsts = {tuple(t.shape[:1]) for t in tensors}
    batch_first = len(firsts) == 1 and all(isinstance(d, str) for d in firsts.pop())
    return rows_per_run if batch_first else 0


class RowRuns:
    """Runs one model's batches, cut into runs of at most ``rows_per_run`` rows.

    Called on the model's worker thread only. It does not hold the session (the worker
    thread alone does, see :class:`~streamer.runtime.onnx.OnnxModel`).

    Args:
        model: the model's name, for the log.
        session: its session, to see whether its batch axis is named.
        rows_per_run: rows per run at most; 0 = whole batches.
        warned: names of the models ``rows_per_run_off`` was logged for, shared by the
            replicas of a backend, so that it is logged once per model.

    Attributes:
        rows_per_run: what applies: ``rows_per_run``, or 0 for a model without a named
            batch axis, or since one of its batches failed a check (module docstring).
    """

    def __init__(
        self,
        model: str,
        session: ort.InferenceSession,
        rows_per_run: int,
        warned: set[str] | None = None,
    ) -> None:
        self._model = model
        self._warned = warned if warned is not None else set()
        self._input_names = [t.name for t in session.get_inputs()]
        self.rows_per_run = applied_rows(session, rows_per_run)
        self._verified = False

    def run(self, session: ort.InferenceSession, inputs: Sequence[Tensor]) -> list[Any]:
        """One batch's outputs, batch first.

        Raises:
            Exception: whatever ``session.run`` raises (onnxruntime's untyped errors).
        """
        arrays = [x for x in inputs if isinstance(x, np.ndarray)]  # onnxruntime's, all
        rows, step = len(arrays[0]) if arrays else 0, self.rows_per_run
        if not step or rows <= step or len(arrays) < len(inputs):
            return self._once(session, inputs)
        starts = range(0, rows, step)
        runs = [self._once(session, [x[i : i + step] for x in arrays]) for i in starts]
        joined = _joined(runs, rows, step)
        if joined is None:
            return self._off(session, inputs, "an output is not batch-first or changes shape")
        if not self._verified and _rows_differ(arrays):
            return self._checked(session, inputs, joined)
        return joined

    def _checked(
        self, session: ort.InferenceSession, inputs: Sequence[Tensor], joined: list[Any]
    ) -> list[Any]:
        """A cut batch against the same batch run whole: the whole run's outputs if they
        differ (and whole batches from now on), else the cut ones. The check holds once it
        compared outputs with finite values (all NaN proves nothing; a column of -inf, as
        in masked logits, must not keep every batch running twice); until then each batch
        with rows that differ is checked. A
        whole run that fails (a batch too large for the device's memory, which rows_per_run
        may be there to avoid) leaves the cut batches unchecked, with a warning."""
        try:
            whole = self._once(session, inputs)
        except Exception as exc:  # onnxruntime raises its own untyped errors
            self._verified = True
            _log.warning("rows_per_run_unchecked", model=self._model, detail=str(exc))
            return joined
        if problem := _difference(joined, whole):
            self._off_with(problem)
            return whole
        numeric = [out for out in whole if _numeric(out)]
        self._verified = not numeric or any(np.isfinite(out).any() for out in numeric)
        return joined

    def _once(self, session: ort.InferenceSession, inputs: Sequence[Tensor]) -> list[Any]:
        outputs: list[Any] = session.run(None, dict(zip(self._input_names, inputs, strict=True)))
        return outputs

    def _off(
        self, session: ort.InferenceSession, inputs: Sequence[Tensor], problem: str
    ) -> list[Any]:
        self._off_with(problem)
        return self._once(session, inputs)

    def _off_with(self, problem: str) -> None:
        """Whole batches from now on, said once per model name."""
        rows, self.rows_per_run = self.rows_per_run, 0
        if self._model in self._warned:
            return
        self._warned.add(self._model)
        detail = f"{problem}: batches run whole"
        _log.warning("rows_per_run_off", model=self._model, rows_per_run=rows, detail=detail)


def _joined(runs: list[list[Any]], rows: int, step: int) -> list[Any] | None:
    """The runs' outputs joined along the batch axis, or None when an output of a run has
    not that run's rows first, or other trailing dimensions than the first run's."""
    for index, outputs in enumerate(runs):
        expected = min(step, rows - index * step)
        for out, first in zip(outputs, runs[0], strict=True):
            if np.shape(out)[:1] != (expected,) or np.shape(out)[1:] != np.shape(first)[1:]:
                return None
    return [np.concatenate(parts) for parts in zip(*runs, strict=True)]


def _rows_differ(arrays: list[np.ndarray]) -> bool:
    """Some input has two rows that differ (NaN never equals itself): batches of equal rows,
    such as black frames, cannot show rows that mix."""
    return any(not (x == x[:1]).all() for x in arrays)


def _numeric(array: Any) -> bool:
    return np.issubdtype(np.asarray(array).dtype, np.number)


def _difference(joined: list[Any], whole: list[Any]) -> str | None:
    """What differs between a cut batch's outputs and the whole batch's, or None."""
    for index, (cut, one) in enumerate(zip(joined, whole, strict=True)):
        if np.shape(cut) != np.shape(one):
            return f"output {index} is {list(np.shape(one))} whole, {list(np.shape(cut))} cut"
        if not np.allclose(cut, one, rtol=_RTOL, atol=_ATOL, equal_nan=True):
            return f"output {index} differs between whole and cut batches (rows not independent)"
    return None

"""The onnxruntime backend: the embedded default, on any CPU (or CUDA GPU).

Each loaded model runs ``InferenceSession.run`` on one worker thread behind the queue-bound
contract of :mod:`streamer.runtime.base`: ``enqueue`` hands a batch to the worker, ``dequeue``
returns finished batches in FIFO order, and at most ``max_in_flight`` batches are outstanding.

Backend options (``[runtime.options]``, validated by
:func:`~streamer.runtime.onnx_options.parse_onnx_options`; unknown keys are errors):
``intra_op_threads`` (int, 0 = onnxruntime's default), ``providers`` (list of execution
providers, default ``["CPUExecutionProvider"]``), ``rows_per_run`` (int, 0 = a batch in one
run).

``rows_per_run``: a batch of more rows runs as consecutive ``session.run`` calls of at most
that many rows (:mod:`~streamer.runtime.onnx_rows`).

In-graph preprocessing (issue 9, item 4): when the model's ``[models.preprocess]`` is a
``letterbox`` with ``normalize = "model"``, the model is rewritten at load time by
:func:`streamer.runtime.graph_preprocess.prepend_normalization` with the table's ``color``,
``mean``, ``std`` and ``layout``; its first input becomes uint8 NHWC BGR pixels and the host
only letterboxes. Likewise for an MTCNN item stage's table with ``normalize = "model"``
(:mod:`streamer.runtime.mtcnn_keys`): the graph casts, swaps R and B, normalises and
exchanges H and W, and the host only crops and resizes. ``normalize = "device"`` (ACL AIPP)
is refused here.
"""

from __future__ import annotations

import queue
import stat
import threading
import time
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
import structlog

from streamer.config import PluginConfig, RuntimeConfig
from streamer.errors import (
    BackendError,
    ConfigError,
    EnqueueInterruptedError,
    FrameError,
    ModelError,
    Reason,
)
from streamer.release import abandon
from streamer.runtime.base import (
    DYNAMIC,
    Backend,
    InferenceOutputs,
    ModelInfo,
    ModelSpec,
    QueueModel,
    Tensor,
    TensorInfo,
)
from streamer.runtime.graph_preprocess import InputNormalization, prepend_normalization
from streamer.runtime.letterbox_keys import letterbox_keys
from streamer.runtime.mtcnn_keys import mtcnn_keys
from streamer.runtime.onnx_options import parse_onnx_options
from streamer.runtime.onnx_rows import RowRuns
from streamer.runtime.ops.onnx_ops import OnnxOperators

__all__ = [
    "OnnxBackend",
    "OnnxModel",
    "in_graph_normalization",
    "open_session",
    "session_model_info",
]

_ONNX_DTYPES = {
    "tensor(float)": np.float32,
    "tensor(float16)": np.float16,
    "tensor(double)": np.float64,
    "tensor(uint8)": np.uint8,
    "tensor(int8)": np.int8,
    "tensor(int32)": np.int32,
    "tensor(int64)": np.int64,
    "tensor(bool)": np.bool_,
}
_POLL_S = 0.1
_CLOSE_TIMEOUT_S = 10.0
_log = structlog.get_logger(__name__)


def _tensor_info(arg: Any) -> TensorInfo:
    shape = tuple(d if isinstance(d, int) and d >= 0 else DYNAMIC for d in arg.shape)
    dtype = _ONNX_DTYPES.get(arg.type)
    if dtype is None:
        raise ModelError(f"tensor {arg.name!r} has unsupported type {arg.type}")
    return TensorInfo(arg.name, shape, np.dtype(dtype))


def session_model_info(
    name: str, session: ort.InferenceSession, batch_gears: tuple[int, ...] = ()
) -> ModelInfo:
    """Describe an onnxruntime session as a :class:`ModelInfo`.

    A static batch dim B gives ``batch_gears == (B,)``; a dynamic one takes ``batch_gears``
    (the configured gears; empty = any size).
    """
    inputs = tuple(_tensor_info(a) for a in session.get_inputs())
    outputs = tuple(_tensor_info(a) for a in session.get_outputs())
    first = inputs[0].shape[:1] if inputs else ()
    gears = batch_gears if first == (DYNAMIC,) or not first else (first[0],)
    return ModelInfo(name, inputs, outputs, batch_gears=gears)


def _provider_options(providers: list[str], device: int) -> list[dict[str, Any]]:
    """Per-provider options: the CUDA (or ROCm) provider runs on ``device``; others, none."""
    gpu = {"CUDAExecutionProvider", "ROCMExecutionProvider"}
    return [{"device_id": device} if p in gpu else {} for p in providers]


def open_session(spec: ModelSpec, options: Mapping[str, Any]) -> ort.InferenceSession:
    """An onnxruntime session for ``spec``: threads, providers (the GPU one on
    ``spec.device``) and in-graph preprocessing from ``options`` and ``spec``.

    Raises:
        ModelError: the file is missing or onnxruntime cannot load it.
        ConfigError: an option is unknown or invalid, or the preprocessing cannot go into
            the graph.
    """
    parsed = parse_onnx_options(options, f"model {spec.name!r} options")
    sess_options = ort.SessionOptions()
    sess_options.intra_op_num_threads = parsed.intra_op_threads
    sess_options.log_severity_level = 3
    providers = list(parsed.providers)
    try:
        mode = spec.path.stat().st_mode
        if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):  # /dev/zero would fill the memory
            # (a FIFO is left to block as a hung mount does: a load that blocks holds up
            # neither the watchdog nor a stop)
            raise ModelError(f"model {spec.name!r}: {spec.path} is not a regular file")
        with spec.path.open("rb"):
            pass
    except FileNotFoundError as exc:
        raise ModelError(f"model {spec.name!r}: no file at {spec.path}") from exc
    except OSError as exc:  # onnxruntime would say only "system error number 13"
        raise ModelError(f"model {spec.name!r}: cannot read {spec.path}: {exc.strerror}") from exc
    source = _model_source(spec)
    try:
        session = ort.InferenceSession(
            source,
            sess_options,
            providers=providers,
            provider_options=_provider_options(providers, spec.device),
        )
    except Exception as exc:  # onnxruntime raises its own untyped pybind exceptions
        raise ModelError(f"model {spec.name!r}: cannot load {spec.path}: {exc}") from exc
    _check_providers(spec, providers, session.get_providers())
    return session


def _check_providers(spec: ModelSpec, requested: list[str], active: list[str]) -> None:
    """A provider of the build may still fail to start (no GPU, no driver): onnxruntime then
    falls back to the next one asked for, or to the CPU, saying so only on stderr.

    Raises:
        BackendError: none of the providers asked for runs the session.
    """
    if not set(requested) & set(active):
        raise BackendError(
            f"model {spec.name!r}: none of runtime.options.providers {requested} could start "
            f"(onnxruntime fell back to {active}; is the device there?)"
        )
    if active[0] != requested[0]:
        _log.warning("provider_fallback", model=spec.name, requested=requested, active=active)


class OnnxBackend(Backend):
    """onnxruntime sessions behind the queue-bound contract.

    Args:
        config: ``[runtime]``; ``options`` as in the module docstring.

    Raises:
        ConfigError: ``runtime.options`` has an unknown key or an invalid value.
    """

    name = "onnxruntime"

    def __init__(self, config: RuntimeConfig) -> None:
        parsed = parse_onnx_options(config.options)
        self._options = dict(config.options)
        self._operators = OnnxOperators(list(parsed.providers), parsed.intra_op_threads)
        self._in_graph_said: set[tuple[str, InputNormalization]] = set()
        self._rows_ignored_said: set[str] = set()
        self._rows_off_said: set[str] = set()  # shared with its models' worker threads

    @classmethod
    def check_options(cls, config: RuntimeConfig) -> None:
        parse_onnx_options(config.options)

    def load(self, spec: ModelSpec) -> OnnxModel:
        options = {**self._options, **spec.options}
        rows_per_run = parse_onnx_options(options, f"model {spec.name!r} options").rows_per_run
        model = OnnxModel(spec, open_session(spec, options), rows_per_run, self._rows_off_said)
        self._say_in_graph(spec)
        self._say_rows_ignored(spec.name, rows_per_run, model.rows_per_run)
        return model

    def _say_in_graph(self, spec: ModelSpec) -> None:
        """Log ``preprocess_in_graph`` once per model and normalisation, not per replica or
        reload."""
        norm = in_graph_normalization(spec.preprocess)
        if norm is None or (spec.name, norm) in self._in_graph_said:
            return
        self._in_graph_said.add((spec.name, norm))
        _log.info("preprocess_in_graph", model=spec.name, layout=norm.layout, swap_rb=norm.swap_rb)

    def _say_rows_ignored(self, name: str, requested: int, applied: int) -> None:
        """Log ``rows_per_run_ignored`` once per model, not per replica or reload."""
        if requested == applied or name in self._rows_ignored_said:
            return
        self._rows_ignored_said.add(name)
        _log.warning(
            "rows_per_run_ignored",
            model=name,
            rows_per_run=requested,
            reason="the inputs and outputs share no named dynamic first dimension (batch "
            "axis): batches run whole",
        )

    def operators(self) -> OnnxOperators:
        """NMS and top-k as single-node graphs, on the configured providers and threads."""
        return self._operators

    def close(self) -> None:
        """Drop the operators' sessions; the models' sessions belong to the models."""
        self._operators.close()


def in_graph_normalization(table: PluginConfig | None) -> InputNormalization | None:
    """The normalisation to compose into the graph for the table that prepares the model's
    inputs (:attr:`ModelSpec.preprocess`).

    Returns:
        None unless the table is a ``letterbox`` or an MTCNN item stage with
        ``normalize = "model"``.

    Raises:
        ConfigError: ``normalize = "device"`` (ACL only), or a key the rewrite needs is
            invalid (named as ``preprocess.<key>`` / ``postprocess.<key>``), or a ``std`` is
            not positive.
    """
    letterbox = letterbox_keys(table)
    keys = letterbox or mtcnn_keys(table)
    if keys is None or keys.normalize == "host":
        return None
    if keys.normalize == "device":
        where = "preprocess" if letterbox else "postprocess"
        raise ConfigError(
            f'{where}.normalize: "device" is ACL AIPP (static or dynamic); onnxruntime '
            'composes the preprocessing into the graph with normalize = "model"'
        )
    return keys.normalization()


def _model_source(spec: ModelSpec) -> str | bytes:
    """The path to load, or the serialised rewritten model (in-graph preprocessing).

    Raises:
        ConfigError: see :func:`in_graph_normalization`; or the model's input does not take
            the configured preprocessing (a model that does not fit the config, not a
            damaged file).
        ModelError: the file cannot be read.
    """
    norm = in_graph_normalization(spec.preprocess)
    if norm is None:
        return str(spec.path)
    try:
        graph = onnx.load(str(spec.path))
    except Exception as exc:  # onnx raises DecodeError, OSError, …
        raise ModelError(f"model {spec.name!r}: cannot load {spec.path}: {exc}") from exc
    try:
        model = prepend_normalization(graph, norm)
    except Exception as exc:  # onnx raises ValueError, ValidationError, …
        raise ConfigError(
            f'model {spec.name!r}: normalize = "model" cannot compose the preprocessing into '
            f"{spec.path.name}: {exc}"
        ) from exc
    return model.SerializeToString()


class OnnxModel(QueueModel):
    """One onnxruntime session and its worker thread.

    The worker thread alone holds the session, so the session's memory (weights, arena) is
    freed as the worker ends at :meth:`close`, not whenever Python's cycle collector next
    runs: a daemon reloaded under load piled up its retired sessions, hundreds of MB.

    Args:
        spec: the model's name, batch gears and ``max_in_flight``.
        session: its open session, handed to the worker thread.
        rows_per_run: batch rows per ``session.run`` at most (module docstring); 0 = a batch
            in one run.
        warned: models ``rows_per_run_off`` was logged for (see
            :class:`~streamer.runtime.onnx_rows.RowRuns`).
    """

    def __init__(
        self,
        spec: ModelSpec,
        session: ort.InferenceSession,
        rows_per_run: int = 0,
        warned: set[str] | None = None,
    ) -> None:
        self.info = session_model_info(spec.name, session, spec.batch_gears)
        self._rows = RowRuns(spec.name, session, rows_per_run, warned)
        self._slots = threading.BoundedSemaphore(spec.max_in_flight)
        self._pending: queue.SimpleQueue[Sequence[Tensor] | None] = queue.SimpleQueue()
        self._done: queue.SimpleQueue[InferenceOutputs] = queue.SimpleQueue()
        self._closed = threading.Event()
        self._interrupted = threading.Event()
        # A daemon thread: a session.run wedged in native code cannot be interrupted, and it
        # must not keep the process alive after close() gave up on it.
        self._worker = threading.Thread(
            target=self._run, args=(session,), name=f"onnx-{spec.name}", daemon=True
        )
        self._worker.start()

    @property
    def rows_per_run(self) -> int:
        """Rows per ``session.run`` at most that apply now; 0 = whole batches."""
        return self._rows.rows_per_run

    def enqueue(self, inputs: Sequence[Tensor]) -> None:
        self._raise_if_stopped()
        while not self._slots.acquire(timeout=_POLL_S):
            self._raise_if_stopped()
        self._pending.put(inputs)

    def interrupt(self) -> None:
        self._interrupted.set()

    def _raise_if_stopped(self) -> None:
        if self._closed.is_set():
            raise EnqueueInterruptedError(f"model {self.info.name!r} is closed")
        if self._interrupted.is_set():
            raise EnqueueInterruptedError(f"model {self.info.name!r}: enqueue interrupted")

    def dequeue(self, timeout_ms: int) -> InferenceOutputs | None:
        try:
            done = self._done.get(timeout=timeout_ms / 1000)
        except queue.Empty:
            return None
        self._slots.release()
        return done

    def close(self) -> None:
        """Stop the worker after the batches already enqueued; give up after 10 s (a run
        wedged in onnxruntime), leaving the daemon thread behind."""
        if self._closed.is_set():
            return
        self._closed.set()
        self._pending.put(None)
        self._worker.join(_CLOSE_TIMEOUT_S)
        if self._worker.is_alive():
            _log.error("model_close_timeout", model=self.info.name, timeout_s=_CLOSE_TIMEOUT_S)
            worker = self._worker
            abandon(f"model {self.info.name!r}: {worker.name}/{worker.native_id}", worker.is_alive)

    def _run(self, session: ort.InferenceSession) -> None:
        while (inputs := self._pending.get()) is not None:
            self._done.put(self._execute(session, inputs))

    def _execute(self, session: ort.InferenceSession, inputs: Sequence[Tensor]) -> InferenceOutputs:
        start = time.monotonic_ns()
        try:
            outputs = self._rows.run(session, inputs)
        except Exception as exc:  # any onnxruntime failure fails this batch only
            error = FrameError(Reason.INFERENCE_FAILED, f"onnxruntime: {exc}")
            return InferenceOutputs(None, error, start, time.monotonic_ns())
        return InferenceOutputs(tuple(outputs), None, start, time.monotonic_ns())

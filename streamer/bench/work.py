"""The daemon's per-frame steps, called directly on the calling thread, with no transport.

:class:`FrameWork` builds what the daemon builds from a config (the decode limits, the
pre- and post-processor plug-ins, the model) and exposes each step as a plain call, for the
``components``, ``serial`` and ``naive`` modes. With ``backend = "onnxruntime"`` inference is
``InferenceSession.run`` on the calling thread, with the session options the daemon's
backend uses (what a hand-written program does); any other backend runs through its
queue-bound model, enqueue then dequeue, from the calling thread (the ACL path's host-side
work included).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol, cast

import numpy as np

from streamer.config import Config
from streamer.errors import BackendError, ConfigError
from streamer.lifecycle import Closing
from streamer.runtime import Backend, ModelInfo, ModelSpec, QueueModel, open_backend
from streamer.runtime.onnx import open_session, session_model_info
from streamer.runtime.onnx_options import parse_onnx_options
from streamer.runtime.onnx_rows import applied_rows
from streamer.transport.ingress import widest_limits
from streamer.vision.decode import decode_image
from streamer.vision.opencv import configure_opencv
from streamer.vision.postprocess import Postprocessor
from streamer.vision.preprocess import LetterboxTransform, Preprocessor
from streamer.vision.registry import POSTPROCESSORS, PREPROCESSORS

__all__ = ["FrameWork", "check_benchable", "replica_sessions"]

_DEQUEUE_TIMEOUT_MS = 60_000


class _Runner(Protocol):
    info: ModelInfo
    rows_per_run: int | None

    def run(self, batch: np.ndarray) -> Sequence[np.ndarray]: ...

    def close(self) -> None: ...


class _SessionRunner:
    """onnxruntime on the calling thread, loaded as ``OnnxBackend.load`` loads it: the same
    session options, provider and device, and the same in-graph preprocessing. Each batch
    runs whole: the components time each batch size as it is."""

    def __init__(self, spec: ModelSpec, options: Mapping[str, Any]) -> None:
        self._session = open_session(spec, options)
        self.info = session_model_info(spec.name, self._session, spec.batch_gears)
        rows = parse_onnx_options(options).rows_per_run
        self.rows_per_run: int | None = applied_rows(self._session, rows)
        self._input = self.info.inputs[0].name

    def run(self, batch: np.ndarray) -> Sequence[np.ndarray]:
        return list(self._session.run(None, {self._input: batch}))

    def close(self) -> None:
        """Nothing to release: the session goes with the object."""


class _QueueRunner:
    """Any backend's queue-bound model, used synchronously from one thread."""

    def __init__(self, backend: Backend, spec: ModelSpec) -> None:
        self.rows_per_run: int | None = None  # the model's gears: no rows_per_run
        self._model: QueueModel = backend.load(spec)
        self._model.attach_thread()
        self.info = self._model.info

    def run(self, batch: np.ndarray) -> Sequence[np.ndarray]:
        self._model.enqueue([batch])
        done = self._model.dequeue(_DEQUEUE_TIMEOUT_MS)
        if done is None or done.outputs is None:
            detail = done.error.detail if done is not None and done.error else "timed out"
            raise BackendError(f"model {self.info.name!r}: {detail}")
        # Loaded without device_outputs (ModelSpec): every output is a host array.
        return cast(Sequence[np.ndarray], done.outputs)

    def close(self) -> None:
        self._model.close()


def check_benchable(config: Config) -> None:
    """Refuse a config the benchmark cannot time as the daemon runs it: it times one model
    that reads the frame through a letterbox (its ``daemon_device_side`` moves the
    letterbox's normalisation off the host), one step at a time.

    Raises:
        ConfigError: a chain of models, or a first model without a ``[models.preprocess]``
            and a ``[models.postprocess]``, or whose preprocess is not a ``letterbox``.
    """
    if len(config.models) > 1:
        names = ", ".join(m.name for m in config.models)
        raise ConfigError(
            f"streamer bench times one model, and this config chains {len(config.models)} "
            f"({names}): give it a config with one [[models]] table"
        )
    model = config.models[0]
    if model.preprocess is None or model.postprocess is None:
        raise ConfigError(
            "streamer bench needs models[0] to have a [models.preprocess] and a "
            "[models.postprocess] (one model that reads the frame)"
        )
    if model.preprocess.kind != "letterbox":
        raise ConfigError(
            f"streamer bench needs a letterbox preprocess on models[0], not "
            f"{model.preprocess.kind!r} (its daemon_device_side moves the letterbox's "
            "normalisation into the model)"
        )


def replica_sessions(config: Config) -> int:
    """Sessions of the first model the daemon runs at once on onnxruntime (``replicas`` on
    each of ``runtime.devices``); 0 on any other backend, whose model the benchmark uses
    from one thread only."""
    if config.runtime.backend != "onnxruntime":
        return 0
    return config.models[0].replicas * len(config.runtime.devices)


class FrameWork(Closing):
    """Decode, preprocess, infer and postprocess as the daemon configured by ``config`` does.

    Not thread-safe: one thread calls every method, and each copy of
    :meth:`replica_copies` is called by one thread at a time. Close it (or use it as a
    context manager) to release the model and the backend.

    Args:
        config: a validated config with one ``[[models]]`` stage (:func:`check_benchable`).

    Raises:
        ConfigError, ModelError, BackendError: as :meth:`Pipeline.load` would, and as
            :func:`check_benchable`.
    """

    def __init__(self, config: Config) -> None:
        check_benchable(config)
        model = config.models[0]
        assert model.preprocess is not None and model.postprocess is not None  # checked
        spec = ModelSpec(
            name=model.name,
            path=config.model_path(model),
            device=config.runtime.devices[0],
            mode=model.mode,
            max_in_flight=model.max_in_flight,
            batch_gears=model.batch.gears,
            preprocess=model.preprocess,
        )
        configure_opencv()  # as the daemon runs it
        self._limits = widest_limits(config.ingress)
        self._backend: Backend | None = None
        self._closed = False
        self._spec, self._options = spec, config.runtime.options
        self._sessions = replica_sessions(config)
        self._runner = self._open_runner(config, spec)
        self._copies: list[_Runner] = []
        try:
            info = self._runner.info
            self._preprocess: Preprocessor = PREPROCESSORS.create(
                model.preprocess, info, "models[0].preprocess"
            )
            self._postprocess: Postprocessor = POSTPROCESSORS.create(
                model.postprocess, info, "models[0].postprocess"
            )
        except BaseException:
            self.close()
            raise

    def _open_runner(self, config: Config, spec: ModelSpec) -> _Runner:
        if config.runtime.backend == "onnxruntime":
            return _SessionRunner(spec, config.runtime.options)
        self._backend = open_backend(config.runtime)
        try:
            return _QueueRunner(self._backend, spec)
        except BaseException:
            self._backend.close()
            raise

    @property
    def rows_per_run(self) -> int | None:
        """Rows per model run at most that the daemon's onnxruntime backend cuts its batches
        into, for this config's model (0 = whole batches: unset, or a model without a named
        batch axis); None on a backend without ``rows_per_run`` (ACL)."""
        return self._runner.rows_per_run

    def decode(
        self, encoding: str, payload: bytes | memoryview, fields: Mapping[str, Any]
    ) -> np.ndarray:
        """One payload → BGR uint8 (H, W, 3), by the daemon's decoding rules.

        Raises:
            FrameError: as :func:`streamer.vision.decode.decode_image`.
        """
        return decode_image(encoding, payload, fields, self._limits)

    def preprocess(self, image: np.ndarray) -> tuple[np.ndarray, LetterboxTransform]:
        """One BGR image → (model input without the batch axis, its letterbox transform)."""
        return self._preprocess(image)

    def replica_copies(self) -> list[Callable[[np.ndarray], Sequence[np.ndarray]]]:
        """A copy of the model's inference per session the daemon runs at once
        (:func:`replica_sessions`), each to be called by one thread at a time: on
        onnxruntime, a session per copy, loaded as :meth:`infer`'s (opened once, kept until
        :meth:`close`); on any other backend none (its model is used from one thread only).

        Each copy takes and returns what :meth:`infer` does.
        """
        while len(self._copies) < self._sessions:
            self._copies.append(_SessionRunner(self._spec, self._options))
        return [copy.run for copy in self._copies]

    def infer(self, batch: np.ndarray) -> Sequence[np.ndarray]:
        """Run one batch (batch first, e.g. float32 (B, 3, 128, 128)); outputs batch first.

        Raises:
            BackendError: the execution failed (backends other than onnxruntime).
        """
        return self._runner.run(batch)

    def postprocess(
        self, outputs: Sequence[np.ndarray], transforms: Sequence[LetterboxTransform]
    ) -> list[dict[str, Any]]:
        """Per-frame results of the first ``len(transforms)`` rows of one batch's outputs."""
        return self._postprocess(outputs, transforms)

    def close(self) -> None:
        """Release the model, then the backend; idempotent."""
        if self._closed:
            return
        self._closed = True
        for copy in self._copies:
            copy.close()
        self._runner.close()
        if self._backend is not None:
            self._backend.close()

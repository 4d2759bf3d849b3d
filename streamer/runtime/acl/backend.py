"""The pyACL backend (``backend = "acl"``): models on Ascend NPUs behind the queue contract.

Construction opens the runtime (``acl.init``, then each configured device: context, stream,
run mode); :meth:`AclBackend.load` loads a model in the device's context and returns one of
three executors:

``queue``   tdt queues + ``aclmdlLoadFromFileWithQ`` (static shapes only)
``async``   ``execute_async`` + stream callbacks (any model; needed for dynamic gears)
``sync``    ``execute`` in the enqueue thread (debugging)

Dynamic models (batch, resolution or dims gears, one kind per model) run in ``async`` and
``sync`` mode, which set each batch's gear (:mod:`~streamer.runtime.acl.gears`). So do models
with dynamic AIPP, whose parameters are set on each batch's input dataset
(:mod:`~streamer.runtime.acl.aipp_load`): a WithQ model has no dataset (its inputs come from
tdt queues, and ``acl.mdl.set_input_aipp`` has nothing to write into), so ``queue`` mode refuses
them at start-up and ``auto`` picks ``async``.

``mode = "auto"`` picks ``queue`` for a static-shape model when queue mode is available (the
tdt library loads and WithQ loading exists), else ``async``; it also falls back to ``async`` if
the WithQ load is refused as unsupported (OM2 files, chips without queue mode). The ``acl``
module and the two C libraries can be injected (the simulator does); by default ``acl`` is
imported lazily and the libraries are opened with ctypes.
"""

from __future__ import annotations

import importlib
import threading
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import structlog

from streamer.config import RuntimeConfig
from streamer.errors import BackendError, ConfigError, ModelError
from streamer.release import close_all
from streamer.runtime.acl.aipp_load import agreed_dynamic_aipp, attach_dynamic_aipp
from streamer.runtime.acl.aipp_verify import verify_static_aipp
from streamer.runtime.acl.constants import AclCode
from streamer.runtime.acl.description import ModelDescription
from streamer.runtime.acl.device import AclRuntime, DeviceContext
from streamer.runtime.acl.errors import AclError
from streamer.runtime.acl.loaded import LoadedModel, load_model, load_plain
from streamer.runtime.acl.model_async import AsyncModel, effective_callback_interval
from streamer.runtime.acl.model_base import AclModel, ModelParts
from streamer.runtime.acl.model_queue import QueueModeModel
from streamer.runtime.acl.model_sync import SyncModel
from streamer.runtime.acl.operators import AclOperators
from streamer.runtime.acl.options import (
    AclOptions,
    ModelOptions,
    parse_model_options,
    parse_options,
)
from streamer.runtime.acl.queue_binding import QueueBinding
from streamer.runtime.acl.tdt import TdtQueueApi
from streamer.runtime.acl.teardown import Teardown
from streamer.runtime.acl.withq import WithQLoader
from streamer.runtime.base import Backend, ModelSpec
from streamer.runtime.letterbox_keys import letterbox_keys
from streamer.runtime.mtcnn_keys import refuse_in_graph

__all__ = ["AclBackend", "import_acl", "recent_error"]

_log = structlog.get_logger(__name__)

_UNSUPPORTED = frozenset(
    {
        AclCode.ERROR_API_NOT_SUPPORT,
        AclCode.ERROR_FEATURE_UNSUPPORTED,
        AclCode.ERROR_RT_FEATURE_NOT_SUPPORT,
    }
)
"""WithQ load failures that mean "not on this file or chip": auto mode falls back to async."""

_OUT_OF_MEMORY = frozenset({AclCode.ERROR_BAD_ALLOC, AclCode.ERROR_RT_MEMORY_ALLOCATION})
"""Load failures that say the device, not the model, is at fault (too little memory left):
a backend failure (exit 1: the units restart it), as ``acl.rt.malloc``'s are, not a bad model
(exit 2, which ``RestartPreventExitStatus=2`` keeps from restarting)."""

REPORT_THREADS_RECOMMENDED = 32
"""Most callback threads subscribed in one process that ``aclrtSubscribeReport``'s doc
recommends (the limit is 1024, 128 on Atlas 200/300/500; RT ``python/docs/zh/api_ref/runtime/
control/function-subscribe_report.md``, reference/pyacl.md §2). Each async model has one."""

_MISSING_ACL = (
    'runtime.backend = "acl" needs pyACL (the `acl` module of the CANN toolkit), which cannot '
    "be imported: {detail}. Install the CANN toolkit and load its environment with "
    "`source /usr/local/Ascend/ascend-toolkit/set_env.sh` before starting streamer. "
    'Without an NPU, use runtime.backend = "acl-sim", which runs the same backend code '
    "against a simulator."
)


def import_acl() -> Any:
    """``import acl`` (pyACL).

    Raises:
        BackendError: pyACL is not importable; the message says what to install or source,
            and that ``acl-sim`` exists.
    """
    try:
        return importlib.import_module("acl")
    except ImportError as exc:
        raise BackendError(_MISSING_ACL.format(detail=exc)) from exc


class AclBackend(Backend):
    """Ascend NPUs through pyACL.

    Args:
        config: ``[runtime]``: ``devices`` to open, ``options`` (see
            :mod:`streamer.runtime.acl.options`).
        acl: the pyACL module; default ``import acl``.
        tdt_library: the tdt queue library; default ``ctypes.CDLL(options.tdt_library)``.
        acl_library: the ACL library for ``aclmdlLoadFromFileWithQ`` when pyACL lacks it;
            default ``ctypes.CDLL(options.acl_library)``.

    Raises:
        ConfigError: ``runtime.options`` is invalid.
        BackendError: pyACL is missing, or a start-up call failed (``AclError``); whatever
            was opened before the failure is released first.
    """

    name = "acl"
    device_memory = True
    _simulated = False

    @classmethod
    def check_options(cls, config: RuntimeConfig) -> None:
        parse_options(config.options, simulated=cls._simulated)

    def __init__(
        self,
        config: RuntimeConfig,
        *,
        acl: Any | None = None,
        tdt_library: Any | None = None,
        acl_library: Any | None = None,
    ) -> None:
        self.options: AclOptions = parse_options(config.options, simulated=self._simulated)
        self.result_timeout_s = self.options.result_timeout_ms / 1000  # queue mode's
        self._acl = acl if acl is not None else import_acl()
        self._tdt = (
            TdtQueueApi(tdt_library)
            if tdt_library is not None
            else TdtQueueApi.load(self.options.tdt_library)
        )
        self._withq = (
            WithQLoader(self._acl, acl_library)
            if acl_library is not None
            else WithQLoader.open_library(self._acl, self.options.acl_library)
        )
        self._models: set[AclModel] = set()
        self._lowered_said: set[tuple[str, int, int]] = set()
        self._lock = threading.Lock()
        self._runtime = AclRuntime(self._acl, config.devices, self.options.acl_config_path)
        self._operators: AclOperators | None = None

    @property
    def queue_mode_available(self) -> bool:
        """Whether tdt queues and WithQ loading are both reachable."""
        return self._tdt is not None and self._withq.available

    def load(self, spec: ModelSpec) -> AclModel:
        """Load ``spec.path`` on ``spec.device`` in the mode ``spec.mode`` resolves to.

        Raises:
            ConfigError: ``spec.options`` is invalid, or a letterbox or an MTCNN stage asks
                for the in-graph rewrite (``normalize = "model"``, see
                :func:`_refuse_in_graph`).
            ModelError: unknown device, unloadable file, gears that do not fit, or a mode
                the model cannot run in (the message says why).
            AclError: the runtime failed (the message names the model and the device);
                everything acquired is released first.
        """
        _refuse_in_graph(spec)
        options = parse_model_options(self.options, spec.options, spec.name)
        device = self._device(spec)
        try:
            return self._load_on(spec, device, options)
        except AclError as exc:  # e.g. no device memory left: say for which model, where
            raise exc.where(f"model {spec.name!r} on device {spec.device}") from exc

    def _load_on(self, spec: ModelSpec, device: DeviceContext, options: ModelOptions) -> AclModel:
        device.activate()
        probe = Teardown()
        with probe.on_error():
            loaded = self._load_plain(spec, probe)
            mode = self._choose_mode(spec, loaded.description)
            verify_static_aipp(self._acl, loaded.model_id, spec.name, spec.preprocess)
            if mode == "queue":
                probe.close()
                counts = len(loaded.description.input_sizes), len(loaded.description.output_sizes)
                model = self._load_queue(spec, device, options, counts)
                if model is not None:
                    return self._register(model)
                loaded = self._load_plain(spec, probe)
                mode = "async"
            return self._register(self._build(mode, spec, device, options, loaded, probe))

    def operators(self) -> AclOperators:
        """NMS and top-k as ``acl.op`` single operators (:mod:`~streamer.runtime.acl.operators`),
        created on the first call; every thread that calls them needs a device's context."""
        with self._lock:
            if self._operators is None:
                devices = list(self._runtime.devices.values())
                self._operators = AclOperators(
                    self._acl, devices[0].run_mode, self.options.op_max_shapes, devices
                )
            return self._operators

    def close(self) -> None:
        """Close any model still open and the operators, then release the devices and
        finalize. Idempotent.

        Raises:
            AclError: a release failed (every release is still attempted).
            BackendError: a model was abandoned (its work did not finish).
        """
        with self._lock:
            models = list(self._models)
        for model in models:
            _log.warning("acl_model_left_open", model=model.info.name)
        operators = [] if self._operators is None else [self._operators.close]
        close_all([*(m.close for m in models), *operators, self._runtime.close])

    @property
    def abandoned_devices(self) -> list[int]:
        """Devices left unreleased because a model's work on them did not finish in time (a
        hung execution; :attr:`DeviceContext.hung`)."""
        return sorted(d.device_id for d in self._runtime.devices.values() if d.hung)

    def _device(self, spec: ModelSpec) -> DeviceContext:
        device = self._runtime.devices.get(spec.device)
        if device is None:
            raise ModelError(
                f"model {spec.name!r}: device {spec.device} is not in runtime.devices "
                f"{sorted(self._runtime.devices)}"
            )
        return device

    def _load_plain(self, spec: ModelSpec, teardown: Teardown) -> LoadedModel:
        def load() -> int:
            try:
                return load_plain(self._acl, str(spec.path))
            except AclError as exc:
                if exc.code in _OUT_OF_MEMORY:
                    raise  # _load_on names the model and the device
                detail = recent_error(self._acl)
                raise ModelError(
                    f"model {spec.name!r}: cannot load {spec.path}: {exc}"
                    + (f": {detail}" if detail else "")
                ) from exc

        return _fit(spec, load_model(self._acl, spec.name, load, teardown))

    def _choose_mode(self, spec: ModelSpec, description: ModelDescription) -> str:
        if agreed_dynamic_aipp(spec.preprocess, description) is not None:
            return _dynamic_aipp_mode(spec)
        if spec.mode == "queue":
            if not description.static:
                gears = description.gears
                raise ModelError(
                    f"model {spec.name!r}: mode 'queue' needs a static-shape model, but it has "
                    f"{gears.kind.value} gears {[list(g) for g in gears.gears]}, batch gears "
                    f"{list(description.info.batch_gears)} and input shapes "
                    f"{[list(t.shape) for t in description.info.inputs]}; ACL queue mode "
                    "(aclmdlLoadFromFileWithQ) accepts fixed shapes only. Use mode 'async', "
                    "or convert the model with a fixed ATC --input_shape."
                )
            if not self.queue_mode_available:
                raise ModelError(
                    f"model {spec.name!r}: mode 'queue' is unavailable: "
                    f"{self.options.tdt_library} or aclmdlLoadFromFileWithQ is missing"
                )
            return "queue"
        if spec.mode == "auto":
            return "queue" if description.static and self.queue_mode_available else "async"
        return spec.mode

    def _load_queue(
        self,
        spec: ModelSpec,
        device: DeviceContext,
        options: ModelOptions,
        counts: tuple[int, int],
    ) -> AclModel | None:
        """The queue-mode model (``counts``: its inputs and outputs), or None when auto mode
        must fall back to async."""
        assert self._tdt is not None
        tdt = self._tdt
        binding = QueueBinding(
            self._acl,
            tdt,
            lambda inputs, outputs: self._withq.load(str(spec.path), inputs, outputs),
            spec.name,
            device.device_id,
            options.queue_depth,
            counts,
        )
        teardown = Teardown()
        try:
            with teardown.on_error():
                teardown.push_call(binding.close)  # whichever model and queues it holds then
                loaded = binding.bind()
                parts = ModelParts(
                    self._acl,
                    device,
                    loaded,
                    options,
                    teardown,
                    self._forget,
                    device_outputs=spec.device_outputs,
                )
                return QueueModeModel(parts, spec.max_in_flight, tdt, binding)
        except AclError as exc:
            if exc.code not in _UNSUPPORTED:
                raise
            if spec.mode != "auto":
                raise ModelError(
                    f"model {spec.name!r}: mode 'queue' refused by the runtime ({exc}): an OM2 "
                    "file, or a chip without queue mode; use mode 'async'"
                ) from exc
            _log.warning("acl_queue_mode_refused", model=spec.name, detail=str(exc))
            return None

    def _build(
        self,
        mode: str,
        spec: ModelSpec,
        device: DeviceContext,
        options: ModelOptions,
        loaded: LoadedModel,
        teardown: Teardown,
    ) -> AclModel:
        kind: Callable[..., AclModel] = AsyncModel if mode == "async" else SyncModel
        loaded, aipp = attach_dynamic_aipp(self._acl, spec.preprocess, loaded, teardown)
        parts = ModelParts(
            self._acl, device, loaded, options, teardown, self._forget, aipp, spec.device_outputs
        )
        model = kind(parts, spec.max_in_flight)
        if mode == "async":  # once built: a load that fails says nothing yet
            self._say_if_callback_interval_lowered(spec, options)
        return model

    def _say_if_callback_interval_lowered(self, spec: ModelSpec, options: ModelOptions) -> None:
        """Log ``acl_callback_interval_lowered`` where an async model's interval is above
        its ``max_in_flight`` (:func:`effective_callback_interval`): once per model and
        values, not for every replica and every reload that loads it again."""
        configured, max_in_flight = options.callback_interval, spec.max_in_flight
        if effective_callback_interval(configured, max_in_flight) == configured:
            return
        with self._lock:
            said = (spec.name, configured, max_in_flight) in self._lowered_said
            self._lowered_said.add((spec.name, configured, max_in_flight))
        if not said:
            _log.warning(
                "acl_callback_interval_lowered",
                model=spec.name,
                callback_interval=configured,
                max_in_flight=max_in_flight,
            )

    def _register(self, model: AclModel) -> AclModel:
        with self._lock:
            self._models.add(model)
            report_threads = sum(isinstance(m, AsyncModel) for m in self._models)
        # Once, as the count crosses the recommendation (20 replicas on 2 devices logged 48).
        if isinstance(model, AsyncModel) and report_threads == REPORT_THREADS_RECOMMENDED + 1:
            _log.warning(
                "acl_report_threads_over_recommended",
                model=model.info.name,
                report_threads=report_threads,
                recommended=REPORT_THREADS_RECOMMENDED,
                detail="each async replica subscribes its own callback thread; the ACL docs "
                "recommend at most 32 per process (the limit is 1024, 128 on Atlas "
                "200/300/500): lower replicas or devices of async stages, or use queue mode",
            )
        _log.info(
            "acl_model_loaded",
            model=model.info.name,
            model_id=model.model_id,
            mode=model.mode,
            device=model.device_id,
            batch_gears=list(model.info.batch_gears),
            hw_gears=[list(g) for g in model.info.hw_gears],
            dims_gears=[list(g) for g in model.info.dims_gears],
        )
        return model

    def _forget(self, model: AclModel) -> None:
        with self._lock:
            self._models.discard(model)


def recent_error(acl: Any) -> str:
    """``acl.get_recent_err_msg()``: why the calling thread's last pyACL call failed, or "".

    The runtime's own description of a failure (e.g. why a model file was refused), taken
    and cleared per thread (RT ``python/docs/zh/api_ref/runtime/exception/
    function-get_recent_err_msg.md``); "" when pyACL lacks the function or has no message.
    """
    get = getattr(acl, "get_recent_err_msg", None)
    message = get() if get is not None else None
    return str(message) if message else ""


def _dynamic_aipp_mode(spec: ModelSpec) -> str:
    """The mode of a dynamic-AIPP model: ``async`` for ``auto`` (module docstring).

    Raises:
        ModelError: ``queue`` was asked for.
    """
    if spec.mode == "queue":
        raise ModelError(
            f"model {spec.name!r}: mode 'queue' cannot run a model with dynamic AIPP: its "
            "parameters are written into an input dataset with acl.mdl.set_input_aipp, and a "
            "model loaded with aclmdlLoadFromFileWithQ takes its inputs from tdt queues, "
            "without a dataset; use mode 'async' or 'sync'"
        )
    return "async" if spec.mode == "auto" else spec.mode


def _refuse_in_graph(spec: ModelSpec) -> None:
    """Refuse ``normalize = "model"`` on the table that prepares the model's inputs: that is
    the onnxruntime backend's rewrite of the ONNX graph, and an ``.om`` is compiled by ATC,
    not rewritten; ACL normalises on the device with AIPP (``normalize = "device"``).

    Raises:
        ConfigError: a letterbox (or an MTCNN stage's table,
            :func:`~streamer.runtime.mtcnn_keys.refuse_in_graph`) with ``normalize = "model"``.
    """
    refuse_in_graph(spec.preprocess)
    keys = letterbox_keys(spec.preprocess)
    if keys is not None and keys.normalize == "model":
        raise ConfigError(
            f'model {spec.name!r}: preprocess.normalize: "model" is the onnxruntime backend\'s '
            'in-graph rewrite and ACL cannot rewrite an .om; use normalize = "device", which '
            'normalises with AIPP (static, or aipp = "dynamic") built into the .om by ATC; for '
            "the simulator, `streamer models sim-layout` lays the models out and writes the "
            "config that runs them"
        )


def _fit(spec: ModelSpec, loaded: LoadedModel) -> LoadedModel:
    """Check the model against ``spec``; narrow its batch gears to the configured ones.

    Raises:
        ModelError: configured gears the model lacks.
    """
    info = loaded.description.info
    if not spec.batch_gears or not info.batch_gears:
        return loaded
    extra = set(spec.batch_gears) - set(info.batch_gears)
    if extra:
        raise ModelError(
            f"model {spec.name!r}: configured batch gears {sorted(extra)} are not among the "
            f"model's gears {list(info.batch_gears)}"
        )
    narrowed = replace(info, batch_gears=tuple(sorted(spec.batch_gears)))
    return replace(loaded, description=replace(loaded.description, info=narrowed))

"""The simulated Ascend machine: pyACL module, tdt library and ACL library over one state.

Build one :class:`Simulator` and hand its :attr:`~Simulator.acl`, :attr:`~Simulator.tdt_library`
and :attr:`~Simulator.acl_library` to :class:`~streamer.runtime.acl.backend.AclBackend` where the
real ``import acl`` and ``ctypes.CDLL`` results would go; the backend code runs unchanged.
After a run, :attr:`~Simulator.log` holds every call, :attr:`~Simulator.violations` every broken
rule, and :meth:`~Simulator.live_resources` whatever was not released.
Releasing out of the documented order is rule ``teardown`` (:mod:`.teardown`).

Initialisation rules: calls need ``acl.init`` first (``ACL_ERROR_UNINITIALIZE``); a second
``acl.init`` returns ``ACL_ERROR_REPEAT_INITIALIZE``, a second ``acl.finalize``
``ACL_ERROR_REPEAT_FINALIZE`` (RT ``acl_base_rt.h``).
"""

from __future__ import annotations

import itertools
import threading
from types import ModuleType
from typing import Any

import structlog

from streamer.errors import ConfigError
from streamer.runtime.acl.constants import AclCode, RunMode
from streamer.runtime.acl.options import SimOptions
from streamer.runtime.acl.sim import teardown
from streamer.runtime.acl.sim.aipp_sets import SimAippSets
from streamer.runtime.acl.sim.api_mdl import build_acl_library, build_mdl
from streamer.runtime.acl.sim.api_op import build_op, build_tensor_desc
from streamer.runtime.acl.sim.api_rt import build_rt, build_top_level, build_util
from streamer.runtime.acl.sim.api_tdt import build_tdt_library
from streamer.runtime.acl.sim.binding import Binder, SimError, Violation
from streamer.runtime.acl.sim.calllog import CallLog
from streamer.runtime.acl.sim.cfunc import SimLibrary
from streamer.runtime.acl.sim.devices import Context, SimDevices
from streamer.runtime.acl.sim.faults import Faults
from streamer.runtime.acl.sim.image import DynamicKind
from streamer.runtime.acl.sim.memory import SimMemory
from streamer.runtime.acl.sim.models import SimModels
from streamer.runtime.acl.sim.queues import QueueTimeouts, SimQueues
from streamer.runtime.acl.sim.single_ops import SimSingleOps
from streamer.runtime.acl.sim.streams import Reports, SimStream
from streamer.runtime.acl.sim.threads import SimThreads

__all__ = ["Simulator"]

_log = structlog.get_logger(__name__)


class _AclModule(ModuleType):
    """The simulated ``acl`` module: functions plus the ``rt``, ``mdl``, ``op``, ``util``
    modules."""

    rt: ModuleType
    mdl: ModuleType
    op: ModuleType
    util: ModuleType


class Simulator:
    """One simulated machine.

    Args:
        options: ``[runtime.options.sim]``.
        device_count: simulated devices when ``options.device_count`` is not set.

    Raises:
        ConfigError: ``fail_calls`` names an API the simulator does not have.
    """

    def __init__(self, options: SimOptions, device_count: int = 1) -> None:
        self.options = options
        self.run_mode = RunMode.HOST if options.run_mode == "host" else RunMode.DEVICE
        self.log = CallLog(options.call_log_size)
        self.faults = Faults(options)
        self.binder = Binder(self.log, self.faults)
        count = options.device_count or device_count
        self.memory = SimMemory(count, options.device_memory_mb << 20, options.soc_950)
        self.devices = SimDevices(count)
        self.callback_errors: list[BaseException] = []
        self.problems: list[str] = []
        self.reports = Reports(self.callback_errors.append, self._report_timeout_code())
        self.threads = SimThreads()
        self.models = SimModels(
            self.memory,
            self.faults,
            self._problem,
            host_is_device=self.run_mode == RunMode.DEVICE,
        )
        self.aipp_sets = SimAippSets()
        self.queues = SimQueues(self.memory, self.faults, self._timeouts(), self._task_error)
        self._streams: dict[int, SimStream] = {}
        self.ops = SimSingleOps(
            self.memory,
            self.models,
            self.devices,
            self.stream,
            self.run_mode,
            options.unknown_rank_ops,
        )
        self._stream_ids = itertools.count(0x5700_0000_0200, 0x200)
        self._lock = threading.Lock()
        self._initialized = False
        self._finalized = False
        self.acl = self._build_acl()
        with_q = options.with_q != "none"
        self.tdt_library: SimLibrary = build_tdt_library(self)
        self.acl_library: SimLibrary = build_acl_library(self, with_q)
        self._check_fail_calls()

    @property
    def violations(self) -> list[Violation]:
        """Every rule broken so far, oldest first."""
        return list(self.binder.violations)

    def initialize(self, _config_path: str | None) -> None:
        """``acl.init``. Raises: SimError: already initialised."""
        with self._lock:
            if self._initialized:
                raise SimError(AclCode.ERROR_REPEAT_INITIALIZE, "init", "acl.init called twice")
            self._initialized = True
            self._finalized = False

    def finalize(self) -> None:
        """``acl.finalize``.

        Raises:
            SimError: not initialised (any more), or a device is still set (rule
                ``teardown``, :mod:`~streamer.runtime.acl.sim.teardown`).
        """
        with self._lock:
            if not self._initialized:
                raise SimError(AclCode.ERROR_REPEAT_FINALIZE, "init", "acl.finalize without init")
        teardown.check_finalize(self)
        with self._lock:
            self._initialized = False
            self._finalized = True

    def require_init(self) -> None:
        """Raises: SimError: ``acl.init`` was not called (``ACL_ERROR_UNINITIALIZE``)."""
        with self._lock:
            if not self._initialized:
                raise SimError(AclCode.ERROR_UNINITIALIZE, "init", "acl.init not called")

    def create_stream(self, context: Context) -> int:
        """A new stream in ``context``."""
        handle = next(self._stream_ids)
        stream = SimStream(handle, context.device, context.handle, self._task_error)
        with self._lock:
            self._streams[handle] = stream
        return handle

    def device_streams(self, device: int) -> list[SimStream]:
        """The live streams created on ``device``."""
        return [s for s in self.live_streams() if s.device == device]

    def live_streams(self) -> list[SimStream]:
        """Every stream created and not destroyed."""
        with self._lock:
            return list(self._streams.values())

    def stream(self, handle: int) -> SimStream:
        """Raises: SimError: no such stream."""
        with self._lock:
            stream = self._streams.get(handle)
        if stream is None:
            raise SimError(AclCode.ERROR_RT_PARAM_INVALID, None, f"no stream {handle:#x}")
        return stream

    def destroy_stream(self, handle: int) -> None:
        """Raises: SimError: no such stream, or a thread is still subscribed to it (rule
        ``teardown``)."""
        stream = self.stream(handle)
        teardown.check_destroy_stream(self, handle)
        with self._lock:
            if self._streams.pop(handle, None) is None:
                raise SimError(AclCode.ERROR_RT_PARAM_INVALID, None, f"no stream {handle:#x}")
        stream.destroy()

    def load_with_q(self, path: str, inputs: list[int], outputs: list[int]) -> int:
        """``aclmdlLoadFromFileWithQ`` (S17, S18); returns the model id.

        S17's two refusals differ: a dynamic-shape model breaks the rule (its description
        says so before any load), while an OM2 file is a documented refusal no caller can
        foresee (its format is not in its description), which ``mode = "auto"`` answers by
        falling back to async on purpose; the refusal is returned, not counted as a
        violation.

        Raises:
            SimError: an OM2 file (``ACL_ERROR_API_NOT_SUPPORT``), a dynamic-shape model
                (``ACL_ERROR_GE_PARAM_INVALID``), wrong queues, or an injected failure
                (``with_q_load_fails_after_n_loads``: ``ACL_ERROR_GE_LOAD_MODEL``).
        """
        context = self.devices.current()
        image = self.models.image(path)
        if self.faults.with_q_load_fails():
            raise SimError(AclCode.ERROR_GE_LOAD_MODEL, None, "injected load failure")
        if image.om2:
            raise SimError(AclCode.ERROR_API_NOT_SUPPORT, None, "OM2 models cannot load WithQ")
        if image.kind != DynamicKind.STATIC:
            raise SimError(AclCode.ERROR_GE_PARAM_INVALID, "S17", "WithQ needs a static shape")
        model = self.models.load(image, context.handle, context.device)
        try:
            self.queues.bind(model, inputs, outputs)
        except SimError:
            self.models.unload(model.model_id, context.handle)
            raise
        return model.model_id

    def live_resources(self) -> dict[str, list[Any]]:
        """Everything acquired and not released, by kind; empty when nothing leaked."""
        resources: dict[str, list[Any]] = {
            "allocations": [(a.kind.value, hex(a.start), a.size) for a in self.memory.live()],
            "streams": list(self._streams),
            "subscriptions": self.reports.live(),
            "threads": self.threads.live(),
            "initialized": [True] if self._initialized else [],
            **self.devices.live(),
            **self.models.live(),
            **self.aipp_sets.live(),
            **self.queues.live(),
            **self.ops.live(),
        }
        return {kind: items for kind, items in resources.items() if items}

    def _build_acl(self) -> ModuleType:
        acl = _AclModule("acl", "Simulated pyACL (streamer.runtime.acl.sim).")
        build_top_level(self, acl)
        acl.rt = build_rt(self)
        acl.mdl = build_mdl(self, self.options.with_q == "pyacl")
        build_tensor_desc(self, acl)
        acl.op = build_op(self)
        acl.util = build_util(self)
        return acl

    def _report_timeout_code(self) -> int:
        codes = {
            "report_timeout": AclCode.ERROR_RT_REPORT_TIMEOUT,
            "wait_callback_timeout": AclCode.ERROR_WAIT_CALLBACK_TIMEOUT,
        }
        return int(codes[self.options.report_timeout_code])

    def _timeouts(self) -> QueueTimeouts:
        expiry = {"empty_full": None, "report_timeout": AclCode.ERROR_RT_REPORT_TIMEOUT}
        override = expiry[self.options.queue_timeout_code]
        return QueueTimeouts(
            zero_allowed=self.run_mode == RunMode.DEVICE,
            full_code=int(override or AclCode.ERROR_RT_QUEUE_FULL),
            empty_code=int(override or AclCode.ERROR_RT_QUEUE_EMPTY),
        )

    def _task_error(self, err: SimError) -> None:
        self.binder.record_violation("stream task", err)
        _log.warning("acl_sim_task_failed", code=err.code, rule=err.rule, detail=str(err))

    def _problem(self, message: str) -> None:
        self.problems.append(message)
        _log.warning("acl_sim_model_refused", detail=message)

    def _check_fail_calls(self) -> None:
        unknown = sorted(set(self.options.fail_calls) - set(self.binder.names))
        if unknown:
            known = sorted(set(self.binder.names))
            raise ConfigError(f"runtime.options.sim.fail_calls: unknown {unknown}; known: {known}")

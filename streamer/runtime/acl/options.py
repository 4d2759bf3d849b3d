"""``[runtime.options]`` for ``backend = "acl"`` and ``"acl-sim"``, validated at start-up.

Unknown keys are rejected (``extra="forbid"``) and every error names the key, e.g.
``runtime.options.queue_depth: Input should be greater than or equal to 2``.

Example (TOML)::

    [runtime]
    backend = "acl-sim"
    devices = [0, 1]

    [runtime.options]
    queue_depth = 8            # tdt queue depth (queue mode), >= 2
    callback_interval = 4      # async mode: one launch_callback every 4 batches

    [runtime.options.op_max_shapes]  # single operators whose output rank is unknown
    NonMaxSuppressionV6 = [[4096, 3]]

    [runtime.options.sim]      # acl-sim only
    device_count = 2
    run_mode = "host"
    fail_every_n_executes = 100
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationError,
    model_validator,
)

from streamer.config import (
    INT32_MAX,
    MAX_DURATION_S,
    PositiveCInt,
    validate_strict,
)
from streamer.config_errors import error_lines
from streamer.errors import ConfigError
from streamer.runtime.acl.constants import QUEUE_DEPTH_DEFAULT, QUEUE_DEPTH_MIN
from streamer.runtime.acl.operators import check_max_shapes

__all__ = [
    "SIM_MAX_DEVICES",
    "AclOptions",
    "ModelOptions",
    "SimOptions",
    "parse_model_options",
    "parse_options",
]


def _decimal_key(key: object) -> object:
    """A TOML key (always a string) as the int it spells in plain decimal digits without
    leading zeros; other spellings that Python's int() takes (``"1_0"``, ``" 1"``, ``"+1"``,
    ``"00"``, which would collide with ``"0"``) stay strings, so strict validation refuses
    them."""
    if isinstance(key, str) and re.fullmatch("0|[1-9][0-9]{0,9}", key):
        return int(key)
    return key


_DeviceId = Annotated[int, BeforeValidator(_decimal_key), Field(ge=0, le=INT32_MAX)]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


class ModelOptions(_Strict):
    """Per-model tunables (the runtime options, overridable by ``ModelSpec.options``)."""

    queue_depth: int = Field(
        default=QUEUE_DEPTH_DEFAULT,
        ge=QUEUE_DEPTH_MIN,
        le=INT32_MAX,
        description="depth of each tdt queue",
    )
    callback_interval: PositiveCInt = Field(
        default=1,
        description="async: one launch_callback after every N execute_async",
    )
    callback_flush_ms: float = Field(
        default=10.0,
        ge=0,
        le=MAX_DURATION_S * 1000,
        description="async: synchronize the stream for batches not covered by a callback "
        "once the oldest has waited this long (ms)",
    )
    report_timeout_ms: PositiveCInt = Field(
        default=50,
        description="async: acl.rt.process_report timeout of one loop turn (ms)",
    )
    queue_poll_ms: PositiveCInt = Field(
        default=100,
        description="queue: timeout of one acltdtEnqueueData attempt, and the longest wait "
        "of one acltdtDequeueData (ms)",
    )
    result_timeout_ms: PositiveCInt = Field(
        default=10_000,
        description="queue: longest wait for a batch's outputs before they are given up and "
        "the model is reloaded; async: longest wait for a batch's callback before the stream's "
        "status settles it, and longest stream synchronisation at close; every mode: longest "
        "release of a closing (or reloading) model, past which it is abandoned, where the "
        "release does not hold the GIL (ms)",
    )

    @model_validator(mode="after")
    def _flush_within_result_timeout(self) -> ModelOptions:
        if self.callback_flush_ms > self.result_timeout_ms:
            raise ValueError(
                f"callback_flush_ms ({self.callback_flush_ms:g}) exceeds result_timeout_ms "
                f"({self.result_timeout_ms}): a batch no callback covers would wait past the "
                "longest wait for its result"
            )
        return self


SIM_MAX_DEVICES = 64
"""The most devices the simulator simulates (a machine of eight 8-chip cards)."""


class SimOptions(_Strict):
    """``[runtime.options.sim]``: the simulated Ascend machine (``acl-sim`` only)."""

    device_count: int | None = Field(
        default=None,
        ge=1,
        le=SIM_MAX_DEVICES,
        description="simulated devices; default: enough for runtime.devices",
    )
    run_mode: Literal["host", "device"] = Field(
        default="host", description="ACL_HOST or ACL_DEVICE"
    )
    with_q: Literal["pyacl", "ctypes", "none"] = Field(
        default="ctypes",
        description="where aclmdlLoadFromFileWithQ is found: pyACL built with USE_MDL, "
        "libascendcl.so only (ctypes), or nowhere (queue mode unavailable)",
    )
    device_memory_mb: PositiveCInt = Field(
        default=1024, description="memory of each simulated device"
    )
    soc_950: bool = Field(
        default=False, description="950 series: malloc reserves no extra 32 bytes"
    )
    queue_timeout_code: Literal["empty_full", "report_timeout"] = Field(
        default="empty_full",
        description="what a tdt call with timeout > 0 returns on expiry (undocumented): "
        "207013/207014, or 507012",
    )
    report_timeout_code: Literal["report_timeout", "wait_callback_timeout"] = Field(
        default="report_timeout",
        description="what acl.rt.process_report returns when no callback came in time: "
        "507012 (current CANN), or 100036 ACL_ERROR_WAIT_CALLBACK_TIMEOUT (older releases)",
    )
    fail_every_n_executes: PositiveCInt | None = Field(
        default=None,
        description="fault: every Nth model execution fails (ACL_ERROR_GE_FAILURE)",
    )
    task_fail_every_n_executes: PositiveCInt | None = Field(
        default=None,
        description="fault: every Nth acl.mdl.execute_async is accepted, then fails on the "
        "device: its stream drops the tasks after it (their callbacks never run) until a "
        "synchronisation has returned ACL_ERROR_RT_AICORE_EXCEPTION (507015)",
    )
    device_lost_after_n_executes: dict[_DeviceId, PositiveCInt] = Field(
        default_factory=dict,
        description="fault: device -> executions after which every execution on it fails "
        "(a lost device), e.g. {1 = 20}",
    )
    execute_delay_ms: float = Field(
        default=0.0,
        ge=0,
        le=MAX_DURATION_S * 1000,
        description="fault: each execution takes this long",
    )
    queue_full_every_n_enqueues: PositiveCInt | None = Field(
        default=None,
        description="fault: every Nth acltdtEnqueueData reports the queue full",
    )
    with_q_load_fails_after_n_loads: PositiveCInt | None = Field(
        default=None,
        description="fault: every aclmdlLoadFromFileWithQ after the first N fails with "
        "ACL_ERROR_GE_LOAD_MODEL (545001), e.g. the reload of a queue-mode replica after a "
        "lost output",
    )
    fail_calls: dict[str, PositiveCInt] = Field(
        default_factory=dict,
        description="fault: API name -> code that every call of it returns, e.g. "
        '{"acl.rt.create_stream" = 107000}',
    )
    call_log_size: PositiveCInt = Field(default=100_000, description="calls kept in the call log")
    unknown_rank_ops: list[str] = Field(
        default_factory=list,
        description="single operators (op types) whose acl.op.infer_shape reports every output "
        "of unknown rank (ACL_UNKNOWN_RANK, the reserved scenario), e.g. "
        '["NonMaxSuppressionV6"]',
    )


class AclOptions(ModelOptions):
    """``[runtime.options]`` of the ACL backends."""

    acl_config_path: Path | None = Field(default=None, description="acl.json passed to acl.init")
    acl_library: str = Field(default="libascendcl.so", description="for aclmdlLoadFromFileWithQ")
    tdt_library: str = Field(default="libacl_tdt_queue.so", description="the tdt queue C API")
    op_max_shapes: dict[str, list[list[PositiveCInt]]] = Field(
        default_factory=dict,
        description="single operators: op type -> one maximum shape per output, used where "
        "acl.op.infer_shape cannot tell an output's rank, e.g. "
        '{"NonMaxSuppressionV6" = [[4096, 3]]}',
    )
    sim: SimOptions | None = None

    def model_options(self) -> dict[str, Any]:
        """The per-model subset, as a dict for overriding."""
        return {name: getattr(self, name) for name in ModelOptions.model_fields}


def _config_error(prefix: str, exc: ValidationError, model: type[BaseModel]) -> ConfigError:
    return ConfigError("\n".join(error_lines(exc, model, prefix)))


def parse_options(options: Mapping[str, Any], *, simulated: bool) -> AclOptions:
    """Validate ``runtime.options``.

    Args:
        options: the raw ``[runtime.options]`` table.
        simulated: True for ``acl-sim`` (a ``sim`` table is allowed and defaulted).

    Raises:
        ConfigError: a key is unknown or invalid, or ``op_max_shapes`` do not fit the
            operators' outputs; the message names ``runtime.options.<key>``.
    """
    if not simulated and "sim" in options:
        raise ConfigError('runtime.options.sim: only valid with runtime.backend = "acl-sim"')
    try:
        parsed = validate_strict(AclOptions, options)
    except ValidationError as exc:
        raise _config_error("runtime.options", exc, AclOptions) from exc
    check_max_shapes(parsed.op_max_shapes)
    if simulated and parsed.sim is None:
        parsed = parsed.model_copy(update={"sim": SimOptions()})
    return parsed


def parse_model_options(base: AclOptions, overrides: Mapping[str, Any], model: str) -> ModelOptions:
    """The runtime's per-model options with ``ModelSpec.options`` applied on top.

    Raises:
        ConfigError: an override is unknown or invalid; the message names the model and key.
    """
    try:
        return validate_strict(ModelOptions, {**base.model_options(), **overrides})
    except ValidationError as exc:
        raise _config_error(f"model {model!r} options", exc, ModelOptions) from exc

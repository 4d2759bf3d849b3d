"""``[runtime.options]`` for ``backend = "onnxruntime"``, validated when the backend opens
(``streamer run`` and ``streamer check``), as the ACL backends validate theirs
(:mod:`streamer.runtime.acl.options`).

Unknown keys are rejected and every error names the key, e.g.
``runtime.options.intra_op_thread: unknown key (known: ...); did you mean 'intra_op_threads'?``.

Example (TOML)::

    [runtime.options]
    intra_op_threads = 1                       # threads per session.run, 0 = onnxruntime's
    providers = ["CPUExecutionProvider"]       # execution providers, first choice first
    rows_per_run = 2                           # a batch runs as session.runs of 2 rows
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import onnxruntime as ort
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from streamer.config import validate_strict
from streamer.config_errors import error_lines
from streamer.errors import ConfigError

__all__ = ["OnnxOptions", "parse_onnx_options"]


class OnnxOptions(BaseModel):
    """The onnxruntime backend's options (see the module docstring)."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    intra_op_threads: int = Field(
        default=0, ge=0, le=1024, description="threads per session.run; 0 = onnxruntime's choice"
    )
    providers: tuple[str, ...] = Field(
        default=("CPUExecutionProvider",),
        min_length=1,
        description="execution providers, first choice first; with the CUDA (or ROCm) one, "
        "runtime.devices are its device ids",
    )
    rows_per_run: int = Field(
        default=0,
        ge=0,
        le=1 << 20,
        description="batch rows per session.run at most; a larger batch runs as several "
        "runs, their outputs joined; 0 = the whole batch in one run",
    )

    @field_validator("providers")
    @classmethod
    def _available(cls, providers: tuple[str, ...]) -> tuple[str, ...]:
        """Every provider must be one this onnxruntime build has: it would otherwise fall
        back to the CPU, saying so only on stderr."""
        available = ort.get_available_providers()
        missing = [p for p in providers if p not in available]
        if missing:
            raise ValueError(
                f"{missing} not in this onnxruntime build (it has {available}; the CUDA "
                "provider comes with the onnxruntime-gpu package)"
            )
        return providers


def parse_onnx_options(options: Mapping[str, Any], where: str = "runtime.options") -> OnnxOptions:
    """Validate an options table.

    Args:
        options: the raw ``[runtime.options]`` table (a model's own options merged on top).
        where: the key the table sits at, for the messages.

    Raises:
        ConfigError: a key is unknown or its value invalid; one line per key, each naming
            ``<where>.<key>``.
    """
    try:
        return validate_strict(OnnxOptions, options)
    except ValidationError as exc:
        raise ConfigError("\n".join(error_lines(exc, OnnxOptions, where))) from exc

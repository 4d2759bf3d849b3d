"""Typed configuration, read from a TOML file and validated at start (DESIGN.md §6).

Unknown keys are errors, not warnings, and every error names the file and the key at fault.
Pre- and post-processor parameters are free-form tables here; the plug-in registry in
``streamer.vision`` validates them when the pipeline is built (``streamer check`` included).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from streamer.errors import ConfigError

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on Python 3.10 only
    import tomli as tomllib

__all__ = [
    "BatchConfig",
    "Config",
    "DaemonConfig",
    "EgressConfig",
    "IngressConfig",
    "ModelConfig",
    "PluginConfig",
    "RuntimeConfig",
    "cache_dir",
    "load_config",
]

MiB = 1024 * 1024


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class DaemonConfig(_Strict):
    """``[daemon]``: process-wide settings."""

    log_level: Literal["debug", "info", "warning", "error"] = "info"
    log_format: Literal["auto", "console", "json"] = "auto"
    drain_timeout_s: float = Field(10.0, gt=0)
    decode_workers: int = Field(0, ge=0, description="0 = one per CPU core")
    queue_size: int = Field(64, ge=1, description="frames buffered between two stages")


class IngressConfig(_Strict):
    """``[[ingress]]``: one socket that receives frames."""

    name: str = "ingress"
    uri: str
    protocol: Literal["native"] = "native"
    on_full: Literal["block"] = "block"
    hwm: int = Field(100, ge=1, description="ZMQ receive high-water mark, messages")
    max_message_bytes: int = Field(64 * MiB, ge=1024)


class EgressConfig(_Strict):
    """``[[egress]]``: one socket that publishes results."""

    name: str = "egress"
    uri: str
    hwm: int = Field(1000, ge=1, description="ZMQ send high-water mark, messages")


class RuntimeConfig(_Strict):
    """``[runtime]``: the inference backend."""

    backend: Literal["onnxruntime", "acl", "acl-sim"] = "onnxruntime"
    devices: tuple[int, ...] = (0,)
    options: dict[str, Any] = Field(default_factory=dict)


class BatchConfig(_Strict):
    """``[models.batch]``: batch assembly."""

    max_size: int = Field(8, ge=1, description="frames per batch at most")
    max_delay_ms: float = Field(5.0, ge=0, description="wait for the oldest frame at most")
    gears: tuple[int, ...] = Field((), description="batch sizes a dynamic-batch model runs")

    @field_validator("gears")
    @classmethod
    def _gears_sorted_positive(cls, gears: tuple[int, ...]) -> tuple[int, ...]:
        if any(g < 1 for g in gears):
            raise ValueError("gears must be positive batch sizes")
        return tuple(sorted(set(gears)))


class PluginConfig(BaseModel):
    """A named pre/post-processor and its parameters (validated by the plug-in registry)."""

    model_config = ConfigDict(extra="allow", frozen=True)

    kind: str

    def params(self) -> dict[str, Any]:
        return dict(self.model_extra or {})


class ModelConfig(_Strict):
    """``[[models]]``: one model stage. Exactly one of ``path`` and ``asset``."""

    name: str
    path: Path | None = None
    asset: str | None = Field(None, description="a model fetched by `streamer models fetch`")
    mode: Literal["auto", "queue", "async", "sync"] = "auto"
    input: str = "frame"
    max_in_flight: int = Field(2, ge=1, description="batches enqueued and not yet dequeued")
    batch: BatchConfig = BatchConfig()
    preprocess: PluginConfig
    postprocess: PluginConfig

    @model_validator(mode="after")
    def _one_source(self) -> ModelConfig:
        if (self.path is None) == (self.asset is None):
            raise ValueError("set exactly one of `path` and `asset`")
        return self


class Config(_Strict):
    """The whole file."""

    daemon: DaemonConfig = DaemonConfig()
    ingress: tuple[IngressConfig, ...] = Field(min_length=1)
    egress: tuple[EgressConfig, ...] = Field(min_length=1)
    runtime: RuntimeConfig = RuntimeConfig()
    models: tuple[ModelConfig, ...] = Field(min_length=1)
    source_file: Path | None = Field(None, exclude=True)

    @model_validator(mode="after")
    def _unique_names(self) -> Config:
        names = [m.name for m in self.models]
        if len(set(names)) != len(names):
            raise ValueError(f"model names must be unique, got {names}")
        if len(self.models) > 1:
            raise ValueError("one model stage per pipeline for now (chains come later)")
        return self

    def model_path(self, model: ModelConfig) -> Path:
        """The file a model stage loads: ``asset`` in the cache, or ``path`` relative to the
        config file's folder."""
        if model.asset is not None:
            return cache_dir() / "models" / f"{model.asset}.onnx"
        assert model.path is not None
        path = model.path.expanduser()
        if not path.is_absolute() and self.source_file is not None:
            path = self.source_file.parent / path
        return path


def cache_dir() -> Path:
    """Where fetched models and media live: ``$STREAMER_CACHE``, else
    ``$XDG_CACHE_HOME/streamer``, else ``~/.cache/streamer``."""
    if env := os.environ.get("STREAMER_CACHE"):
        return Path(env).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "streamer"


def _format_errors(path: Path, exc: ValidationError) -> str:
    lines = [f"{path}: invalid configuration"]
    for err in exc.errors():
        key = ".".join(str(p) for p in err["loc"]) or "(top level)"
        lines.append(f"  {key}: {err['msg']}")
    return "\n".join(lines)


def load_config(path: str | os.PathLike[str]) -> Config:
    """Read and validate a TOML config file.

    Raises:
        ConfigError: the file is missing, is not TOML, or does not validate; the message
            names the file and every key at fault.
    """
    file = Path(path)
    try:
        data = tomllib.loads(file.read_text(encoding="utf-8"))
    except OSError as exc:
        raise ConfigError(f"{file}: cannot read config: {exc.strerror or exc}") from exc
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{file}: not valid TOML: {exc}") from exc
    try:
        return Config.model_validate({**data, "source_file": file.resolve()})
    except ValidationError as exc:
        raise ConfigError(_format_errors(file, exc)) from exc

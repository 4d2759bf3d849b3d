"""Typed configuration, read from a TOML file and validated at start (DESIGN.md §6).

Unknown keys are errors, not warnings, and every error names the file and the key at fault.
Pre- and post-processor parameters are free-form tables here; the plug-in registry in
``streamer.vision`` validates them when the pipeline is built (``streamer check`` included).
"""

from __future__ import annotations

import datetime
import json
import os
import re
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal, TypeVar

import pydantic_core
from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    DirectoryPath,
    Field,
    FilePath,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from streamer.config_errors import error_lines, key_text, table_index
from streamer.errors import ConfigError

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on Python 3.10 only
    import tomli as tomllib

__all__ = [
    "DEFAULT_MAX_SOURCES",
    "BatchConfig",
    "Config",
    "CpuSchedulingPolicy",
    "DaemonConfig",
    "EgressConfig",
    "FullPolicy",
    "IngressConfig",
    "ModelConfig",
    "PluginConfig",
    "PositiveCInt",
    "RuntimeConfig",
    "Seconds",
    "StageInput",
    "cache_dir",
    "load_config",
    "validate_strict",
]

MiB = 1024 * 1024
INT32_MAX = 2**31 - 1
"""The largest value of a C ``int`` option (ZeroMQ socket options, ACL timeouts, threads)."""
INT64_MAX = 2**63 - 1
MAX_DURATION_S = 1e9
"""The longest duration a setting may give (about 31 years): longer ones overflow the
timeouts of Python's waits."""
PositiveCInt = Annotated[int, Field(ge=1, le=INT32_MAX)]
"""A count or size that a C ``int`` holds (ZeroMQ socket options, ACL calls, buffers)."""
Seconds = Annotated[float, Field(gt=0, le=MAX_DURATION_S)]
"""A duration setting, s: positive, at most :data:`MAX_DURATION_S`."""
DEFAULT_MAX_SOURCES = 4096
"""The default ``daemon.max_sources`` (see its description)."""
_MIN_REORDER_WINDOW = 4096
"""The least default reorder window: a replica that fails holds its frames until its backend
gives them up (``result_timeout_ms`` on ACL, 10 s by default) while the others go on; a held
result carries no pixels (about 1 KB), so 4096 of them are cheap."""

FullPolicy = Literal["block", "drop_oldest", "latest"]
"""What an ingress does when the queue to the batcher is full (see
:mod:`streamer.scheduling.admission`)."""


_Model = TypeVar("_Model", bound=BaseModel)


def validate_strict(model: type[_Model], table: Mapping[str, Any]) -> _Model:
    """Validate a table read from TOML against ``model`` without converting types.

    Pydantic's default (lax) mode would take ``max_size = "8"`` as 8, ``replicas = true``
    as 1 and ``enabled = "no"`` as False, hiding typos in a config. This validates in
    pydantic's strict JSON mode instead: a TOML integer may fill a float and an array a
    tuple, but a string never fills a number, nor a number a bool. Paths are passed as
    their text (:func:`load_config` refuses TOML dates and times first: they would pass
    as their ISO text).

    Raises:
        pydantic.ValidationError: as ``model.model_validate`` does.
    """
    data = json.dumps(table, default=pydantic_core.to_jsonable_python)
    return model.model_validate_json(data, strict=True)


CpuSchedulingPolicy = Literal["batch", "other", "inherit"]
"""``[daemon] cpu_scheduling_policy``, in systemd's names (``CPUSchedulingPolicy=``): ``batch``
= ``SCHED_BATCH``, ``other`` = ``SCHED_OTHER``; ``inherit`` leaves the policy the daemon was
started with (``chrt``, a systemd unit). See :mod:`streamer.cpu_scheduling`."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


class DaemonConfig(_Strict):
    """``[daemon]``: process-wide settings."""

    log_level: Literal["debug", "info", "warning", "error"] = "info"
    log_format: Literal["auto", "console", "json"] = "auto"
    drain_timeout_s: Seconds = 10.0
    reload_timeout_s: Seconds = Field(
        20.0,
        description="at a reload, longest wait for the config file's read (a hung mount), then "
        "the reload is rejected; and longest wait for the old chain to finish the frames "
        "queued before the switch, then it is given up and the frames it holds are dropped "
        "(the reload runs beside the control loop, which goes on pinging the watchdog). The "
        "new models' load has no limit (it cannot be cancelled): while a reload runs, "
        "reload_in_progress is logged this long after the SIGHUP and every this long after "
        "that; later reloads wait for it (reload_deferred), and a load that hangs is cleared "
        "only by a restart",
    )
    decode_workers: int = Field(0, ge=0, le=1024, description="0 = one per CPU core")
    queue_size: PositiveCInt = Field(
        64, description="frames buffered between the ingresses and the first stage's batcher"
    )
    source_idle_s: Seconds = Field(
        60.0,
        description="forget a source silent this long, once its frames in flight have left "
        "(ten times this long: anyway)",
    )
    max_sources: PositiveCInt = Field(
        default=DEFAULT_MAX_SOURCES,
        description="sources tracked at once, each until it is forgotten (source_idle_s); a "
        "frame of a new source beyond them fails as too_many_sources. 4096: far more cameras "
        "than one daemon serves, or clips named one by one at 68 a second (at source_idle_s "
        "= 60), while the ids it holds at worst (about 3 per source, 64 KiB each) stay under "
        "1 GiB; set it to the fleet's size with a margin",
    )
    reorder_window: PositiveCInt | None = Field(
        None,
        description="frames a source holds for a late one; unset = what the chain can have in "
        "flight (Config.frames_in_flight), at least 4096",
    )
    reorder_timeout_s: Seconds | None = Field(
        None,
        description="longest a source's results wait for a late earlier frame (dropped "
        "frames' places do not wait: they are given up on after source_idle_s); unset = "
        "half of stall_timeout_s, on ACL plus four times runtime.options.result_timeout_ms "
        "and 1 s (a lost batch is found only then, and may run again on another replica)",
    )
    max_consecutive_failures: PositiveCInt = Field(
        10,
        description="failed executions in a row that take a model replica out of rotation "
        "(probes included, and on ACL queue mode lost outputs, each followed by a reload of "
        "the model: README 'Chains of models and several devices'); the daemon stops "
        "(exit 1) only when every replica of a stage is out",
    )
    http_address: str = Field(
        "127.0.0.1:9555",
        description="host:port of /healthz, /readyz and /metrics ([v6]:port for IPv6); "
        "empty = no HTTP server",
    )
    stall_timeout_s: Seconds = Field(
        30.0,
        description="frames in flight and none completed for this long = stalled: /readyz "
        "fails and the systemd watchdog pings stop",
    )
    status_interval_s: Seconds = Field(
        10.0, description="seconds between two systemd STATUS= lines"
    )
    cpu_scheduling_policy: CpuSchedulingPolicy = Field(
        "batch",
        description="Linux scheduling policy of the daemon's threads, systemd's names: batch "
        "(SCHED_BATCH: a waking thread does not preempt a running one, fewer context "
        "switches, more frames/s when the cores are full, a few ms more latency then) | "
        "other (SCHED_OTHER, the usual) | inherit (as started: chrt, the unit's "
        "CPUSchedulingPolicy=)",
    )

    @field_validator("http_address")
    @classmethod
    def _host_and_port(cls, address: str) -> str:
        if address:
            _split_host_port(address)
        return address

    @property
    def http_endpoint(self) -> tuple[str, int] | None:
        """``(host, port)`` of the HTTP server, or None when it is off."""
        return _split_host_port(self.http_address) if self.http_address else None


def _split_host_port(address: str) -> tuple[str, int]:
    """Split ``host:port`` (or ``[v6 address]:port``) into its parts; port 0 = any free port.

    Raises:
        ValueError: no host, or a port that is not an integer in 0..65535.
    """
    if address.startswith("[") and address.endswith("]"):  # in brackets, but no port
        raise ValueError(f"{address!r}: expected host:port, e.g. {address}:9555")
    host, sep, port = address.rpartition(":")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    elif ":" in host:
        raise ValueError(f"{address!r}: write an IPv6 address in brackets, e.g. [::1]:9555")
    if not sep or not host or not (port.isascii() and port.isdigit()) or int(port) > 65535:
        raise ValueError(f"{address!r}: expected host:port with a port in 0..65535")
    return host, int(port)


_NAME = re.compile(r"[A-Za-z0-9_.-]+")
"""What a socket or model (stage) name may be: it names threads, log lines and metric labels,
and ``input = "<stage>:<adapter>"`` cuts a stage's at the first ``:``."""


def _socket_name(name: str) -> str:
    if not _NAME.fullmatch(name):
        raise ValueError(f"{name!r}: a socket name is letters, digits, `_`, `-` and `.`")
    return name


SocketName = Annotated[str, AfterValidator(_socket_name)]


class IngressConfig(_Strict):
    """``[[ingress]]``: one socket that receives frames."""

    name: SocketName = "ingress"
    uri: str | tuple[str, ...] = Field(
        description="an endpoint URI, or a list of URIs of one socket type (one socket)"
    )
    protocol: Literal["native", "imagezmq"] = "native"
    on_full: FullPolicy = Field(
        "block", description="when the queue to the batcher is full: block | drop_oldest | latest"
    )
    hwm: PositiveCInt = Field(100, description="ZMQ receive high-water mark, messages")
    max_message_bytes: int = Field(
        64 * MiB,
        ge=1024,
        le=INT64_MAX,
        description="ZMQ MAXMSGSIZE: a peer sending more is disconnected",
    )
    topics: tuple[str, ...] = Field(
        (), description="sub, native protocol: accept only these topics (source ids); () = all"
    )
    source: str | None = Field(
        None, min_length=1, description="imagezmq: the source id of every frame, not `msg`"
    )
    max_width_px: PositiveCInt = Field(8192, description="wider images fail as too_large")
    max_height_px: PositiveCInt = Field(8192, description="taller images fail as too_large")
    max_pixels: int = Field(
        40_000_000, ge=1, le=INT64_MAX, description="width x height above fails too_large"
    )
    curve_secret_key_file: FilePath | None = Field(
        None, description="CURVE server key pair (tools/keygen.py); set to encrypt and authenticate"
    )
    curve_clients_dir: DirectoryPath | None = Field(
        None, description="CURVE: public keys (*.key) of the clients allowed to connect"
    )

    @field_validator("topics")
    @classmethod
    def _topics_on_sub(cls, topics: tuple[str, ...], info: ValidationInfo) -> tuple[str, ...]:
        uri = info.data.get("uri", ())
        uris = (uri,) if isinstance(uri, str) else uri
        if topics and not all(u.startswith("sub+") for u in uris):
            raise ValueError(f"`topics` applies to a `sub` ingress only; this one is {uri!r}")
        return topics

    @model_validator(mode="after")
    def _consistent(self) -> IngressConfig:
        if (self.curve_secret_key_file is None) != (self.curve_clients_dir is None):
            raise ValueError("set both `curve_secret_key_file` and `curve_clients_dir`, or neither")
        if self.source is not None and self.protocol != "imagezmq":
            raise ValueError("`source` applies to protocol = 'imagezmq' only")
        if self.topics and self.protocol != "native":
            raise ValueError("`topics` applies to the native protocol only (imagezmq has no topic)")
        return self


class EgressConfig(_Strict):
    """``[[egress]]``: one socket that publishes results."""

    name: SocketName = "egress"
    uri: str
    hwm: PositiveCInt = Field(1000, description="ZMQ send high-water mark, messages")
    curve_secret_key_file: FilePath | None = Field(
        None, description="CURVE server key pair (tools/keygen.py); set to encrypt and authenticate"
    )
    curve_clients_dir: DirectoryPath | None = Field(
        None, description="CURVE: public keys (*.key) of the subscribers allowed to connect"
    )

    @model_validator(mode="after")
    def _curve_pair(self) -> EgressConfig:
        if (self.curve_secret_key_file is None) != (self.curve_clients_dir is None):
            raise ValueError("set both `curve_secret_key_file` and `curve_clients_dir`, or neither")
        return self


class RuntimeConfig(_Strict):
    """``[runtime]``: the inference backend."""

    backend: Literal["onnxruntime", "acl", "acl-sim"] = "onnxruntime"
    devices: tuple[int, ...] = Field(
        (0,),
        max_length=1024,
        description="device ids (ACL devices, CUDA devices, CPU replicas); one at least",
    )
    options: dict[str, Any] = Field(default_factory=dict)

    @field_validator("devices")
    @classmethod
    def _devices(cls, devices: tuple[int, ...]) -> tuple[int, ...]:
        if not devices:
            raise ValueError("list one device id at least, e.g. [0]")
        if any(not 0 <= d <= INT32_MAX for d in devices):
            raise ValueError(f"device ids are in 0..{INT32_MAX}, got {list(devices)}")
        if len(set(devices)) != len(devices):
            raise ValueError(f"device ids must be distinct, got {list(devices)}")
        return devices


class BatchConfig(_Strict):
    """``[models.batch]``: batch assembly."""

    max_size: PositiveCInt = Field(8, description="frames per batch at most")
    max_delay_ms: float = Field(
        5.0, ge=0, le=MAX_DURATION_S * 1000, description="wait for the oldest frame at most"
    )
    gears: tuple[int, ...] = Field(
        (),
        description="batch sizes a dynamic-batch model runs; () = the model's own, or "
        "powers of two up to max_size; one whose input cannot fit in the machine's memory "
        "fails at start",
    )
    strategy: Literal["upper", "nearest", "lower"] = Field(
        "upper", description="how a batch is cut into gears: pad up, nearest, or split down"
    )

    @field_validator("gears")
    @classmethod
    def _gears_sorted_positive(cls, gears: tuple[int, ...]) -> tuple[int, ...]:
        if any(not 1 <= g <= INT32_MAX for g in gears):
            raise ValueError(f"gears must be batch sizes in 1..{INT32_MAX}")
        return tuple(sorted(set(gears)))


class PluginConfig(BaseModel):
    """A named pre/post-processor and its parameters (validated by the plug-in registry)."""

    model_config = ConfigDict(extra="allow", frozen=True)

    kind: str

    def params(self) -> dict[str, Any]:
        return dict(self.model_extra or {})


Adapter = Literal["crops", "tensor"]
"""How a stage reads an upstream stage: ``crops`` of its detections, or its outputs as tensors."""


@dataclass(frozen=True)
class StageInput:
    """What a model stage reads (``[[models]] input``): the frame, or an upstream stage.

    Forms:
        ``"frame"``: the decoded frame, through the stage's preprocess.
        ``"<stage>:crops"``: a crop of each detection of ``<stage>`` (an item stage).
        ``"<stage>:tensor"``: the outputs of ``<stage>`` as they are, batch by batch; each
            input is fed by the upstream output of the same name (or, one output and one
            input, by that one).
        ``"<stage>:tensor:<map>"``: ``<map>`` is a comma-separated list of ``<output>`` or
            ``<output>=<input>``: each named output feeds the named input, or without
            ``=<input>`` the input of the same name (or the model's only input).

    Tensor names may contain ``:`` (``onnx::Conv_12``), not ``,`` or ``=``.

    Attributes:
        upstream: the stage read from; None for the frame.
        adapter: ``crops`` or ``tensor``; None for the frame.
        pairs: a tensor input's ``<map>``: ``(output, input or None)`` each; () without one.
    """

    upstream: str | None = None
    adapter: Adapter | None = None
    pairs: tuple[tuple[str, str | None], ...] = ()

    @classmethod
    def parse(cls, text: str) -> StageInput:
        """Parse one ``input`` value.

        Raises:
            ValueError: not one of the forms above; the message says which part is wrong.
        """
        if text == "frame":
            return cls()
        upstream, _, rest = text.partition(":")
        adapter, has_map, mapping = rest.partition(":")
        if not upstream or adapter not in ("crops", "tensor"):
            raise ValueError(
                f'{text!r}: expected "frame", "<stage>:crops", "<stage>:tensor" or '
                '"<stage>:tensor:<output>[=<input>],..."'
            )
        if adapter == "crops":
            if has_map:
                raise ValueError(f"{text!r}: the crops adapter takes no tensor map")
            return cls(upstream, "crops")
        if has_map and not mapping.strip():
            raise ValueError(
                f'{text!r}: the tensor map after "tensor:" is empty; write "{upstream}:tensor" '
                "or list <output>[=<input>],..."
            )
        return cls(upstream, "tensor", _tensor_map(text, mapping) if has_map else ())


def _tensor_map(text: str, mapping: str) -> tuple[tuple[str, str | None], ...]:
    """The ``(output, input or None)`` pairs of a tensor map.

    Raises:
        ValueError: an empty output or input name.
    """
    pairs: list[tuple[str, str | None]] = []
    for item in mapping.split(","):
        output, equals, name = (part.strip() for part in item.partition("="))
        if not output or (equals and not name):
            raise ValueError(f"{text!r}: {item!r} is not <output> or <output>=<input>")
        pairs.append((output, name or None))
    return tuple(pairs)


class ModelConfig(_Strict):
    """``[[models]]``: one model stage. Exactly one of ``path`` and ``asset``."""

    name: str
    path: Path | None = None
    asset: str | None = Field(None, description="a model fetched by `streamer models fetch`")
    mode: Literal["auto", "queue", "async", "sync"] = Field(
        "auto",
        description="ACL execution mode: auto (queue for a static-shape model where queue mode "
        "is available, else async; never sync), queue, async, or sync (debugging only: "
        "acl.mdl.execute holds the GIL, stopping every other thread of the daemon for each "
        "execution)",
    )
    input: str = Field(
        "frame",
        description='"frame", "<stage>:crops", "<stage>:tensor" or "<stage>:tensor:<map>" '
        "(see StageInput)",
    )
    max_in_flight: PositiveCInt = Field(
        2, description="batches enqueued and not yet dequeued, per replica (ACL queue mode: 1)"
    )
    replicas: int = Field(1, ge=1, le=1024, description="copies of the model on each device")
    batch: BatchConfig = BatchConfig()
    preprocess: PluginConfig | None = Field(
        None,
        description="required unless postprocess is an item stage (mtcnn_*) or the input is "
        "another stage's tensors",
    )
    postprocess: PluginConfig | None = Field(
        None, description="required unless the stage feeds a `:tensor` stage"
    )

    @field_validator("name")
    @classmethod
    def _name_syntax(cls, name: str) -> str:
        if not _NAME.fullmatch(name):
            raise ValueError(
                f"{name!r}: a model name is letters, digits, `_`, `-` and `.` (at least one; "
                'no ":", which ends the stage name in input = "<stage>:<adapter>")'
            )
        return name

    @field_validator("input")
    @classmethod
    def _input_syntax(cls, text: str) -> str:
        StageInput.parse(text)
        return text

    @model_validator(mode="after")
    def _one_source(self) -> ModelConfig:
        if (self.path is None) == (self.asset is None):
            raise ValueError("set exactly one of `path` and `asset`")
        return self

    @property
    def source(self) -> StageInput:
        """The parsed ``input``."""
        return StageInput.parse(self.input)


class Config(_Strict):
    """The whole file."""

    daemon: DaemonConfig = DaemonConfig()
    ingress: tuple[IngressConfig, ...] = Field(min_length=1)
    egress: tuple[EgressConfig, ...] = Field(min_length=1)
    runtime: RuntimeConfig = RuntimeConfig()
    models: tuple[ModelConfig, ...] = Field(min_length=1)
    source_file: Path | None = Field(None, exclude=True)

    @field_validator("ingress", "egress")
    @classmethod
    def _unique_socket_names(
        cls, tables: tuple[IngressConfig | EgressConfig, ...], info: ValidationInfo
    ) -> tuple[IngressConfig | EgressConfig, ...]:
        names = [table.name for table in tables]
        twice = sorted({name for name in names if names.count(name) > 1})
        if twice:
            raise ValueError(
                f"[[{info.field_name}]] names must be unique; {twice} named more than one "
                f"(`name` defaults to {info.field_name!r})"
            )
        return tables

    @field_validator("models")
    @classmethod
    def _one_chain(cls, models: tuple[ModelConfig, ...]) -> tuple[ModelConfig, ...]:
        names = [m.name for m in models]
        if len(set(names)) != len(names):
            raise ValueError(f"model names must be unique, got {names}")
        chain_order(models)
        return models

    def chain(self) -> list[ModelConfig]:
        """The model stages in chain order (``frame`` first)."""
        return chain_order(self.models)

    def frames_in_flight(self) -> int:
        """The most frames between the door and egress: the admission queue
        (``daemon.queue_size``), and per stage a batch being assembled plus, on every replica
        of every device, ``max_in_flight`` batches enqueued, one being enqueued and one being
        dequeued, each of the stage's largest batch (rows; a crops stage's rows are items of
        fewer frames, so this bounds it from above). A frame that fails before the model
        (a corrupt image) can overtake them all."""
        return self.daemon.queue_size + sum(
            (len(self.runtime.devices) * model.replicas * (model.max_in_flight + 2) + 1)
            * max((model.batch.max_size, *model.batch.gears))
            for model in self.models
        )

    def reorder_window(self) -> int:
        """``daemon.reorder_window``, or when unset :meth:`frames_in_flight` (a frame can
        finish that many frames after later ones of its source), at least 4096."""
        if self.daemon.reorder_window is not None:
            return self.daemon.reorder_window
        return max(_MIN_REORDER_WINDOW, self.frames_in_flight())

    def model_key(self, model: ModelConfig) -> str:
        """How a message names ``model``'s table, as :func:`key_text` names a key in it:
        ``models[0] ('face')``."""
        return "models" + table_index(self.models.index(model), model.name)

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


def chain_order(models: tuple[ModelConfig, ...]) -> list[ModelConfig]:
    """Order the stages by their ``input``: one reads ``frame``, each other an upstream stage
    through an adapter (:class:`StageInput`).

    Every stage but the ``frame`` one reads one known upstream and feeds at most one stage,
    so without a cycle the stages form one chain from the ``frame`` stage.

    Raises:
        ValueError: an unknown stage, two stages on one upstream, a cycle (named in flow
            order), several ``frame`` stages, or plug-in tables that do not fit the adapters
            (see :func:`_check_tables`).
    """
    downstream: dict[str, ModelConfig] = {}
    names = {m.name for m in models}
    for model in models:
        upstream = model.source.upstream
        if upstream is None:
            continue
        if upstream not in names:
            raise ValueError(f"models {model.name!r}: input {model.input!r}: no stage {upstream!r}")
        if upstream in downstream:
            raise ValueError(f"stage {upstream!r} feeds two stages; one downstream stage each")
        downstream[upstream] = model
    cycle = _cycle(models)
    if cycle:
        loop = " -> ".join(repr(name) for name in [*cycle, cycle[0]])
        raise ValueError(
            f"stages {sorted(cycle)} form a cycle ({loop}, each feeding the next); a chain "
            'starts at the one stage with input = "frame"'
        )
    roots = [m for m in models if m.source.upstream is None]
    if len(roots) != 1:
        raise ValueError(f'exactly one model needs input = "frame", got {len(roots)}')
    chain = [roots[0]]
    while chain[-1].name in downstream:
        chain.append(downstream[chain[-1].name])
    for model, feeds in zip(chain, [*chain[1:], None], strict=True):
        _check_tables(model, feeds)
    return chain


def _cycle(models: tuple[ModelConfig, ...]) -> list[str]:
    """The names of a cycle of stages, in flow order (each feeds the next and the last the
    first); empty when there is none. Every upstream named must be a stage."""
    upstream_of = {m.name: m.source.upstream for m in models}
    for start in upstream_of:
        path: list[str] = []
        name: str | None = start
        while name is not None and name not in path:
            path.append(name)
            name = upstream_of[name]
        if name is not None:
            return path[path.index(name) :][::-1]
    return []


def _check_tables(model: ModelConfig, feeds: ModelConfig | None) -> None:
    """The plug-in and batch tables a stage may have, given its adapters.

    A stage that feeds a ``:tensor`` stage hands its outputs on as they are: it has no
    postprocess (the frame's results come from a later stage's), and every other stage needs
    one. A ``:tensor`` stage takes its upstream's batches as they are: no preprocess and no
    ``[models.batch]`` of its own.

    Raises:
        ValueError: a table present or missing against these rules, naming the stage.
    """
    hands_on = feeds is not None and feeds.source.adapter == "tensor"
    if hands_on and model.postprocess is not None:
        assert feeds is not None
        raise ValueError(
            f"models {model.name!r}: it feeds {feeds.name!r} through the tensor adapter, which "
            "takes its outputs as they are; remove its [models.postprocess] (the frame's "
            "results come from the last stage's postprocess)"
        )
    if not hands_on and model.postprocess is None:
        raise ValueError(
            f"models {model.name!r}: [models.postprocess] is required (only a stage that "
            "feeds a `:tensor` stage has none)"
        )
    if model.source.adapter != "tensor":
        return
    if model.preprocess is not None:
        raise ValueError(
            f"models {model.name!r}: input {model.input!r} takes the upstream outputs as they "
            "are; remove its [models.preprocess] (frames keep the first stage's transform)"
        )
    if model.batch != BatchConfig():
        raise ValueError(
            f"models {model.name!r}: input {model.input!r} runs the upstream's batches as they "
            f"are; set [models.batch] on {model.source.upstream!r} instead"
        )


def cache_dir() -> Path:
    """Where fetched models and media live: ``$STREAMER_CACHE``, else
    ``$XDG_CACHE_HOME/streamer``, else ``~/.cache/streamer``. A relative
    ``$XDG_CACHE_HOME`` is ignored, as the XDG Base Directory spec asks (it would name
    another cache in each working directory)."""
    if env := os.environ.get("STREAMER_CACHE"):
        try:
            return Path(env).expanduser()
        except RuntimeError:  # ~user of no such user: kept as it is, as a shell keeps it
            return Path(env)
    xdg = Path(os.environ.get("XDG_CACHE_HOME", ""))
    base = xdg if xdg.is_absolute() else Path.home() / ".cache"
    return base / "streamer"


def _format_errors(path: Path, exc: ValidationError, data: Mapping[str, Any]) -> str:
    """One line per error, naming its key (:func:`error_lines`; ``data`` is the file's table)."""
    lines = [f"{path}: invalid configuration"]
    lines += [f"  {line}" for line in error_lines(exc, Config, "", data)]
    return "\n".join(lines)


_KEY_PATHS = ("curve_secret_key_file", "curve_clients_dir")


def _resolve_key_paths(data: dict[str, Any], folder: Path) -> None:
    """Make the relative CURVE key paths of the ``[[ingress]]`` and ``[[egress]]`` tables, and
    the ACL backends' ``runtime.options.acl_config_path``, relative to ``folder`` (the config
    file's), as model paths are; ``~`` is expanded, in the models' ``path`` too (a ``~user``
    of no such user is a config error, not a crash when the model is looked for)."""
    for table in ("ingress", "egress"):
        entries = data.get(table)
        for entry in entries if isinstance(entries, list) else []:
            for key in _KEY_PATHS:
                value = entry.get(key) if isinstance(entry, dict) else None
                if isinstance(value, str) and value:
                    entry[key] = str(folder / _expanded(value, f"{table}.{key}"))
    models = data.get("models")
    for index, model in enumerate(models if isinstance(models, list) else []):
        value = model.get("path") if isinstance(model, dict) else None
        if isinstance(value, str) and value.startswith("~"):  # the folder joins it later
            model["path"] = str(_expanded(value, f"models[{index}].path"))
    runtime = data.get("runtime")
    options = runtime.get("options") if isinstance(runtime, dict) else None
    if isinstance(options, dict):
        value = options.get("acl_config_path")
        if isinstance(value, str) and value:
            key = "runtime.options.acl_config_path"
            options["acl_config_path"] = str(folder / _expanded(value, key))


def _expanded(path: str, key: str) -> Path:
    """``path`` with ``~`` or ``~user`` expanded.

    Raises:
        ValueError: the home folder is unknown (no such user).
    """
    try:
        return Path(path).expanduser()
    except RuntimeError as exc:
        raise ValueError(f"{key}: cannot expand {path!r}: {exc}") from exc


def _refuse_dates_and_nuls(
    value: Any, file: Path, root: Any, loc: tuple[int | str, ...] = ()
) -> None:
    """No setting takes a TOML date or time; refuse one before validation, which would pass
    it on as its ISO text (:func:`validate_strict`). Nor a string with a NUL character: no
    path, address or name holds one (a model ``path`` with one was a ValueError traceback).
    ``root`` is the file's table, ``loc`` where ``value`` sits in it.

    Raises:
        ConfigError: naming the file and the key.
    """
    if isinstance(value, datetime.date | datetime.time):
        raise ConfigError(
            f"{file}: invalid configuration\n"
            f"  {key_text(loc, root)}: a date or time is not a valid value"
        )
    if isinstance(value, str) and "\0" in value:  # a path or address the OS refuses
        raise ConfigError(
            f"{file}: invalid configuration\n"
            f"  {key_text(loc, root)}: a NUL character (\\u0000) is not a valid value"
        )
    children = (
        value.items()
        if isinstance(value, dict)
        else enumerate(value)
        if isinstance(value, list)
        else ()
    )
    for name, child in children:
        _refuse_dates_and_nuls(child, file, root, (*loc, name))


MAX_CONFIG_BYTES = 16 << 20
"""Largest config file read (bytes): a bigger one is a mistake (a 300 MB file took 900 MB
of memory to parse)."""


def load_config(path: str | os.PathLike[str]) -> Config:
    """Read and validate a TOML config file.

    Raises:
        ConfigError: the file is missing, larger than :data:`MAX_CONFIG_BYTES`, is not TOML
            (or not UTF-8, with or without a byte order mark), or does not validate; the
            message names the file and every key at fault.
    """
    file = Path(path)
    try:
        with file.open("rb") as stream:
            raw = stream.read(MAX_CONFIG_BYTES + 1)
        if len(raw) > MAX_CONFIG_BYTES:
            raise ConfigError(f"{file}: more than {MAX_CONFIG_BYTES >> 20} MiB: not a config")
        data = tomllib.loads(raw.decode("utf-8-sig"))  # a byte order mark, as editors write
    except OSError as exc:
        raise ConfigError(f"{file}: cannot read config: {exc.strerror or exc}") from exc
    except (tomllib.TOMLDecodeError, ValueError, RecursionError) as exc:
        # ValueError: a decimal integer of 4300+ digits; RecursionError: deep nesting.
        raise ConfigError(f"{file}: not valid TOML: {exc}") from exc
    if "source_file" in data:  # set from the path below, not a setting
        raise ConfigError(f"{file}: invalid configuration\n  source_file: unknown key")
    try:
        _refuse_dates_and_nuls(data, file, data)
        _resolve_key_paths(data, file.resolve().parent)
        return validate_strict(Config, {**data, "source_file": file.resolve()})
    except ValidationError as exc:
        raise ConfigError(_format_errors(file, exc, data)) from exc
    except (ValueError, RecursionError) as exc:
        # A hex/octal/binary integer too long to print in decimal; arrays nested too deep.
        raise ConfigError(f"{file}: invalid configuration: {exc}") from exc

"""The config every mode of one benchmark runs: the given one, put on free loopback ports.

:func:`bench_config` keeps everything of the base config (by default
``configs/default.toml``) that changes the work done per frame, and changes only what a
benchmark needs: one native PULL ingress with ``on_full = "block"`` and one PUB egress on
free 127.0.0.1 ports, the HTTP server (for ``/metrics``) on another, JSON logs, the batch
``max_size`` under test, and for ``acl-sim`` the simulator's model layout
(:func:`streamer.sim_layout.sim_layout`).
"""

from __future__ import annotations

import socket
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from streamer.config import Config
from streamer.errors import ConfigError
from streamer.sim_layout import sim_layout
from streamer.vision.registry import POSTPROCESSORS

__all__ = [
    "BACKENDS",
    "Ports",
    "bench_config",
    "device_side_processing",
    "free_port",
]

BACKENDS = ("onnxruntime", "acl-sim")
"""Backends the benchmark runs: the embedded default, and the ACL backend on its simulator."""


_given: set[int] = set()
_given_lock = threading.Lock()


def free_port() -> int:
    """A TCP port free on 127.0.0.1 now (the OS picks it), never one this process was given
    before: the OS may pick a port again once its probe is closed, and a daemon given one
    port for two endpoints fails to start."""
    with _given_lock:
        while True:
            with socket.socket() as probe:
                probe.bind(("127.0.0.1", 0))
                port = int(probe.getsockname()[1])
            if port not in _given:
                _given.add(port)
                return port


@dataclass(frozen=True)
class Ports:
    """Loopback ports of one daemon: ingress, egress and HTTP."""

    ingress: int
    egress: int
    http: int

    @classmethod
    def free(cls) -> Ports:
        return cls(free_port(), free_port(), free_port())

    @property
    def ingress_endpoint(self) -> str:
        return f"tcp://127.0.0.1:{self.ingress}"

    @property
    def egress_endpoint(self) -> str:
        return f"tcp://127.0.0.1:{self.egress}"

    @property
    def metrics_url(self) -> str:
        return f"http://127.0.0.1:{self.http}/metrics"


def bench_config(
    base: Config,
    *,
    backend: str,
    max_size: int,
    ports: Ports,
    models_dir: Path,
    batch_sizes: tuple[int, ...],
    device_side: bool = False,
) -> Config:
    """The benchmark's config derived from ``base`` (see the module docstring).

    Args:
        base: the validated base config; its first ingress, egress and model are used.
        backend: ``onnxruntime`` or ``acl-sim``.
        max_size: ``[models.batch] max_size``.
        ports: where the daemon listens.
        models_dir: where the ``acl-sim`` layout (``<name>.om``, ``<name>.onnx``,
            ``<name>.acl.json`` per stage) is written.
        batch_sizes: the batch gears of the ``acl-sim`` models (ATC ``--dynamic_batch_size``).
        device_side: move the first stage's pre- and post-processing off the host
            (:func:`device_side_processing`); on ``acl-sim`` its model then gets static AIPP.

    Raises:
        ConfigError: ``device_side`` for a stage without a ``letterbox`` preprocess.
    """
    data = base.model_dump(mode="json", exclude_none=True)
    data["daemon"].update(log_format="json", http_address=f"127.0.0.1:{ports.http}")
    data["ingress"] = [_ingress(data["ingress"][0], ports)]
    data["egress"] = [_egress(data["egress"][0], ports)]
    for table, model_config in zip(data["models"], base.models, strict=True):
        if model_config.path is not None:  # the written config lives elsewhere (--out)
            table["path"] = str(base.model_path(model_config))
    model = data["models"][0]
    model["batch"]["max_size"] = max_size
    if device_side:
        device_side_processing(model, backend)
    config = Config.model_validate({**data, "source_file": base.source_file})
    if backend == "acl-sim":
        return sim_layout(config, models_dir, mode="auto", batch_sizes=batch_sizes)
    return config


def device_side_processing(model: dict[str, Any], backend: str) -> None:
    """Move a ``[[models]]`` table's pre- and post-processing off the host, in place.

    The letterbox normalisation goes into the model: composed into the graph on onnxruntime
    (``normalize = "model"``), static AIPP on the ACL simulator (``normalize = "device"``);
    NMS becomes single operators on the backend (``nms = "operator"``) where the
    postprocessor has an ``nms`` key.

    Raises:
        ConfigError: the preprocess is not a ``letterbox``.
    """
    preprocess = model.get("preprocess") or {}
    if preprocess.get("kind") != "letterbox":
        raise ConfigError("device-side processing needs a letterbox preprocess on models[0]")
    preprocess["normalize"] = "model" if backend == "onnxruntime" else "device"
    postprocess = model.get("postprocess") or {}  # none: the bench refuses the chain later
    kind = postprocess.get("kind", "")
    if kind in POSTPROCESSORS and "nms" in POSTPROCESSORS.get(kind).params.model_fields:
        postprocess["nms"] = "operator"


def _ingress(ingress: dict[str, Any], ports: Ports) -> dict[str, Any]:
    drop = ("curve_secret_key_file", "curve_clients_dir", "source", "topics")
    kept = {k: v for k, v in ingress.items() if k not in drop}
    uri = f"pull+bind:tcp://127.0.0.1:{ports.ingress}"
    return {**kept, "uri": uri, "protocol": "native", "on_full": "block"}


def _egress(egress: dict[str, Any], ports: Ports) -> dict[str, Any]:
    kept = {k: v for k, v in egress.items() if not k.startswith("curve_")}
    return {**kept, "uri": f"pub+bind:tcp://127.0.0.1:{ports.egress}"}

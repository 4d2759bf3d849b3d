"""Inference backends behind one contract (:mod:`streamer.runtime.base`).

Backends are imported lazily, only when selected, so that ``acl`` (pyACL, shipped with CANN)
is never imported on a machine that does not use it. :func:`open_backend` checks that the
selected class provides every name of the contract (as pyzmq's ``select_backend`` does).
"""

from __future__ import annotations

import importlib
from typing import Any

from streamer.config import RuntimeConfig
from streamer.errors import ConfigError
from streamer.runtime.base import Backend, InferenceOutputs, ModelInfo, ModelSpec, QueueModel

__all__ = [
    "BACKENDS",
    "Backend",
    "InferenceOutputs",
    "ModelInfo",
    "ModelSpec",
    "QueueModel",
    "check_runtime",
    "open_backend",
]

BACKENDS: dict[str, str] = {
    "onnxruntime": "streamer.runtime.onnx:OnnxBackend",
    "acl": "streamer.runtime.acl.backend:AclBackend",
    "acl-sim": "streamer.runtime.acl.sim.backend:AclSimBackend",
}
"""Backend name → ``module:Class``; the class is built as ``Class(runtime_config)``."""

_REQUIRED = ("check_options", "load", "close")


def open_backend(config: RuntimeConfig) -> Backend:
    """Import, check and open the backend named by ``config.backend``.

    Raises:
        ConfigError: the backend is unknown or does not provide the contract.
        BackendError: the runtime could not be initialised (e.g. pyACL missing).
    """
    cls: Any = _backend_class(config.backend)  # built as Class(runtime_config): BACKENDS
    backend: Backend = cls(config)
    return backend


def check_runtime(config: RuntimeConfig) -> None:
    """Check ``[runtime]`` as :func:`open_backend` would, without opening the backend: its
    name and its options (a reload cannot apply them, but must not accept what the next
    start would refuse).

    Raises:
        ConfigError: the backend is unknown, or an option is unknown or invalid.
    """
    _backend_class(config.backend).check_options(config)


def _backend_class(name: str) -> type[Backend]:
    """The backend class named ``name``, imported.

    Raises:
        ConfigError: the backend is unknown or does not provide the contract.
    """
    target = BACKENDS.get(name)
    if target is None:
        raise ConfigError(f"runtime.backend: unknown {name!r}; known: {sorted(BACKENDS)}")
    module_name, _, class_name = target.partition(":")
    cls = getattr(importlib.import_module(module_name), class_name)
    missing = [attr for attr in _REQUIRED if not callable(getattr(cls, attr, None))]
    if missing or not issubclass(cls, Backend):
        raise ConfigError(f"backend {name!r} lacks {missing or 'the Backend base'}")
    return cls

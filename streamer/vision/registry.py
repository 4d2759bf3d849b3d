"""Named pre- and post-processor plug-ins, built from the config when the pipeline is built.

A plug-in is a factory registered under a name with the pydantic model of its parameters::

    @POSTPROCESSORS.register("blazeface", BlazeFaceParams)
    class BlazeFacePostprocessor:
        def __init__(self, params: BlazeFaceParams, info: ModelInfo) -> None: ...

The config names it in a ``[models.postprocess]`` table (``kind = "blazeface"``, other keys are
the parameters); :meth:`Registry.create` validates the parameters (unknown keys are errors)
and calls the factory with them and the loaded model's :class:`ModelInfo`. Every problem is a
:class:`ConfigError` that names where in the config it is (e.g. ``models[0].postprocess``) and
the key at fault, so ``streamer check`` reports it before any frame flows.

The built-in plug-ins live in :mod:`streamer.vision.preprocess` and
:mod:`streamer.vision.postprocess`; a registry imports its built-in modules on first lookup,
so callers need not import them first.
"""

from __future__ import annotations

import importlib
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from pydantic import BaseModel, ConfigDict, ValidationError

from streamer.config import PluginConfig, validate_strict
from streamer.config_errors import error_lines
from streamer.errors import ConfigError
from streamer.runtime.base import ModelInfo
from streamer.runtime.ops.base import Operators

if TYPE_CHECKING:
    from streamer.vision.postprocess import Postprocessor
    from streamer.vision.preprocess import Preprocessor

__all__ = ["POSTPROCESSORS", "PREPROCESSORS", "PluginParams", "Registry", "RegistryEntry"]

T = TypeVar("T")
F = TypeVar("F", bound=Callable[..., Any])


class PluginParams(BaseModel):
    """Base of every plug-in's parameter model: unknown keys are rejected, values frozen."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    @property
    def device_outputs(self) -> bool:
        """Whether the plug-in reads the model's outputs where the backend left them
        (:class:`~streamer.runtime.base.DeviceTensor` on ACL; it runs single operators on
        them), so the model is loaded with ``ModelSpec.device_outputs``. False here."""
        return False


@dataclass(frozen=True, slots=True)
class RegistryEntry(Generic[T]):
    """One registered plug-in.

    Attributes:
        name: the ``kind`` that selects it in the config.
        params: the pydantic model its parameters are validated with.
        factory: builds the plug-in from validated params and the model's :class:`ModelInfo`;
            may raise :class:`ConfigError` when the params do not fit the model.
        operators: the factory takes a third argument, the pipeline backend's
            :class:`~streamer.runtime.ops.Operators` (or None where there is no backend),
            for plug-ins that run single operators (``nms = "operator"``).
    """

    name: str
    params: type[PluginParams]
    factory: Callable[..., T]
    operators: bool = False


class Registry(Generic[T]):
    """Plug-ins of one kind (pre- or post-processors), by name.

    Registration happens at import time; lookups and :meth:`create` may be called from any
    thread.

    Args:
        kind: what the plug-ins are, for messages (``preprocessor``).
        builtins: modules that register the built-in plug-ins, imported on first lookup.
    """

    def __init__(self, kind: str, builtins: tuple[str, ...] = ()) -> None:
        self.kind = kind
        self._builtins = builtins
        self._loaded = not builtins
        self._lock = threading.Lock()
        self._entries: dict[str, RegistryEntry[T]] = {}

    def register(
        self, name: str, params: type[PluginParams], *, operators: bool = False
    ) -> Callable[[F], F]:
        """Decorator: register a factory (a class or a function) under ``name``; with
        ``operators`` the factory also takes the backend's operators (:class:`RegistryEntry`).

        Raises:
            ValueError: ``name`` is already registered (a programming error, not a config one).
        """

        def decorate(factory: F) -> F:
            with self._lock:
                if name in self._entries:
                    raise ValueError(f"{self.kind} {name!r} is already registered")
                self._entries[name] = RegistryEntry(name, params, factory, operators)
            return factory

        return decorate

    def names(self) -> tuple[str, ...]:
        """The registered names, sorted."""
        self._load_builtins()
        return tuple(sorted(self._entries))

    def __contains__(self, name: object) -> bool:
        self._load_builtins()
        return name in self._entries

    def get(self, name: str) -> RegistryEntry[T]:
        """The plug-in registered as ``name``.

        Raises:
            ConfigError: no such plug-in; the message lists the known names.
        """
        self._load_builtins()
        entry = self._entries.get(name)
        if entry is None:
            known = ", ".join(self.names()) or "none"
            raise ConfigError(f"unknown {self.kind} {name!r}; known: {known}")
        return entry

    def create(
        self,
        cfg: PluginConfig,
        info: ModelInfo,
        where: str,
        operators: Operators | None = None,
    ) -> T:
        """Validate ``cfg``'s parameters and build the plug-in for the model ``info``.

        Args:
            cfg: the config table (``kind`` and parameters).
            info: the loaded model the plug-in serves.
            where: the config location, e.g. ``models[0].postprocess``, used in messages.
            operators: the backend's single operators, handed to plug-ins registered with
                ``operators=True``.

        Raises:
            ConfigError: unknown ``kind``, an invalid or unknown parameter, or parameters that
                do not fit the model; the message starts with ``where`` and names the key.
        """
        params = self.params(cfg, where)
        entry = self.get(cfg.kind)
        extra = (operators,) if entry.operators else ()
        try:
            return entry.factory(params, info, *extra)
        except ConfigError as exc:
            raise ConfigError(f"{where}: {cfg.kind}: {exc}") from exc

    def params(self, cfg: PluginConfig, where: str) -> PluginParams:
        """``cfg``'s parameters, validated: what :meth:`create` gives the factory.

        Raises:
            ConfigError: unknown ``kind``, or an invalid or unknown parameter; the message
                starts with ``where``.
        """
        try:
            entry = self.get(cfg.kind)
        except ConfigError as exc:
            raise ConfigError(f"{where}.kind: {exc}") from exc
        return _validate(entry, cfg.params(), where)

    def _load_builtins(self) -> None:
        if self._loaded:
            return
        for module in self._builtins:
            importlib.import_module(module)
        self._loaded = True


def _validate(entry: RegistryEntry[Any], raw: dict[str, Any], where: str) -> PluginParams:
    """Validate ``raw`` with the entry's params model.

    Raises:
        ConfigError: one line per key at fault, each ``<where>.<key>: <problem>``.
    """
    try:
        return validate_strict(entry.params, raw)
    except ValidationError as exc:
        lines = [f"{where}: invalid parameters for {entry.name!r}"]
        lines += [f"  {line}" for line in error_lines(exc, entry.params, where)]
        raise ConfigError("\n".join(lines)) from exc


PREPROCESSORS: Registry[Preprocessor] = Registry("preprocessor", ("streamer.vision.preprocess",))
"""Preprocessors (:class:`streamer.vision.preprocess.Preprocessor`), e.g. ``letterbox``."""

POSTPROCESSORS: Registry[Postprocessor] = Registry(
    "postprocessor", ("streamer.vision.postprocess",)
)
"""Postprocessors (:class:`streamer.vision.postprocess.Postprocessor`), e.g. ``blazeface``."""

"""Where a postprocessor's NMS runs: ``nms = "host"`` (numpy, in the dequeue thread) or
``nms = "operator"`` (single operators on the pipeline's backend: onnxruntime single-node
graphs, or ``acl.op`` on the ACL backends; :mod:`streamer.runtime.ops`)."""

from __future__ import annotations

from typing import Literal

from streamer.errors import ConfigError
from streamer.runtime.ops.base import Operators

__all__ = ["NmsPlace", "operators_for"]

NmsPlace = Literal["host", "operator"]
"""The ``nms`` key of the postprocess tables that do NMS."""


def operators_for(place: NmsPlace, operators: Operators | None) -> Operators | None:
    """The operators to run NMS with: None for ``host``, the backend's for ``operator``,
    checked to run there (:meth:`Operators.verify`).

    Raises:
        ConfigError: ``operator`` where no backend gives operators (a plug-in built outside a
            pipeline, e.g. by ``streamer bench``'s in-process components).
        BackendError: the backend cannot run the operators.
    """
    if place == "host":
        return None
    if operators is None:
        raise ConfigError(
            'nms: "operator" runs NMS on the pipeline\'s backend, and there is none here; '
            'use nms = "host"'
        )
    operators.verify()
    return operators

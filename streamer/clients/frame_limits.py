"""The largest frame a producer sends: a daemon ingress's size limits, checked before a frame
leaves, since the daemon refuses a frame over them (``too_large``) or, over
``max_message_bytes``, drops the sender's connection with the frames queued on it."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from streamer.config import IngressConfig
from streamer.errors import FrameError, Reason
from streamer.vision.decode import DecodeLimits, check_payload

__all__ = ["DEFAULT_FRAME_LIMITS", "FrameLimits"]

_NONE = 2**62
"""A limit no frame reaches."""


def _ingress_default(setting: str) -> int:
    """The default of the ``[[ingress]]`` setting ``setting``, as the daemon reads it."""
    default = IngressConfig.model_fields[setting].default
    assert isinstance(default, int), setting
    return default


@dataclass(frozen=True)
class FrameLimits:
    """The size limits of the daemon's ingress, the ``[[ingress]]`` settings of the same names;
    by default that ingress's defaults.

    Attributes:
        max_width_px: pixels.
        max_height_px: pixels.
        max_pixels: width × height.
        max_message_bytes: the largest message part (bytes; ZeroMQ's ``MAXMSGSIZE``).
    """

    max_width_px: int = _ingress_default("max_width_px")
    max_height_px: int = _ingress_default("max_height_px")
    max_pixels: int = _ingress_default("max_pixels")
    max_message_bytes: int = _ingress_default("max_message_bytes")

    @classmethod
    def unlimited(cls) -> FrameLimits:
        """No size limits: only the daemon's other rules (a raw frame's fields) are checked."""
        return cls(_NONE, _NONE, _NONE, _NONE)

    def check(
        self, encoding: str, parts: Sequence[bytes | memoryview], fields: Mapping[str, Any]
    ) -> None:
        """Refuse a frame message over the limits, or a raw one whose fields the daemon
        refuses, reading only headers (:func:`~streamer.vision.decode.check_payload`).

        Args:
            encoding: the frame's encoding.
            parts: the message: its header and payload.
            fields: the header's encoding fields (a raw frame's ``shape``, ``dtype``, ``color``).

        Raises:
            FrameError: ``too_large`` (a part over ``max_message_bytes``, checked first as
                ZeroMQ does, or an image over the pixel limits), or the other reasons of
                :func:`~streamer.vision.decode.check_payload`.
        """
        largest = max(memoryview(part).nbytes for part in parts)
        if largest > self.max_message_bytes:
            raise FrameError(
                Reason.TOO_LARGE,
                f"a part of its message is {largest} bytes, over max_message_bytes "
                f"{self.max_message_bytes} (ZeroMQ drops the connection of a sender over it)",
            )
        limits = DecodeLimits(self.max_width_px, self.max_height_px, self.max_pixels)
        check_payload(encoding, parts[1], fields, limits)


DEFAULT_FRAME_LIMITS = FrameLimits()
"""The daemon's default ingress limits."""

"""The names of the modes in the report (its ``runs`` keys), in the order they run."""

from __future__ import annotations

__all__ = [
    "DAEMON",
    "DEVICE_SIDE",
    "HALF_RATE",
    "MANY_SOURCES",
    "MANY_SOURCES_FRAMES_FACTOR",
    "MANY_SOURCES_MODE",
    "NAIVE",
    "PROFILED",
    "SERIAL",
    "daemon_mode",
]

SERIAL = "serial"
NAIVE = "naive"
DAEMON = "daemon"
"""The daemon at full load with the primary ``max_size`` (the first one given)."""
HALF_RATE = "daemon_half_rate"
"""The primary daemon paced at 50 % of its full-load rate."""
MANY_SOURCES = 16
MANY_SOURCES_MODE = f"daemon_{MANY_SOURCES}_sources"
"""The primary daemon at full load, the frames spread over 16 sources."""
MANY_SOURCES_FRAMES_FACTOR = 5
"""The 16-source run sends this many times the frames of the others. Its 16 connections
buffer about 2,100 frames (each source's send HWM and the ingress's receive HWM) before the
first result comes back; at 5 x 1,000 frames the producer still sends for about half of the
results, so the run has a steady rate to compare with one source's."""
DEVICE_SIDE = "daemon_device_side"
"""The primary daemon's config with its pre- and post-processing moved off the host (the
letterbox normalisation into the model or AIPP, NMS to single operators), at full load."""
PROFILED = "daemon_profiled"
"""The primary daemon at full load under py-spy (``--profile``)."""


def daemon_mode(max_size: int, primary: int) -> str:
    """A full-load daemon run: ``daemon`` for the primary ``max_size``,
    ``daemon_max_size_<n>`` for the others."""
    return DAEMON if max_size == primary else f"daemon_max_size_{max_size}"

"""Client libraries for the native wire protocol (DESIGN.md §5).

A producer sends frames from a video, an image folder, an image or a camera to a daemon's
PULL ingress; a subscriber reads results from its PUB egress, summarises them and draws them
onto the video they came from. ``tools/produce.py`` and ``tools/subscribe.py`` are their CLIs.
"""

from streamer.clients.frame_limits import DEFAULT_FRAME_LIMITS, FrameLimits
from streamer.clients.media import IMAGE_SUFFIXES, MediaInput, open_input
from streamer.clients.pacer import Pacer
from streamer.clients.producer import (
    DEFAULT_CLOSE_TIMEOUT_S,
    DEFAULT_PRODUCER_ENDPOINT,
    ClientError,
    Producer,
    ProducerStats,
    SendTimeoutError,
    produce,
)
from streamer.clients.subscriber import (
    DEFAULT_SUBSCRIBER_ENDPOINT,
    Annotator,
    Subscriber,
    draw_result,
    result_line,
)
from streamer.clients.summary import LATENCY_SAMPLE_SIZE, Summary
from streamer.transport.security import CurveClient

__all__ = [
    "DEFAULT_CLOSE_TIMEOUT_S",
    "DEFAULT_FRAME_LIMITS",
    "DEFAULT_PRODUCER_ENDPOINT",
    "DEFAULT_SUBSCRIBER_ENDPOINT",
    "IMAGE_SUFFIXES",
    "LATENCY_SAMPLE_SIZE",
    "Annotator",
    "ClientError",
    "CurveClient",
    "FrameLimits",
    "MediaInput",
    "Pacer",
    "Producer",
    "ProducerStats",
    "SendTimeoutError",
    "Subscriber",
    "Summary",
    "draw_result",
    "open_input",
    "produce",
    "result_line",
]

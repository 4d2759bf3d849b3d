"""The one exception tree of streamer.

::

    StreamerError
    ├── ConfigError            bad or inconsistent configuration (exit code 2 at start-up)
    ├── AssetError             a model or sample file is missing, corrupt or cannot be fetched
    ├── ModelError             a model cannot be loaded or does not fit its configuration
    ├── BackendError           an inference backend failed in a way the daemon cannot recover
    │   │                      from (device lost, runtime missing); stops the daemon, exit 1
    │   └── OutputLostError    a queue-bound model lost one batch's output; its replica
    │                          reloads the model (QueueModel.reload) and serves again
    ├── FrameError             one frame cannot be processed; becomes an error result with a
    │                          stable machine-readable ``reason``, never stops the daemon
    └── ClientError            a producer or subscriber (``streamer.clients``) cannot do its job
        └── SendTimeoutError   no daemon took a producer's message within its send timeout

Foreign exceptions (onnxruntime, OpenCV, ZeroMQ, pyACL return codes) are translated into this
tree at the boundary where they occur, with ``raise ... from exc``. The commands' exit codes
(:data:`EXIT_OK`, :data:`EXIT_FATAL`, :data:`EXIT_USAGE`) are here too, light to import.
"""

from __future__ import annotations

__all__ = [
    "EXIT_FATAL",
    "EXIT_OK",
    "EXIT_USAGE",
    "AssetError",
    "BackendError",
    "ClientError",
    "ConfigError",
    "FrameError",
    "ModelError",
    "OutputLostError",
    "Reason",
    "SendTimeoutError",
    "StreamerError",
]

EXIT_OK = 0
EXIT_FATAL = 1
"""Exit code of a command that failed: a backend, a device, a file not read or written."""
EXIT_USAGE = 2
"""Exit code of a command given a bad config or model (click's own for a bad option)."""


class StreamerError(Exception):
    """Root of every error streamer raises on purpose."""


class ConfigError(StreamerError):
    """The configuration is invalid; the message names the file and the key at fault."""


class AssetError(StreamerError):
    """A model or media asset is missing, fails its checksum, or cannot be fetched."""


class ModelError(StreamerError):
    """A model file cannot be loaded or does not match the configuration that uses it."""


class BackendError(StreamerError):
    """An unrecoverable inference-backend failure: the daemon stops with a non-zero exit."""


class OutputLostError(BackendError):
    """A queue-bound model got no output for its oldest batch within its result timeout
    (ACL queue mode: the execution failed on the device, and later outputs could not be told
    apart from that batch's). The model is unusable until
    :meth:`~streamer.runtime.base.QueueModel.reload`; a caller that does not reload it treats
    this as any :class:`BackendError`."""


class EnqueueInterruptedError(BackendError):
    """A queue-bound model's enqueue was interrupted
    (:meth:`~streamer.runtime.base.QueueModel.interrupt`, or its close) before the model took
    the whole batch: the batch never runs there, and its inputs, device tensors included, are
    still the caller's, to run elsewhere or to release (ACL queue mode: a recovery's reload
    destroys the queues holding any part of it)."""


class Reason:
    """Stable ``error.reason`` values of failed results and ``dropped`` counters.

    These strings are part of the wire protocol (DESIGN.md §5): never rename one.
    """

    BAD_HEADER = "bad_header"
    DECODE_FAILED = "decode_failed"
    TOO_LARGE = "too_large"
    UNSUPPORTED_DTYPE = "unsupported_dtype"
    PREPROCESS_FAILED = "preprocess_failed"
    INFERENCE_FAILED = "inference_failed"
    POSTPROCESS_FAILED = "postprocess_failed"
    TOO_MANY_SOURCES = "too_many_sources"
    """A frame of a new source while ``daemon.max_sources`` sources are tracked."""
    # Reasons for dropped frames (counted, not published).
    SHUTDOWN = "shutdown"
    EGRESS_BLOCKED = "egress_blocked"
    QUEUE_FULL = "queue_full"
    SUPERSEDED = "superseded"
    STALE_SEQ = "stale_seq"
    RELOAD_GIVEN_UP = "reload_given_up"
    """Held by, or queued for, a reload's old chain given up after ``reload_timeout_s``."""

    FAILURES = (
        BAD_HEADER,
        DECODE_FAILED,
        TOO_LARGE,
        UNSUPPORTED_DTYPE,
        PREPROCESS_FAILED,
        INFERENCE_FAILED,
        POSTPROCESS_FAILED,
        TOO_MANY_SOURCES,
    )
    """The reasons a :class:`FrameError` carries: error results, ``failed`` counters."""
    DROPS = (SHUTDOWN, EGRESS_BLOCKED, QUEUE_FULL, SUPERSEDED, STALE_SEQ, RELOAD_GIVEN_UP)
    """The reasons of frames counted as dropped, never carried by an error result."""


class FrameError(StreamerError):
    """One frame failed; it is published as an error result and the daemon carries on.

    Args:
        reason: a stable machine-readable reason, one of :class:`Reason`'s values.
        detail: a human-readable explanation (free text, may change between versions).
    """

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason
        self.detail = detail


class ClientError(StreamerError):
    """A producer or subscriber cannot do its job: unreadable input, bad endpoint, no daemon."""


class SendTimeoutError(ClientError):
    """No daemon took a producer's message within its send timeout.

    Attributes:
        connected: True when a daemon is connected and pushing back (its queue to it is
            full), False when none is (never was, or the connection was lost).
    """

    def __init__(self, message: str, *, connected: bool) -> None:
        super().__init__(message)
        self.connected = connected

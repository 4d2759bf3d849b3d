"""The frames of one benchmark input, as the producers send them, shared with subprocesses.

A :class:`FrameSet` holds each distinct frame once, already encoded as it travels (a BGR
array for ``raw``, JPEG bytes for ``jpeg``), and serves frame *i* as ``i % len``. It is
written to a file once and read by the producer and receiver processes, so every mode sends
the same bytes and no producer spends CPU on encoding while it is being measured.
"""

from __future__ import annotations

import json
import pickle
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from streamer.transport.protocol import encode_frame

__all__ = ["FrameSet"]

Payload = bytes | np.ndarray


@dataclass(frozen=True)
class FrameSet:
    """Encoded frames of one input.

    Attributes:
        name: the input's name, e.g. ``carphone_raw``.
        encoding: ``raw`` (payloads are BGR uint8 (H, W, 3) arrays) or ``jpeg`` (bytes).
        width, height: frame size, pixels.
        payloads: the distinct frames, at least one.
    """

    name: str
    encoding: str
    width: int
    height: int
    payloads: tuple[Payload, ...]

    def payload(self, index: int) -> Payload:
        """Frame ``index`` (any non-negative int; the frames repeat)."""
        return self.payloads[index % len(self.payloads)]

    def mean_bytes(self) -> float:
        """Average payload size, bytes."""
        return float(np.mean([_nbytes(p) for p in self.payloads]))

    def native_message(
        self, source: str, seq: int, index: int, ts: float
    ) -> list[bytes | memoryview]:
        """The native-protocol ``[header, payload]`` parts of frame ``index`` (no copy)."""
        return encode_frame(source, seq, self.payload(index), encoding=self.encoding, ts=ts)

    def imagezmq_message(self, source: str, index: int) -> list[bytes | memoryview]:
        """The parts imagezmq's ``send_image`` (raw) or ``send_jpg`` (jpeg) would send."""
        payload = self.payload(index)
        if isinstance(payload, np.ndarray):
            header = {"msg": source, "dtype": str(payload.dtype), "shape": list(payload.shape)}
            return [json.dumps(header).encode(), payload.data.cast("B")]
        return [json.dumps({"msg": source}).encode(), payload]

    def decode_args(self, index: int) -> tuple[str, bytes | memoryview, Mapping[str, Any]]:
        """``(encoding, payload, header fields)`` of frame ``index``, as
        :func:`streamer.vision.decode.decode_image` takes them in the daemon."""
        payload = self.payload(index)
        if isinstance(payload, np.ndarray):
            fields = {"shape": list(payload.shape), "dtype": str(payload.dtype), "color": "bgr"}
            return "raw", payload.data.cast("B"), fields
        return self.encoding, payload, {}

    def save(self, path: Path) -> None:
        """Write the frames to ``path`` for :meth:`load` in another process."""
        path.write_bytes(pickle.dumps(self, protocol=pickle.HIGHEST_PROTOCOL))

    @staticmethod
    def load(path: Path) -> FrameSet:
        """Read frames written by :meth:`save` (a file this benchmark wrote itself).

        Raises:
            OSError: the file cannot be read.
            TypeError: the file holds something else.
        """
        frames = pickle.loads(path.read_bytes())
        if not isinstance(frames, FrameSet):
            raise TypeError(f"{path} does not hold a FrameSet")
        return frames


def _nbytes(payload: Payload) -> int:
    return payload.nbytes if isinstance(payload, np.ndarray) else len(payload)

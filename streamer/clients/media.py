"""Where a producer's frames come from: a video file, an image folder, one image or a camera.

Every input yields BGR uint8 images of shape (height, width, 3), read with OpenCV.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Literal

import cv2
import numpy as np

from streamer.background_call import BackgroundCall
from streamer.errors import ClientError

__all__ = ["FRAME_COUNT_SLACK", "IMAGE_SUFFIXES", "MediaInput", "open_input"]

IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png", ".bmp", ".tif", ".tiff", ".webp")
"""Image files an input folder's frames are read from (with ``cv2.imread``), and a single
file taken as an image rather than a video."""

FRAME_COUNT_SLACK = 2
"""Frames a video may end short of the count its container announces
(``CAP_PROP_FRAME_COUNT``) without being taken as truncated or corrupt: real files are
often off by one or two at the end."""
_OPEN_WAIT_SLICE_S = 0.2
"""How long a wait for a video to open goes without looking for a Ctrl-C (s)."""


@dataclass(frozen=True)
class MediaInput:
    """Where a producer's frames come from.

    Attributes:
        kind: ``video`` (a file cv2.VideoCapture reads), ``folder`` (its image files,
            :data:`IMAGE_SUFFIXES`, in name order), ``image`` (one file, a one-frame input)
            or ``camera``.
        path: the file or folder; None for a camera.
        camera: the camera index for cv2.VideoCapture; None otherwise.
    """

    kind: Literal["video", "folder", "image", "camera"]
    path: Path | None = None
    camera: int | None = None

    @property
    def name(self) -> str:
        """The default source id: the file or folder stem, or ``camera<index>``."""
        return self.path.stem if self.path is not None else f"camera{self.camera}"

    def frame_count(self) -> int | None:
        """Frames in one pass over the input; None for a camera or an unknown video length.

        Raises:
            ClientError: the video cannot be opened.
        """
        if self.kind == "folder":
            return len(_image_files(self._path()))
        if self.kind == "image":
            return 1
        if self.kind == "camera":
            return None
        capture = _open_capture(str(self.path))
        count = int(capture.get(cv2.CAP_PROP_FRAME_COUNT))
        capture.release()
        return count if count > 0 else None

    def frames(self) -> Iterator[np.ndarray]:
        """One pass over the input.

        Yields:
            BGR uint8 images of shape (height, width, 3).

        Raises:
            ClientError: the input cannot be opened, an image cannot be read, or a video's
                frames end more than :data:`FRAME_COUNT_SLACK` short of the count its
                container announces (it is truncated or corrupt), once the frames read were
                yielded.
        """
        return (image for image, _ in self.named_frames())

    def named_frames(self) -> Iterator[tuple[np.ndarray, str | None]]:
        """One pass over the input, each image with the name of its file.

        Yields:
            (image, name): the image as :meth:`frames` yields it, and for a folder or a
            single image the file's name (``"0001.jpg"``), for a video or camera None.

        Raises:
            ClientError: as :meth:`frames`.
        """
        if self.kind == "folder":
            return ((_read_image(path), path.name) for path in _image_files(self._path()))
        if self.kind == "image":
            path = self._path()
            return iter([(_read_image(path), path.name)])
        target = self.camera if self.camera is not None else str(self.path)
        return ((image, None) for image in _capture_frames(target))

    def _path(self) -> Path:
        assert self.path is not None, self
        return self.path


def open_input(spec: str | int | os.PathLike[str]) -> MediaInput:
    """Resolve a producer's INPUT.

    An int, or a string of digits that names no file, is a camera index; an existing folder
    is an image folder; an existing file of :data:`IMAGE_SUFFIXES` is a single image; any other
    existing file is a video; anything else is looked up as a fetched media name (e.g.
    ``carphone.mp4``) with :func:`streamer.assets.media_path`, imported only then (0.1 s:
    a client's start is what a subscriber started beside it waits out).

    Raises:
        ClientError: ``spec`` is no existing path and no media name: the file does not exist.
        AssetError: ``spec`` is a media name not fetched yet.
    """
    if isinstance(spec, int):
        return MediaInput("camera", camera=spec)
    text = os.fspath(spec)
    path = Path(text)
    if not path.exists():
        if text.isdigit():
            return MediaInput("camera", camera=int(text))
        path = _fetched_media(text)
    if path.is_dir():
        return MediaInput("folder", path=path)
    if path.suffix.lower() in IMAGE_SUFFIXES:
        return MediaInput("image", path=path)
    return MediaInput("video", path=path)


def _fetched_media(name: str) -> Path:
    """The path of the fetched media asset ``name``.

    Raises:
        ClientError: no media asset has that name: it is a file that does not exist.
        AssetError: that media asset has not been fetched.
    """
    from streamer.assets import media_asset, media_path

    if media_asset(name) is None:
        raise ClientError(f"{name!r} does not exist: no such file or folder, nor media asset")
    return media_path(name)


def _image_files(folder: Path) -> list[Path]:
    """The image files of ``folder`` in name order (a folder named like one is skipped)."""
    return sorted(p for p in folder.iterdir() if p.suffix.lower() in IMAGE_SUFFIXES and p.is_file())


def _read_image(path: Path) -> np.ndarray:
    image = cv2.imread(str(path), cv2.IMREAD_COLOR)
    if image is None:
        raise ClientError(f"cannot read image {path}")
    return image


def _open_capture(target: str | int) -> cv2.VideoCapture:
    """A capture of the video file or camera ``target``, opened on a thread of its own: an
    open that blocks (a file on a hung mount, a FIFO nobody writes, a stream that does not
    answer) leaves the main thread free to take a Ctrl-C or SIGTERM.

    Raises:
        ClientError: OpenCV cannot open it.
        KeyboardInterrupt: Ctrl-C or SIGTERM (``sigterm_as_ctrl_c``) while it opens.
    """
    opening = BackgroundCall(partial(cv2.VideoCapture, target), "video-open")
    while not opening.wait(_OPEN_WAIT_SLICE_S):
        pass
    capture = opening.result()
    if not capture.isOpened():
        capture.release()
        raise ClientError(f"cannot open video or camera {target!r}")
    return capture


def _capture_frames(target: str | int) -> Iterator[np.ndarray]:
    """The frames of the video file or camera ``target``, read with one capture.

    Raises:
        ClientError: as :func:`_open_capture`, or as :func:`_check_complete` once the
            frames end.
    """
    capture = _open_capture(target)
    try:
        announced, read = int(capture.get(cv2.CAP_PROP_FRAME_COUNT)), 0
        while True:
            ok, frame = capture.read()
            if not ok:
                break
            read += 1
            yield frame
        _check_complete(target, read, announced)
    finally:
        capture.release()


def _check_complete(target: str | int, read: int, announced: int) -> None:
    """Refuse a pass over ``target`` that ended short of the frames its container announced
    (none announced: 0 or -1, e.g. a camera), by more than :data:`FRAME_COUNT_SLACK`.

    Raises:
        ClientError: ``read`` < ``announced`` - :data:`FRAME_COUNT_SLACK`.
    """
    if read < announced - FRAME_COUNT_SLACK:
        raise ClientError(
            f"{target}: read {read} of the {announced} frames its container announces: "
            "the video is truncated or corrupt"
        )

"""letterbox: geometry, round trips, and the tensor against a plain reference."""

from __future__ import annotations

import cv2
import numpy as np
import pytest

from streamer.config import PluginConfig
from streamer.runtime.base import ModelInfo, TensorInfo
from streamer.vision.preprocess import LetterboxTransform, Preprocessor
from streamer.vision.registry import PREPROCESSORS


def _letterbox(
    shape: tuple[int, ...] = (-1, 3, 128, 128), dtype: type = np.float32, **params: object
) -> Preprocessor:
    info = ModelInfo("m", (TensorInfo("input", shape, np.dtype(dtype)),), ())
    return PREPROCESSORS.create(PluginConfig(kind="letterbox", **params), info, "test")


def _reference(image: np.ndarray, size: int = 128) -> np.ndarray:
    """The obvious implementation: resize, pad with black, RGB, (x / 127.5 - 1), CHW."""
    h, w = image.shape[:2]
    scale = min(size / w, size / h)
    nw, nh = round(w * scale), round(h * scale)
    interpolation = cv2.INTER_AREA if scale < 1 else cv2.INTER_LINEAR
    resized = cv2.resize(image, (nw, nh), interpolation=interpolation)
    top, left = (size - nh) // 2, (size - nw) // 2
    padded = cv2.copyMakeBorder(
        resized, top, size - nh - top, left, size - nw - left, cv2.BORDER_CONSTANT, value=0
    )
    rgb = padded[:, :, ::-1].astype(np.float64)
    return (rgb / 127.5 - 1.0).transpose(2, 0, 1)


# ---- LetterboxTransform ------------------------------------------------------------------


def test_fit_carphone_into_128() -> None:
    t = LetterboxTransform.fit(176, 144, 128, 128)
    assert t.scale == pytest.approx(128 / 176)
    assert (t.resized_width, t.resized_height) == (128, 105)
    assert (t.pad_x, t.pad_y) == (0, 11)


def test_fit_tall_image_pads_left_and_right() -> None:
    t = LetterboxTransform.fit(300, 600, 192, 192)
    assert (t.resized_width, t.resized_height) == (96, 192)
    assert (t.pad_x, t.pad_y) == (48, 0)


def test_fit_never_gives_an_empty_side() -> None:
    t = LetterboxTransform.fit(4000, 1, 128, 128)
    assert (t.resized_width, t.resized_height) == (128, 1)


@pytest.mark.parametrize(("w", "h"), [(176, 144), (1280, 720), (300, 451), (50, 20), (128, 128)])
def test_round_trip(w: int, h: int) -> None:
    t = LetterboxTransform.fit(w, h, 128, 128)
    points = np.random.default_rng(0).uniform(0, 1, (50, 2)) * (w, h)
    assert np.allclose(t.to_image(t.to_input(points)), points)
    # The image corners land on the corners of the resized region.
    corners = t.to_input(np.array([[0, 0], [w, h]]))
    right, bottom = t.pad_x + t.resized_width, t.pad_y + t.resized_height
    assert np.allclose(corners, [[t.pad_x, t.pad_y], [right, bottom]])


def test_normalized_coordinates() -> None:
    t = LetterboxTransform.fit(176, 144, 128, 128)
    centre = t.normalized_to_image(np.array([0.5, 0.5]))
    assert np.allclose(centre, (88, 72), atol=0.7)  # the pad is split 11 / 12
    assert np.allclose(t.normalized_to_image(np.array([[0, 11 / 128]])), [[0, 0]])


# ---- Letterbox preprocessor ------------------------------------------------------------


@pytest.mark.parametrize("name", ["astronaut", "chelsea", "coffee"])
def test_matches_the_reference(request: pytest.FixtureRequest, name: str) -> None:
    image = request.getfixturevalue(name)
    tensor, t = _letterbox()(image)
    assert tensor.shape == (3, 128, 128)
    assert tensor.dtype == np.float32
    assert tensor.flags.c_contiguous
    assert np.abs(tensor - _reference(image)).max() < 1e-6
    assert (t.image_width, t.image_height) == (image.shape[1], image.shape[0])


def test_matches_the_reference_on_video_frames(carphone_frames: list[np.ndarray]) -> None:
    pre = _letterbox()
    for frame in carphone_frames[::30]:
        tensor, t = pre(frame)
        assert np.abs(tensor - _reference(frame)).max() < 1e-6
        assert (tensor[:, : t.pad_y] == -1).all()


def test_enlarges_with_linear_interpolation() -> None:
    image = np.random.default_rng(0).integers(0, 256, (20, 50, 3), dtype=np.uint8)
    tensor, t = _letterbox()(image)
    assert t.scale > 1
    assert np.abs(tensor - _reference(image)).max() < 1e-6


def test_same_size_image_is_not_resized(astronaut: np.ndarray) -> None:
    image = cv2.resize(astronaut, (128, 128), interpolation=cv2.INTER_AREA)
    tensor, t = _letterbox()(image)
    assert (t.scale, t.pad_x, t.pad_y) == (1.0, 0, 0)
    assert np.allclose(tensor, image[:, :, ::-1].transpose(2, 0, 1) / 127.5 - 1)


def test_channel_order_and_borders() -> None:
    blue = np.zeros((64, 128, 3), np.uint8)
    blue[:, :, 0] = 255  # BGR
    rgb, _ = _letterbox()(blue)
    assert (rgb[2, 32:96] == 1).all() and (rgb[:2, 32:96] == -1).all()
    bgr, _ = _letterbox(color="bgr")(blue)
    assert (bgr[0, 32:96] == 1).all() and (bgr[1:, 32:96] == -1).all()
    assert (rgb[:, :32] == -1).all() and (rgb[:, 96:] == -1).all()  # pad_value 0


def test_mean_std_and_pad_value_per_channel() -> None:
    image = np.full((64, 128, 3), (0, 128, 255), np.uint8)  # B, G, R
    pre = _letterbox(mean=[0.485, 0.456, 0.406], std=[0.229, 0.224, 0.225], pad_value=255)
    tensor, _ = pre(image)
    rgb = np.array([255, 128, 0]) / 255.0
    expected = (rgb - [0.485, 0.456, 0.406]) / [0.229, 0.224, 0.225]
    assert np.allclose(tensor[:, 64, 64], expected, atol=1e-6)
    border = (1.0 - np.array([0.485, 0.456, 0.406])) / [0.229, 0.224, 0.225]
    assert np.allclose(tensor[:, 0, 0], border, atol=1e-6)


def test_nhwc_layout(astronaut: np.ndarray) -> None:
    pre = _letterbox((1, 128, 128, 3), layout="NHWC")
    tensor, _ = pre(astronaut)
    assert tensor.shape == (128, 128, 3)
    assert tensor.flags.c_contiguous
    assert np.abs(tensor - _reference(astronaut).transpose(1, 2, 0)).max() < 1e-6


def test_float16_input(astronaut: np.ndarray) -> None:
    tensor, _ = _letterbox(dtype=np.float16)(astronaut)
    assert tensor.dtype == np.float16
    assert np.abs(tensor - _reference(astronaut)).max() < 1e-3


def test_outputs_are_independent(astronaut: np.ndarray, coffee: np.ndarray) -> None:
    pre = _letterbox()
    first, _ = pre(astronaut)
    kept = first.copy()
    pre(coffee)
    assert np.array_equal(first, kept)

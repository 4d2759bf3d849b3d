"""letterbox: geometry, round trips, and the tensor against a plain reference."""

from __future__ import annotations

import cv2
import numpy as np
import pytest

from streamer.config import PluginConfig
from streamer.errors import ConfigError
from streamer.runtime.base import ModelInfo, TensorInfo
from streamer.vision.preprocess import Letterbox, LetterboxTransform, Preprocessor
from streamer.vision.registry import PREPROCESSORS


def _letterbox(
    shape: tuple[int, ...] = (-1, 3, 128, 128),
    dtype: type = np.float32,
    hw_gears: tuple[tuple[int, int], ...] = (),
    dims_gears: tuple[tuple[int, ...], ...] = (),
    **params: object,
) -> Preprocessor:
    tensor = TensorInfo("input", shape, np.dtype(dtype))
    info = ModelInfo("m", (tensor,), (), hw_gears=hw_gears, dims_gears=dims_gears)
    return PREPROCESSORS.create(PluginConfig(kind="letterbox", **params), info, "test")


def _reference(image: np.ndarray, size: int = 128) -> np.ndarray:
    """The obvious implementation: resize, pad with black, RGB, (x / 127.5 - 1), CHW."""
    return _reference_at(image, size, size)


def _reference_at(image: np.ndarray, height: int, width: int) -> np.ndarray:
    """:func:`_reference` into a ``height`` x ``width`` input."""
    h, w = image.shape[:2]
    scale = min(width / w, height / h)
    nw, nh = round(w * scale), round(h * scale)
    interpolation = cv2.INTER_AREA if scale < 0.5 else cv2.INTER_LINEAR  # AREA_BELOW_SCALE
    resized = cv2.resize(image, (nw, nh), interpolation=interpolation)
    top, left = (height - nh) // 2, (width - nw) // 2
    padded = cv2.copyMakeBorder(
        resized, top, height - nh - top, left, width - nw - left, cv2.BORDER_CONSTANT, value=0
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


@pytest.mark.parametrize(("w", "h", "factor"), [(513, 932, 2), (3001, 2047, 4), (1280, 720, 2)])
def test_enlarged_maps_a_reduced_pixel_to_factor_full_pixels(w: int, h: int, factor: int) -> None:
    """libjpeg's reduced pixel i covers full pixels [k * i, k * i + k): the enlarged map is
    the reduced image's times k, also where the full size is not a multiple of k."""
    reduced = LetterboxTransform.fit(-(-w // factor), -(-h // factor), 128, 128)
    enlarged = reduced.enlarged(factor, w, h)
    points = np.random.default_rng(0).uniform(0, 128, (50, 2))
    assert np.allclose(enlarged.to_image(points), reduced.to_image(points) * factor)
    assert (enlarged.image_width, enlarged.image_height) == (w, h)


@pytest.mark.parametrize(("w", "h", "factor"), [(513, 932, 2), (932, 513, 2), (3001, 2047, 4)])
def test_reduced_is_placed_as_the_full_image(w: int, h: int, factor: int) -> None:
    """A reduced decode is letterboxed into the full decode's size and place (513 x 932
    rounds to 71 columns at 257 x 466, 70 at the full size), mapped to full-image pixels."""
    letterbox = _letterbox()
    assert isinstance(letterbox, Letterbox)
    image = np.random.default_rng(1).integers(0, 256, (-(-h // factor), -(-w // factor), 3))
    tensor, t = letterbox.reduced(image.astype(np.uint8), factor, w, h)
    full = LetterboxTransform.fit(w, h, 128, 128)
    assert (t.resized_width, t.resized_height, t.pad_x, t.pad_y) == (
        full.resized_width,
        full.resized_height,
        full.pad_x,
        full.pad_y,
    )
    pad = _reference(np.zeros((1, 1, 3), np.uint8))[:, 0, 0]
    inside = np.zeros((128, 128), bool)
    inside[t.pad_y : t.pad_y + t.resized_height, t.pad_x : t.pad_x + t.resized_width] = True
    assert np.allclose(tensor[:, ~inside], pad[:, None]) and not np.allclose(tensor[:, inside], -1)
    right, bottom = t.pad_x + t.resized_width, t.pad_y + t.resized_height
    reduced_h, reduced_w = image.shape[:2]
    corners = t.to_image(np.array([[t.pad_x, t.pad_y], [right, bottom]]))
    assert np.allclose(corners, [[0, 0], [reduced_w * factor, reduced_h * factor]])


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


# ---- Resolution gears ------------------------------------------------------------------

GEARS = ((48, 64), (64, 48), (64, 64), (128, 128))
"""(height, width): 4:3 landscape, 3:4 portrait, and two squares."""


def _geared(size: list[int] | None = None) -> Letterbox:
    pre = _letterbox((1, 3, -1, -1), hw_gears=GEARS, size=size)
    assert isinstance(pre, Letterbox)
    return pre


def test_gear_with_the_closest_aspect_ratio() -> None:
    pre = _geared()
    assert pre.sizes == GEARS
    assert pre.choose_size(640, 480) == (48, 64)  # (width, height) in, (height, width) out
    assert pre.choose_size(176, 144) == (48, 64)  # 1.22: nearer 4:3 (x1.09) than 1:1 (x1.22)
    assert pre.choose_size(480, 640) == (64, 48)
    assert pre.choose_size(1000, 10) == (48, 64)


def test_ties_go_to_the_larger_gear_then_the_earlier_one() -> None:
    assert _geared().choose_size(300, 300) == (128, 128), "two squares: the larger"
    pre = _letterbox((1, 3, -1, -1), hw_gears=((32, 64), (64, 32)))
    assert isinstance(pre, Letterbox)
    assert pre.choose_size(50, 50) == (32, 64), "2:1 and 1:2 are as far from 1:1: the first"


def test_closeness_is_the_ratio_of_aspect_ratios() -> None:
    """3:1 is 1.5x from 2:1 and 1.33x from 4:1 (both 1 apart as plain differences)."""
    pre = _letterbox((1, 3, -1, -1), hw_gears=((32, 64), (16, 64)))
    assert isinstance(pre, Letterbox)
    assert pre.choose_size(300, 100) == (16, 64)


@pytest.mark.parametrize("name", ["astronaut", "chelsea", "coffee"])
def test_tensor_has_the_gear_shape_and_the_reference_content(
    request: pytest.FixtureRequest, name: str
) -> None:
    pre = _geared()
    for image in (
        request.getfixturevalue(name),
        cv2.rotate(request.getfixturevalue(name), cv2.ROTATE_90_CLOCKWISE),
    ):
        h, w = image.shape[:2]
        height, width = pre.choose_size(w, h)
        tensor, t = pre(image)
        assert tensor.shape == (3, height, width) and tensor.flags.c_contiguous
        assert (t.input_height, t.input_width) == (height, width)
        assert np.abs(tensor - _reference_at(image, height, width)).max() < 1e-6


def test_landscape_and_portrait_frames_get_different_gears(
    chelsea: np.ndarray, carphone_frames: list[np.ndarray]
) -> None:
    pre = _letterbox((1, 3, -1, -1), hw_gears=((48, 64), (64, 48)))
    wide = [pre(image)[0].shape for image in (chelsea, carphone_frames[0])]
    tall = [
        pre(cv2.rotate(image, cv2.ROTATE_90_CLOCKWISE))[0].shape
        for image in (chelsea, carphone_frames[0])
    ]
    assert set(wide) == {(3, 48, 64)} and set(tall) == {(3, 64, 48)}


def test_nhwc_resolution_gears(chelsea: np.ndarray) -> None:
    pre = _letterbox((1, -1, -1, 3), hw_gears=((48, 64), (64, 48)), layout="NHWC")
    tensor, _ = pre(chelsea)
    assert tensor.shape == (48, 64, 3)
    assert np.abs(tensor - _reference_at(chelsea, 48, 64).transpose(1, 2, 0)).max() < 1e-6


def test_size_pins_one_gear(chelsea: np.ndarray) -> None:
    pre = _geared(size=[64, 48])
    assert pre.sizes == ((64, 48),)
    assert pre(chelsea)[0].shape == (3, 64, 48)
    with pytest.raises(ConfigError, match=r"size: \[100, 100\] is not one of the model's"):
        _geared(size=[100, 100])


def test_dims_gears_give_the_resolutions() -> None:
    """``--dynamic_dims`` gears set every dim of the input: their (H, W) are the candidates."""
    gears = ((1, 3, 48, 64), (4, 3, 48, 64), (2, 3, 64, 48))
    pre = _letterbox((-1, 3, -1, -1), dims_gears=gears)
    assert isinstance(pre, Letterbox)
    assert pre.sizes == ((48, 64), (64, 48))
    nhwc = _letterbox((-1, -1, -1, 3), dims_gears=((1, 48, 64, 3),), layout="NHWC")
    assert isinstance(nhwc, Letterbox) and nhwc.sizes == ((48, 64),)


def test_gears_with_the_wrong_layout_are_refused() -> None:
    with pytest.raises(ConfigError, match="one dynamic dim at H/W"):
        _letterbox((1, -1, -1, 3), hw_gears=((48, 64),))  # NHWC read as NCHW
    with pytest.raises(ConfigError, match="dynamic height/width; set size"):
        _letterbox((1, 3, -1, -1))  # no gears: size is still required

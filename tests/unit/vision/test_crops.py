"""crops: region geometry, zero padding at the border, transforms, and the adapter's config."""

from __future__ import annotations

import tracemalloc
from typing import Any

import cv2
import numpy as np
import pytest
from pydantic import ValidationError

from streamer.errors import ConfigError, FrameError, Reason
from streamer.runtime.base import ModelInfo, TensorInfo
from streamer.vision.crops import (
    CropParams,
    Crops,
    CropTransform,
    crop,
    crop_regions,
    detection_boxes,
)


def _ramp(h: int = 60, w: int = 80) -> np.ndarray:
    """uint8 (h, w, 3): channel 0 = x, channel 1 = y, channel 2 = 200 (never 0)."""
    ys, xs = np.mgrid[0:h, 0:w]
    return np.stack([xs, ys, np.full_like(xs, 200)], axis=2).astype(np.uint8)


def _reference(
    image: np.ndarray, region: tuple[int, int, int, int], size: int, pad: int = 100
) -> np.ndarray:
    """The obvious implementation: pad the whole image with zeros, slice, resize."""
    x1, y1, x2, y2 = region
    padded = cv2.copyMakeBorder(image, pad, pad, pad, pad, cv2.BORDER_CONSTANT, value=0)
    cut = padded[y1 + pad : y2 + pad, x1 + pad : x2 + pad]
    shrink = cut.shape[0] >= size and cut.shape[1] >= size
    interpolation = cv2.INTER_AREA if shrink else cv2.INTER_LINEAR
    return cv2.resize(cut, (size, size), interpolation=interpolation)


# ---- regions -----------------------------------------------------------------------------


def test_region_of_a_whole_pixel_box_is_the_box() -> None:
    assert crop_regions(np.array([[10, 20, 30, 40]])).tolist() == [[10, 20, 40, 60]]


def test_margin_grows_each_side_by_a_fraction_of_the_box() -> None:
    regions = crop_regions(np.array([[10, 20, 30, 40]]), margin=0.1)
    assert regions.tolist() == [[7, 16, 43, 64]]


def test_square_grows_the_shorter_side_around_the_centre() -> None:
    assert crop_regions(np.array([[10, 20, 30, 40]]), square=True).tolist() == [[5, 20, 45, 60]]
    # Margin and square commute: the square of the grown box.
    both = crop_regions(np.array([[10, 20, 30, 40]]), margin=0.25, square=True)
    assert both.tolist() == [[-5, 10, 55, 70]]


def test_regions_round_to_whole_pixels_and_keep_at_least_one() -> None:
    regions = crop_regions(np.array([[1.4, 1.6, 2.2, 0.0], [5.0, 5.0, 0.2, 0.2]]))
    assert regions.tolist() == [[1, 2, 3, 3], [5, 5, 6, 6]]
    assert regions.dtype == np.int64


# ---- crops -------------------------------------------------------------------------------


def test_a_crop_of_its_own_size_is_the_pixels_of_the_box() -> None:
    image = _ramp()
    crops, (t,) = crop(image, np.array([[10, 20, 30, 16]]), (16, 30))
    assert np.array_equal(crops[0], image[20:36, 10:40])
    assert (t.x1, t.y1, t.x2, t.y2) == (10, 20, 40, 36)
    assert (t.input_width, t.input_height, t.image_width, t.image_height) == (30, 16, 80, 60)


def test_border_is_padded_with_zeros_and_keeps_the_geometry() -> None:
    image = _ramp()
    crops, (t,) = crop(image, np.array([[-5, 50, 20, 20]]), (20, 20))
    out = crops[0]
    assert (t.x1, t.y1, t.x2, t.y2) == (-5, 50, 15, 70)
    assert not out[:, :5].any() and not out[10:].any()  # left of x=0, below y=60
    assert np.array_equal(out[:10, 5:], image[50:60, 0:15])


def test_a_region_wholly_outside_the_image_is_black() -> None:
    crops, _ = crop(_ramp(), np.array([[100, 100, 10, 10]]), (8, 8))
    assert crops.shape == (1, 8, 8, 3) and not crops.any()


@pytest.mark.parametrize("size", [12, 24, 48, 97])
def test_crops_match_the_plain_reference(size: int) -> None:
    image = _ramp()
    rng = np.random.default_rng(size)
    boxes = np.concatenate([rng.uniform(-20, 70, (20, 2)), rng.uniform(1, 60, (20, 2))], axis=1)
    crops, transforms = crop(image, boxes, (size, size), margin=0.1, square=True)
    assert crops.shape == (20, size, size, 3) and crops.dtype == np.uint8
    for out, t in zip(crops, transforms, strict=True):
        assert t.x2 - t.x1 == t.y2 - t.y1  # square
        assert np.array_equal(out, _reference(image, (t.x1, t.y1, t.x2, t.y2), size))


def test_gray_images_and_no_boxes() -> None:
    gray = _ramp()[:, :, 0]
    crops, _ = crop(gray, np.array([[0, 0, 40, 40]]), (20, 20))
    assert crops.shape == (1, 20, 20)
    empty, transforms = crop(_ramp(), np.zeros((0, 4)), (24, 24))
    assert empty.shape == (0, 24, 24, 3) and transforms == []


def test_the_crop_of_a_real_face_is_its_centre(astronaut: np.ndarray) -> None:
    face = np.array([[177, 81, 95, 95]])
    crops, (t,) = crop(astronaut, face, (48, 48))
    assert np.allclose(t.to_image(np.array([24.0, 24.0])), [224.5, 128.5], atol=0.5)
    direct = cv2.resize(astronaut[81:176, 177:272], (48, 48), interpolation=cv2.INTER_AREA)
    assert np.array_equal(crops[0], direct)


# ---- transforms --------------------------------------------------------------------------


def test_transform_maps_crop_corners_to_region_corners() -> None:
    t = CropTransform(-10, 20, 30, 100, 24, 48, 64, 64)
    corners = t.to_image(np.array([[0.0, 0.0], [24.0, 48.0]]))
    assert np.array_equal(corners, [[-10, 20], [30, 100]])
    assert np.array_equal(t.normalized_to_image(np.array([0.5, 0.25])), [10, 40])
    assert np.array_equal(t.region, [-10, 20, 30, 100])


def test_transform_round_trip() -> None:
    t = CropTransform(3, 7, 50, 31, 48, 48, 64, 64)
    xy = np.random.default_rng(0).uniform(-10, 70, (100, 2))
    assert np.allclose(t.to_image(t.to_input(xy)), xy)


# ---- the adapter -------------------------------------------------------------------------


def _info(shape: tuple[int, ...]) -> ModelInfo:
    return ModelInfo("m", (TensorInfo("input", shape, np.dtype(np.float32)),), ())


def test_adapter_takes_the_size_from_the_model() -> None:
    assert Crops(CropParams(), _info((-1, 3, 112, 96))).size == (112, 96)  # NCHW
    assert Crops(CropParams(), _info((-1, 48, 48, 3))).size == (48, 48)  # NHWC
    assert Crops(CropParams(size=(64, 32)), _info((-1, 3, -1, -1))).size == (64, 32)


def test_adapter_crops_detections() -> None:
    crops = Crops(CropParams(margin=0.5, square=True), _info((-1, 24, 24, 3)))
    detections: list[dict[str, Any]] = [
        {"box": [10, 10, 20, 10], "score": 0.9},
        {"box": [0, 0, 4, 4]},
    ]
    out, transforms = crops(_ramp(), detections)
    assert out.shape == (2, 24, 24, 3)
    assert [(t.x1, t.y1, t.x2, t.y2) for t in transforms] == [(0, -5, 40, 35), (-2, -2, 6, 6)]


@pytest.mark.parametrize(
    ("shape", "size"),
    [((-1, 3, -1, -1), None), ((-1, 3, 24, 24), (24, 32)), ((-1, 24, 24), None)],
)
def test_adapter_config_errors(shape: tuple[int, ...], size: tuple[int, int] | None) -> None:
    with pytest.raises(ConfigError):
        Crops(CropParams(size=size), _info(shape))


def test_params_reject_unknown_keys_and_negative_margins() -> None:
    with pytest.raises(ValidationError):
        CropParams.model_validate({"margin": 0.1, "pad": 0})
    with pytest.raises(ValidationError):
        CropParams(margin=-0.1)


@pytest.mark.parametrize(
    "detections",
    [[{"box": [1, 2, 3]}], [{"box": [1, 2, 3, float("nan")]}], [{"score": 1.0}], [None]],
)
def test_bad_boxes_fail_the_frame(detections: list[object]) -> None:
    with pytest.raises(FrameError) as err:
        detection_boxes(detections)  # type: ignore[arg-type]
    assert err.value.reason == Reason.PREPROCESS_FAILED


@pytest.mark.parametrize("shape", [(1, 8192, 3), (8192, 1, 3), (3, 2000, 3), (40, 8000)])
def test_a_strip_is_cut_without_its_padded_square(shape: tuple[int, ...]) -> None:
    """The whole-frame square of a strip (``mtcnn_classify``, or a detection as wide as the
    frame) was cut whole: a 1 x 8192 frame, 24 KiB, cost a zero-padded 8192 x 8192 cut
    (200 MB) and its resize, a tenth of a second each, beyond every ingress limit. Its
    in-image part is now resized into place: the same crop within a grey level or so."""
    image = np.random.default_rng(0).integers(0, 256, shape, dtype=np.uint8)
    h, w = shape[:2]
    tracemalloc.start()
    try:
        crops, (t,) = crop(image, np.array([[0, 0, w, h]]), (24, 24), square=True)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 4 * image.nbytes + (1 << 20)
    assert (t.x2 - t.x1, t.y2 - t.y1) == (max(h, w), max(h, w))
    reference = _reference(image, (t.x1, t.y1, t.x2, t.y2), 24, pad=max(h, w))
    difference = np.abs(crops[0].astype(int) - reference.reshape(crops[0].shape).astype(int))
    assert difference.max() <= 2 and difference.mean() < 0.1


def test_a_sliver_of_a_large_region_stays_a_faint_line() -> None:
    """A 3-row strip in its 500 x 500 square averages to a faint line, not to nothing."""
    image = np.full((3, 500, 3), 255, np.uint8)
    crops, (t,) = crop(image, np.array([[0, 0, 500, 3]]), (24, 24), square=True)
    reference = _reference(image, (t.x1, t.y1, t.x2, t.y2), 24, pad=500)
    assert crops[0].any() and np.abs(crops[0].astype(int) - reference.astype(int)).max() <= 2

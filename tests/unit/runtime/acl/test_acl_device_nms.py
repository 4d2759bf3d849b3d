"""BlazeFace's NMS as single operators on the model's outputs where ACL left them
(``nms = "operator"``): top-k over the logits and GatherV2 over the regressors read the
outputs in device memory, in each execution mode and run mode, and only their results come to
the host. The simulator's call log shows the operators reading the outputs in place and the
host never reading a byte of them; the detections are the host NMS's on onnxruntime; every
output is released exactly once, also when an operator fails."""

from __future__ import annotations

import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from acl_testing import GEARS, MakeBackend, MakeModel, Reference, calls, rules
from structlog.testing import capture_logs

from streamer.config import Config, PluginConfig
from streamer.errors import BackendError, ConfigError, FrameError
from streamer.frames import Frame
from streamer.model_stages import load_chain
from streamer.runtime.acl.constants import MemcpyKind
from streamer.runtime.acl.device_tensor import AclDeviceTensor
from streamer.runtime.acl.sim.simulator import Simulator
from streamer.runtime.base import ModelSpec, QueueModel, Tensor, release_inputs
from streamer.runtime.ops import OnnxOperators
from streamer.vision.postprocess import Postprocessor
from streamer.vision.preprocess import Preprocessor
from streamer.vision.registry import POSTPROCESSORS, PREPROCESSORS

pytestmark = pytest.mark.timeout(120)

BATCH = 4
ANCHORS = 896
Detections = list[list[dict[str, Any]]]


def face_model(make_model: MakeModel, mode: str) -> Path:
    """Short-range BlazeFace as an ``.om``: static batch 4 for queue mode, gears otherwise."""
    if mode == "queue":
        return make_model("face_q", {"input_shape": {"input": [BATCH, 3, 128, 128]}}, suffix=".om")
    manifest = {"input_shape": {"input": [-1, 3, 128, 128]}, "dynamic_batch_size": GEARS}
    return make_model("face", manifest, suffix=".om")


@pytest.fixture(scope="module")
def images(carphone_frames: list[np.ndarray], stills: list[np.ndarray]) -> list[np.ndarray]:
    """Every twelfth carphone frame, then the four stills: 14 images, so the last batch of 4
    has 2 real frames and 2 padding rows."""
    return [*carphone_frames[::12], *stills]


def batches(pre: Preprocessor, images: Sequence[np.ndarray]) -> list[tuple[np.ndarray, list[Any]]]:
    """Batches of 4 letterboxed images (the last one padded with copies of its last row, as
    the batcher does) and each real frame's transform."""
    found = []
    for start in range(0, len(images), BATCH):
        tensors, transforms = zip(*(pre(i) for i in images[start : start + BATCH]), strict=True)
        rows = [*tensors, *[tensors[-1]] * (BATCH - len(tensors))]
        found.append((np.stack(rows), list(transforms)))
    return found


def run_batch(model: QueueModel, batch: np.ndarray) -> tuple[Tensor, ...]:
    model.enqueue([batch])
    done = model.dequeue(10_000)
    assert done is not None and done.error is None and done.outputs is not None
    return done.outputs


def assert_same(expected: Detections, got: Detections) -> None:
    """Same detections per image: boxes and keypoints within a pixel, scores within 1e-4."""
    assert [len(d) for d in expected] == [len(d) for d in got]
    for want, have in zip(expected, got, strict=True):
        for a, b in zip(want, have, strict=True):
            assert np.abs(np.subtract(a["box"], b["box"])).max() <= 1.0
            assert abs(a["score"] - b["score"]) <= 1e-4
            assert np.abs(np.subtract(a["keypoints"], b["keypoints"])).max() <= 1.0


def host_reads(sim: Simulator) -> list[tuple[int, int]]:
    """``(address, bytes)`` of every read of device memory by the host: device-to-host
    copies and ``acl.util.ptr_to_bytes`` (reading in place under ACL_DEVICE)."""
    copies = [
        (args[2], args[3])
        for args in calls(sim, "acl.rt.memcpy")
        if args[4] == MemcpyKind.DEVICE_TO_HOST
    ]
    return copies + [(args[0], args[1]) for args in calls(sim, "acl.util.ptr_to_bytes")]


def overlaps(reads: list[tuple[int, int]], tensors: list[AclDeviceTensor]) -> list[Any]:
    """The reads that touch the memory of any of ``tensors``."""
    return [
        (ptr, size)
        for ptr, size in reads
        for t in tensors
        if ptr < t.ptr + t.nbytes and t.ptr < ptr + size
    ]


def plug_ins(
    info: Any, threshold: float | None, operators: Any
) -> tuple[Postprocessor, Postprocessor]:
    """BlazeFace with ``nms = "operator"`` on ``operators``, and with the host NMS."""
    table = {"kind": "blazeface", "score_threshold": threshold}
    device = POSTPROCESSORS.create(PluginConfig(**table, nms="operator"), info, "t", operators)
    return device, POSTPROCESSORS.create(PluginConfig(**table), info, "t")


@pytest.mark.parametrize("run_mode", ["host", "device"])
@pytest.mark.parametrize("mode", ["sync", "async", "queue"])
def test_operator_nms_reads_the_outputs_in_device_memory(
    make_backend: MakeBackend,
    make_model: MakeModel,
    images: list[np.ndarray],
    reference: Reference,
    mode: str,
    run_mode: str,
) -> None:
    """At the default threshold and at 0.1 (up to 208 candidates on chelsea: top-k runs again
    with a larger k), on real and padded batches."""
    backend = make_backend(sim={"run_mode": run_mode})
    sim = backend.simulator
    spec = ModelSpec("face", face_model(make_model, mode), mode=mode, device_outputs=True)
    handed: list[AclDeviceTensor] = []
    in_place: set[tuple[int, int]] = set()
    with backend.load(spec) as model:
        model.attach_thread()
        pre = PREPROCESSORS.create(PluginConfig(kind="letterbox"), model.info, "t")
        for threshold in (None, 0.1):
            device, host = plug_ins(model.info, threshold, backend.operators())
            got: Detections = []
            expected: Detections = []
            for batch, transforms in batches(pre, images):
                outputs = run_batch(model, batch)
                assert all(isinstance(t, AclDeviceTensor) for t in outputs)
                got += [r["detections"] for r in device(outputs, transforms)]
                expected += [r["detections"] for r in host(reference(batch), transforms)]
                regressors, logits = sorted(outputs, key=lambda t: t.shape[-1], reverse=True)
                n = len(transforms)
                in_place |= {(logits.ptr, n * ANCHORS * 4), (regressors.ptr, n * ANCHORS * 64)}
                handed += outputs
                release_inputs(outputs)
            assert_same(expected, got)
            assert sum(len(d) for d in got) >= len(images) - 3  # a face on all but 3
    assert in_place <= {args[:2] for args in calls(sim, "acl.create_data_buffer")}
    assert overlaps(host_reads(sim), handed) == []
    assert {"TopKV2", "GatherV2", "NonMaxSuppressionV6"} == {
        args[0] for args in calls(sim, "acl.op.execute_v2")
    }
    assert rules(sim) == []


def test_onnxruntime_operators_take_host_arrays_only(
    make_backend: MakeBackend, make_model: MakeModel, frames: list[np.ndarray]
) -> None:
    backend = make_backend()
    spec = ModelSpec("face", face_model(make_model, "sync"), mode="sync", device_outputs=True)
    with backend.load(spec) as model, OnnxOperators() as onnx_ops:
        model.attach_thread()
        pre = PREPROCESSORS.create(PluginConfig(kind="letterbox"), model.info, "t")
        ((batch, _),) = batches(pre, frames[:BATCH])
        outputs = run_batch(model, batch)
        with pytest.raises(ValueError, match="read host arrays, got AclDeviceTensor"):
            onnx_ops.top_k(outputs[1], 1, shape=(BATCH, ANCHORS))
        release_inputs(outputs)


@pytest.mark.parametrize("fault", [False, True])
def test_the_stage_releases_the_outputs_after_its_postprocessor(
    make_backend: MakeBackend, make_model: MakeModel, frames: list[np.ndarray], fault: bool
) -> None:
    """A stage whose BlazeFace runs ``nms = "operator"`` is loaded with device outputs; its
    postprocess releases each batch's outputs (datasets destroyed, memory back in the pool)
    once, whether the operators worked or failed the batch."""
    backend = make_backend()
    sim = backend.simulator
    config = Config.model_validate(
        {
            "ingress": [{"uri": "pull+bind:tcp://127.0.0.1:5555"}],
            "egress": [{"uri": "pub+bind:tcp://127.0.0.1:5556"}],
            "runtime": {"backend": "acl-sim"},
            "models": [
                {
                    "name": "face",
                    "path": str(face_model(make_model, "async")),
                    "mode": "async",
                    "max_in_flight": 1,
                    "batch": {"max_size": BATCH},
                    "preprocess": {"kind": "letterbox"},
                    "postprocess": {"kind": "blazeface", "nms": "operator"},
                }
            ],
        }
    )
    (stage,) = load_chain(backend, config)
    if fault:  # from now on: the load's operator check would refuse a device that fails them
        sim.options.fail_calls["acl.op.execute_v2"] = 500002
    try:
        stage.model.attach_thread()
        assert stage.postprocess is not None
        pre = PREPROCESSORS.create(PluginConfig(kind="letterbox"), stage.model.info, "t")
        for batch, transforms in batches(pre, frames) * 2:  # more batches than the pool holds
            outputs = run_batch(stage.model, batch)
            assert all(isinstance(t, AclDeviceTensor) for t in outputs)
            assert "datasets" in sim.live_resources()  # the batch, held by its outputs
            batch_frames = [Frame("t", i, 0, 0.0, transform=t) for i, t in enumerate(transforms)]
            if fault:
                with pytest.raises(FrameError, match="operator TopKV2"):
                    stage.postprocess_batch(outputs, batch_frames)
            else:
                stage.postprocess_batch(outputs, batch_frames)
                assert sum(len(f.results["detections"]) for f in batch_frames) >= 2
            assert "datasets" not in sim.live_resources()
    finally:
        stage.close()
    assert rules(sim) == []


def test_streams_of_ended_threads_are_released(
    make_backend: MakeBackend, make_model: MakeModel
) -> None:
    """Each thread that runs an operator gets a stream of its own; once the thread has ended,
    its stream is destroyed as the next one is made. A reload starts new dequeue threads:
    keeping every stream to the close leaked two a reload of a device's bounded streams."""
    backend = make_backend(devices=(0, 1))
    sim = backend.simulator
    (stage,) = load_chain(backend, operator_nms_config(face_model(make_model, "async")))
    operators = backend.operators()
    at_load = len(sim.live_resources()["streams"])  # the models' and the load check's
    try:
        for _ in range(5):
            assert run_top_k_on_a_thread(stage.model, operators) == [[7.0, 6.0]]
        assert len(sim.live_resources()["streams"]) == at_load + 1  # the last thread's
    finally:
        stage.close()
    assert rules(sim) == []


def test_a_stream_that_cannot_be_destroyed_waits_for_the_close(
    make_backend: MakeBackend, make_model: MakeModel
) -> None:
    """A failed destroy of an ended thread's stream is logged, fails no frame, and is tried
    again when the operators close (nothing is left allocated)."""
    backend = make_backend(devices=(0, 1))
    sim = backend.simulator
    (stage,) = load_chain(backend, operator_nms_config(face_model(make_model, "async")))
    operators = backend.operators()
    try:
        assert run_top_k_on_a_thread(stage.model, operators) == [[7.0, 6.0]]
        sim.options.fail_calls["acl.rt.destroy_stream"] = 107002
        with capture_logs() as logs:
            assert run_top_k_on_a_thread(stage.model, operators) == [[7.0, 6.0]]
        del sim.options.fail_calls["acl.rt.destroy_stream"]
        events = [e["event"] for e in logs]
        assert "acl_operator_stream_release_failed" in events
        released = next(e for e in logs if e["event"] == "acl_operator_streams_released")
        assert (released["streams"], released["of_ended_threads"]) == (0, 1)
    finally:
        stage.close()


def run_top_k_on_a_thread(model: QueueModel, operators: Any) -> list[list[float]]:
    """Top 2 of 0..7 from a new thread with the model's context, which then ends; its
    values."""
    found: list[Any] = []

    def run() -> None:
        model.attach_thread()
        values, _ = operators.top_k(np.arange(8, dtype=np.float32)[None], 2)
        found.append(values.tolist())

    thread = threading.Thread(target=run)
    thread.start()
    thread.join(30)
    assert found, "the operator failed on its thread"
    return found[0]


def operator_nms_config(model: Path) -> Config:
    """BlazeFace on ``acl-sim`` with ``nms = "operator"``, on devices 0 and 1."""
    return Config.model_validate(
        {
            "ingress": [{"uri": "pull+bind:tcp://127.0.0.1:5555"}],
            "egress": [{"uri": "pub+bind:tcp://127.0.0.1:5556"}],
            "runtime": {"backend": "acl-sim", "devices": [0, 1]},
            "models": [
                {
                    "name": "face",
                    "path": str(model),
                    "mode": "async",
                    "batch": {"max_size": BATCH},
                    "preprocess": {"kind": "letterbox"},
                    "postprocess": {"kind": "blazeface", "nms": "operator"},
                }
            ],
        }
    )


@pytest.mark.parametrize(
    ("options", "refusal", "message"),
    [
        (  # shape inference gives the NMS output no bound, and the config gives none either:
            # a setting is missing (check and run exit 2)
            {"sim": {"unknown_rank_ops": ["NonMaxSuppressionV6"]}},
            ConfigError,
            "device 0: operators on acl: operator NonMaxSuppressionV6: the output rank is "
            "unknown; set runtime.options.op_max_shapes.NonMaxSuppressionV6",
        ),
        (  # the configured bound is too small for the check's two kept boxes: the setting is
            # wrong (check and run exit 2), not the device
            {
                "sim": {"unknown_rank_ops": ["NonMaxSuppressionV6"]},
                "op_max_shapes": {"NonMaxSuppressionV6": [[1, 3]]},
            },
            ConfigError,
            "device 0: operators on acl: operator NonMaxSuppressionV6: runtime.options."
            "op_max_shapes.NonMaxSuppressionV6: an output does not fit the maximum shapes "
            "[[1, 3]]",
        ),
        (  # the device cannot run the operator (not built for it)
            {"sim": {"fail_calls": {"acl.op.execute_v2": 500002}}},
            BackendError,
            "device 0: operators on acl: operator NonMaxSuppressionV6: acl.op.execute_v2 failed",
        ),
    ],
)
def test_operators_that_cannot_run_refuse_the_load(
    make_backend: MakeBackend,
    make_model: MakeModel,
    options: dict[str, Any],
    refusal: type[Exception],
    message: str,
) -> None:
    """A postprocessor with ``nms = "operator"`` checks the operators on every device at
    load: a config whose every frame would fail ``postprocess_failed`` does not load (so
    ``streamer check``, the start and a reload refuse it); nothing is left allocated."""
    backend = make_backend(devices=(0, 1), **options)
    with pytest.raises(refusal) as refused:
        load_chain(backend, operator_nms_config(face_model(make_model, "async")))
    assert message in str(refused.value)  # a ConfigError also names the stage


def test_operators_are_checked_on_every_device(
    make_backend: MakeBackend, make_model: MakeModel
) -> None:
    """The check runs each operator once per device (the fixture then checks that the
    streams it made there are released with the operators)."""
    backend = make_backend(devices=(0, 1))
    sim = backend.simulator
    (stage,) = load_chain(backend, operator_nms_config(face_model(make_model, "async")))
    try:
        assert len(calls(sim, "acl.op.execute_v2")) == 2 * 3  # nms, top_k, gather_rows
    finally:
        stage.close()
    assert rules(sim) == []

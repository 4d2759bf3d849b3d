"""The ACL backend in each mode on the simulator: real BlazeFace batches, outputs equal to the
onnxruntime backend's within 1e-4, FIFO order, one enqueue thread and one dequeue thread."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from acl_testing import (
    GEARS,
    MakeBackend,
    MakeModel,
    Reference,
    assert_close,
    blazeface_input,
    run_threads,
    tiny_model,
)
from structlog.testing import capture_logs

from streamer.errors import ModelError
from streamer.runtime.acl.backend import REPORT_THREADS_RECOMMENDED
from streamer.runtime.acl.constants import QUEUE_NAME_MAX_BYTES
from streamer.runtime.acl.model_async import AsyncModel
from streamer.runtime.acl.model_queue import QueueModeModel
from streamer.runtime.acl.model_sync import SyncModel
from streamer.runtime.base import ModelSpec

pytestmark = pytest.mark.timeout(60)


@pytest.mark.parametrize("run_mode", ["host", "device"])
@pytest.mark.parametrize("mode", ["async", "sync"])
def test_dynamic_gears_match_onnxruntime(
    mode: str,
    run_mode: str,
    make_backend: MakeBackend,
    dynamic_model: Path,
    frames: list[np.ndarray],
    reference: Reference,
) -> None:
    backend = make_backend(sim={"run_mode": run_mode})
    model = backend.load(ModelSpec("face", dynamic_model, mode=mode, max_in_flight=2))
    assert isinstance(model, AsyncModel if mode == "async" else SyncModel)
    assert model.info.batch_gears == tuple(GEARS)
    assert model.info.inputs[0].shape == (-1, 3, 128, 128)
    assert [t.shape for t in model.info.outputs] == [(-1, 896, 16), (-1, 896, 1)]
    batches = [blazeface_input(frames[:gear]) for gear in [*GEARS, 2, 1]]
    results = run_threads(model, batches)
    for batch, done in zip(batches, results, strict=True):
        assert done.error is None and done.end_ns >= done.start_ns > 0
        assert_close(done.outputs, reference(batch))
    model.close()


@pytest.mark.parametrize("run_mode", ["host", "device"])
@pytest.mark.parametrize("with_q", ["pyacl", "ctypes"])
def test_queue_mode_static_batch_matches_onnxruntime(
    with_q: str,
    run_mode: str,
    make_backend: MakeBackend,
    static4_model: Path,
    frames: list[np.ndarray],
    reference: Reference,
) -> None:
    backend = make_backend(sim={"run_mode": run_mode, "with_q": with_q})
    model = backend.load(ModelSpec("face", static4_model, mode="queue", max_in_flight=3))
    assert isinstance(model, QueueModeModel)
    assert model.info.batch_gears == (4,) and model.info.inputs[0].shape == (4, 3, 128, 128)
    batches = [blazeface_input(frames[i : i + 4]) for i in (0, 4, 2, 1, 3)]
    results = run_threads(model, batches)
    for batch, done in zip(batches, results, strict=True):
        assert done.error is None
        assert_close(done.outputs, reference(batch))
    model.close()


def test_batch_one_static_model_and_full_range_model(
    make_backend: MakeBackend,
    make_model: MakeModel,
    full_range_model: Path,
    frames: list[np.ndarray],
    reference: Reference,
) -> None:
    backend = make_backend()
    static1 = make_model("face_b1", {"input_shape": {"input": [1, 3, 128, 128]}})
    with backend.load(ModelSpec("face", static1)) as model:
        assert isinstance(model, QueueModeModel), "auto picks queue for a static model"
        batch = blazeface_input(frames[:1])
        (done,) = run_threads(model, [batch])
        assert_close(done.outputs, reference(batch))
    full = make_model(
        "full",
        {"input_shape": {"input": [-1, 3, 192, 192]}, "dynamic_batch_size": [1, 2]},
        full_range_model,
    )
    with backend.load(ModelSpec("full", full)) as model:
        assert isinstance(model, AsyncModel), "auto picks async for dynamic gears"
        (done,) = run_threads(model, [blazeface_input(frames[:2], 192)])
        assert done.outputs is not None and done.outputs[0].shape == (2, 2304, 16)


def test_auto_mode_choices(
    make_backend: MakeBackend, make_model: MakeModel, static4_model: Path
) -> None:
    no_queue = make_backend(sim={"with_q": "none"})
    assert not no_queue.queue_mode_available
    with no_queue.load(ModelSpec("face", static4_model)) as model:
        assert isinstance(model, AsyncModel)
    with pytest.raises(ModelError, match="mode 'queue' is unavailable"):
        no_queue.load(ModelSpec("face", static4_model, mode="queue"))
    backend = make_backend()
    om2 = make_model("om2", {"input_shape": {"input": [4, 3, 128, 128]}, "om2": True})
    with backend.load(ModelSpec("face", om2)) as model:
        assert isinstance(model, AsyncModel), "WithQ refuses OM2: auto falls back to async"
    assert backend.simulator.violations == [], "a documented fallback breaks no rule"
    with pytest.raises(ModelError, match="mode 'queue' refused by the runtime"):
        backend.load(ModelSpec("face", om2, mode="queue"))


def test_queue_mode_on_a_dynamic_model_says_why(
    make_backend: MakeBackend, dynamic_model: Path
) -> None:
    backend = make_backend()
    with pytest.raises(ModelError) as caught:
        backend.load(ModelSpec("face", dynamic_model, mode="queue"))
    message = str(caught.value)
    assert "needs a static-shape model" in message and "[1, 2, 4, 8]" in message
    assert "aclmdlLoadFromFileWithQ" in message and "--input_shape" in message
    assert backend.simulator.models.live()["models"] == [], "the probe load was released"


def test_model_errors_at_load(
    make_backend: MakeBackend, make_model: MakeModel, dynamic_model: Path, tmp_path: Path
) -> None:
    backend = make_backend()
    with pytest.raises(ModelError, match="device 3 is not in runtime.devices"):
        backend.load(ModelSpec("face", dynamic_model, device=3))
    with pytest.raises(ModelError, match="cannot load"):
        backend.load(ModelSpec("face", tmp_path / "missing.om"))
    with pytest.raises(ModelError, match=r"gears \[3\] are not among"):
        backend.load(ModelSpec("face", dynamic_model, batch_gears=(1, 3)))
    manifest = {"input_shape": {"x": [1, 3, -1, -1]}, "dynamic_image_size": [[8, 8], [16, 16]]}
    hw = make_model("relu_hw", manifest, tiny_model(tmp_path / "relu.onnx"))
    with pytest.raises(ModelError, match=r"gears \[2\] are not among the model's gears \[1\]"):
        backend.load(ModelSpec("face", hw, batch_gears=(1, 2)))


def test_om_path_runs_the_onnx_sibling(make_backend: MakeBackend, make_model: MakeModel) -> None:
    path = make_model("face", {"input_shape": {"input": [2, 3, 128, 128]}}, suffix=".om")
    assert path.suffix == ".om" and not path.exists()
    with make_backend().load(ModelSpec("face", path)) as model:
        assert model.info.batch_gears == (2,)


def test_two_devices_one_replica_each(
    make_backend: MakeBackend, dynamic_model: Path, frames: list[np.ndarray], reference: Reference
) -> None:
    backend = make_backend(devices=(0, 1))
    replicas = [
        backend.load(ModelSpec("face", dynamic_model, device=d, mode="async")) for d in (0, 1)
    ]
    batch = blazeface_input(frames[:4])
    for replica in replicas:
        (done,) = run_threads(replica, [batch])
        assert_close(done.outputs, reference(batch))
    devices = {a.device for a in backend.simulator.memory.live() if a.device is not None}
    assert devices == {0, 1}
    for replica in replicas:
        replica.close()


def test_two_models_on_one_device_get_their_own_streams(
    make_backend: MakeBackend, dynamic_model: Path, frames: list[np.ndarray]
) -> None:
    backend = make_backend()
    first = backend.load(ModelSpec("a", dynamic_model, mode="async"))
    second = backend.load(ModelSpec("b", dynamic_model, mode="async"))
    batch = blazeface_input(frames[:2])
    assert run_threads(first, [batch])[0].error is None
    assert run_threads(second, [batch])[0].error is None
    assert len(backend.simulator.live_resources()["streams"]) == 2
    second.close()
    first.close()


@pytest.mark.parametrize("interval", [3])
def test_callback_interval_with_flush_of_the_remainder(
    interval: int,
    make_backend: MakeBackend,
    dynamic_model: Path,
    frames: list[np.ndarray],
    reference: Reference,
) -> None:
    # A flush is due 300 ms after a batch's enqueue: long enough that the enqueues reach
    # the interval before it on a loaded machine (at 5 ms, a slow enqueue let a flush
    # take the first batches and one callback fewer was launched).
    backend = make_backend(callback_interval=interval, callback_flush_ms=300)
    model = backend.load(ModelSpec("face", dynamic_model, mode="async", max_in_flight=4))
    batches = [blazeface_input(frames[:gear]) for gear in (1, 2, 4, 8, 1)]
    results = run_threads(model, batches)
    for batch, done in zip(batches, results, strict=True):
        assert_close(done.outputs, reference(batch))
    launched = backend.simulator.log.names("acl.rt.launch_callback")
    assert len(launched) == len(batches) // interval
    assert backend.simulator.log.names("acl.rt.synchronize_stream_with_timeout"), (
        "the rest is flushed"
    )
    model.close()


def test_a_callback_interval_above_max_in_flight_is_lowered_to_it(
    make_backend: MakeBackend, dynamic_model: Path, frames: list[np.ndarray], reference: Reference
) -> None:
    """An interval of 100 would never fill with at most 4 batches in flight: every batch
    would wait callback_flush_ms (5 s here) for a sync. Lowered to 4, and said, the fourth
    enqueue launches the callback that finishes all four."""
    backend = make_backend(callback_interval=100, callback_flush_ms=5000)
    with capture_logs() as logs:
        model = backend.load(ModelSpec("face", dynamic_model, mode="async", max_in_flight=4))
    (lowered,) = [e for e in logs if e["event"] == "acl_callback_interval_lowered"]
    assert (lowered["callback_interval"], lowered["max_in_flight"]) == (100, 4)
    batches = [blazeface_input(frames[:gear]) for gear in (1, 2, 4, 8)]
    for batch in batches:
        model.enqueue([batch])
    assert len(backend.simulator.log.names("acl.rt.launch_callback")) == 1
    for batch in batches:
        done = model.dequeue(2000)  # well within the 5 s flush: the callback finished it
        assert done is not None and done.error is None
        assert_close(done.outputs, reference(batch))
    assert not backend.simulator.log.names("acl.rt.synchronize_stream_with_timeout")
    model.close()


def test_a_lowered_callback_interval_is_said_once_per_model_not_per_replica_or_reload(
    make_backend: MakeBackend, dynamic_model: Path
) -> None:
    backend = make_backend(callback_interval=100, callback_flush_ms=5000)
    spec = ModelSpec("face", dynamic_model, mode="async", max_in_flight=4)
    with capture_logs() as logs:
        replicas = [backend.load(spec) for _ in range(2)]
        for model in replicas:
            model.close()
        reloaded = backend.load(spec)  # a SIGHUP that changed another model
        other = backend.load(ModelSpec("face", dynamic_model, mode="async", max_in_flight=2))
    lowered = [e for e in logs if e["event"] == "acl_callback_interval_lowered"]
    assert [e["max_in_flight"] for e in lowered] == [4, 2]
    reloaded.close()
    other.close()


def test_invalid_batches_fail_alone_and_in_order(
    make_backend: MakeBackend, dynamic_model: Path, static4_model: Path, frames: list[np.ndarray]
) -> None:
    backend = make_backend()
    for path, mode in ((dynamic_model, "async"), (dynamic_model, "sync"), (static4_model, "queue")):
        with backend.load(ModelSpec("face", path, mode=mode)) as model:
            good = blazeface_input(frames[:4])
            bad = [
                blazeface_input(frames[:3]),
                good.astype(np.float64),
                blazeface_input(frames[:4], 96),
            ]
            model.enqueue([good])
            for batch in bad:
                model.enqueue([batch])
            results = [model.dequeue(5000) for _ in range(4)]  # queue mode: one in flight
            model.enqueue([good])
            results.append(model.dequeue(5000))
            assert [r is not None and r.error is None for r in results] == [
                True,
                False,
                False,
                False,
                True,
            ]
            reasons = {r.error.reason for r in results if r is not None and r.error is not None}
            assert reasons == {"inference_failed"}


def test_configured_gears_narrow_the_model_gears(
    make_backend: MakeBackend, dynamic_model: Path, frames: list[np.ndarray]
) -> None:
    with make_backend().load(ModelSpec("face", dynamic_model, batch_gears=(4, 1))) as model:
        assert model.info.batch_gears == (1, 4)
        model.enqueue([blazeface_input(frames[:2])])
        done = model.dequeue(5000)
        assert done is not None and done.error is not None
        assert "not one of the model's gears [1, 4]" in done.error.detail


def test_queue_names_are_unique_per_device_and_replica(
    make_backend: MakeBackend, static4_model: Path, frames: list[np.ndarray], reference: Reference
) -> None:
    """Two replicas on device 0 and one on device 1, under a name too long for a queue: every
    queue gets its own name, within the 128 bytes (NUL included) a queue name may have."""
    name = "face-" + "é" * 100  # 205 bytes in UTF-8
    backend = make_backend(devices=(0, 1))
    models = [
        backend.load(ModelSpec(name, static4_model, device=device, mode="queue"))
        for device in (0, 0, 1)
    ]
    names = list(backend.simulator.queues.names().values())
    assert len(set(names)) == len(names) == 3 * (1 + 2), "BlazeFace: one input, two outputs"
    assert all(len(n.encode()) < QUEUE_NAME_MAX_BYTES and n.startswith("face-éé") for n in names)
    batch = blazeface_input(frames[:4])
    for model in models:
        model.enqueue([batch])
        assert (done := model.dequeue(5000)) is not None
        assert_close(done.outputs, reference(batch))
        model.close()


def test_more_callback_threads_than_recommended_are_logged_once(
    make_backend: MakeBackend, make_model: MakeModel, tmp_path: Path
) -> None:
    """One line as the count crosses the recommendation, not one per model beyond it."""
    manifest = {"input_shape": {"x": [1, 3, 8, 8]}}
    path = make_model("relu_1x8", manifest, tiny_model(tmp_path / "relu.onnx"))
    backend = make_backend()
    models = []
    with capture_logs() as logs:
        for _ in range(REPORT_THREADS_RECOMMENDED + 3):
            models.append(backend.load(ModelSpec("relu", path, mode="async")))
    warnings = [e for e in logs if e["event"] == "acl_report_threads_over_recommended"]
    assert [w["report_threads"] for w in warnings] == [REPORT_THREADS_RECOMMENDED + 1]
    for model in models:
        model.close()

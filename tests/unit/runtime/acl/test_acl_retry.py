"""A batch whose inputs are device tensors (a ``tensor`` chain) lives in one device's memory:
when it fails, it is not retried on another replica, as a batch of host arrays is."""

from __future__ import annotations

import threading
from pathlib import Path

import numpy as np
from acl_testing import GEARS, MakeBackend, MakeModel, blazeface_input

from streamer.errors import FrameError, Reason
from streamer.frames import Batch
from streamer.runtime.acl.device_tensor import AclDeviceTensor
from streamer.runtime.base import ModelSpec, release_inputs
from streamer.scheduling.replica import Dispatched, Dispatcher, Replica


def test_a_batch_of_device_tensors_is_not_retried_one_of_host_arrays_is(
    make_backend: MakeBackend,
    make_model: MakeModel,
    assets: dict[str, Path],
    frames: list[np.ndarray],
) -> None:
    manifest = {"input_shape": {"input": [-1, 3, 128, 128]}, "dynamic_batch_size": GEARS}
    backbone = make_model("backbone", manifest, assets["blazeface_short_range.backbone"], ".om")
    backend = make_backend(devices=(0, 1))

    def spec(device: int) -> ModelSpec:
        return ModelSpec("backbone", backbone, device=device, mode="async", device_outputs=True)

    with backend.load(spec(0)) as first, backend.load(spec(1)) as second:
        first.attach_thread()
        host = blazeface_input(frames[:2])
        first.enqueue([host])
        done = first.dequeue(10_000)
        assert done is not None and done.outputs is not None
        assert all(isinstance(t, AclDeviceTensor) for t in done.outputs)
        replicas = [Replica(0, 0, first), Replica(1, 1, second)]
        dispatcher = Dispatcher(replicas, threading.Event())
        error = FrameError(Reason.INFERENCE_FAILED, "acl.mdl.execute_async failed")
        device_batch = Dispatched(Batch([]), done.outputs)
        assert not dispatcher.retry(device_batch, replicas[0], error)
        assert replicas[1].submit.empty() and replicas[1].in_flight == 0
        release_inputs(done.outputs)
        assert dispatcher.retry(Dispatched(Batch([]), [host]), replicas[0], error)
        retried = replicas[1].submit.get_nowait()
        assert retried.retried and retried.inputs[0] is host and replicas[1].in_flight == 1
        assert not dispatcher.retry(retried, replicas[1], error)  # once per batch

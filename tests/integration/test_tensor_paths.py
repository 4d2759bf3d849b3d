"""A tensor chain on two simulated Ascend devices keeps to the devices that still have a
path through it: BlazeFace's backbone → head (``configs/blazeface_split.toml`` laid out for
``acl-sim``, async mode) with a replica of each stage on devices 0 and 1, the whole chain
run (batchers, enqueue and dequeue threads, router), replicas taken out of rotation by
``Replica.fail``."""

from __future__ import annotations

import queue
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

from streamer.config import Config, load_config
from streamer.errors import BackendError, Reason
from streamer.frames import STOP, Batch, Frame, OutcomeCounts
from streamer.model_stages import load_chain
from streamer.runtime import open_backend
from streamer.runtime.acl.sim.backend import AclSimBackend
from streamer.scheduling.chain_run import ChainRun
from streamer.scheduling.mailbox import Mailbox
from streamer.sim_layout import sim_layout
from streamer.vision.preprocess import Preprocessor

pytestmark = pytest.mark.timeout(120)

ROOT = Path(__file__).resolve().parents[2]
FRAMES = 40


@dataclass
class Chain:
    """A running chain and the queues around it."""

    run: ChainRun
    admission: Mailbox
    results: queue.SimpleQueue[object]
    preprocess: Preprocessor

    def send(self, images: list[np.ndarray]) -> None:
        """One frame per image, prepared for the backbone as the pipeline's workers do."""
        for seq, image in enumerate(images):
            frame = Frame("carphone", seq, time.monotonic_ns(), time.time())
            frame.height, frame.width = image.shape[:2]
            frame.tensor, frame.transform = self.preprocess(image)
            self.admission.put(frame)

    def published(self) -> list[Frame]:
        """What reached egress so far, in seq order."""
        frames: list[Frame] = []
        while not self.results.empty():
            item = self.results.get()
            assert isinstance(item, Batch)
            frames += item.frames
        return sorted(frames, key=lambda f: f.seq)


@pytest.fixture
def split_config(tmp_path: Path) -> Config:
    """The shipped split chain on the simulator, devices 0 and 1."""
    config = load_config(ROOT / "configs" / "blazeface_split.toml")
    laid_out = sim_layout(config, tmp_path / "models", mode="async", batch_sizes=(1, 2, 4, 8))
    runtime = laid_out.runtime.model_copy(update={"devices": (0, 1)})
    return laid_out.model_copy(update={"runtime": runtime})


@pytest.fixture
def chain(split_config: Config) -> Iterator[Chain]:
    """The chain, launched; given up, joined and closed after the test, the simulator
    checked for leaks."""
    with open_backend(split_config.runtime) as backend:
        assert isinstance(backend, AclSimBackend) and backend.device_memory
        stages = load_chain(backend, split_config)
        admission, results = Mailbox(), queue.SimpleQueue[object]()
        run = ChainRun(stages, admission, results, OutcomeCounts(), lambda frame: None, 10, True)
        try:
            run.launch(10)
            assert stages[0].preprocess is not None
            yield Chain(run, admission, results, stages[0].preprocess)
        finally:
            run.give_up(Reason.SHUTDOWN)
            run.join(10)
            run.close()
    assert backend.simulator.live_resources() == {}


def test_a_head_out_of_rotation_sends_every_frame_to_the_device_with_both_stages(
    chain: Chain, carphone_frames: list[np.ndarray]
) -> None:
    """Before, backbone-1 kept taking its share of the batches, and the head batches it made
    on device 1 failed with ``no live replica on device 1``: about half of the frames."""
    (backbone_0, backbone_1), (head_0, head_1) = chain.run.replicas
    head_1.fail("device 1 reset")
    assert backbone_1.failed is not None and "stage 'head'" in backbone_1.failed
    chain.send(carphone_frames[:FRAMES])
    chain.admission.put(STOP)
    assert chain.run.drain(time.monotonic() + 60)
    done = chain.published()
    assert [f.seq for f in done] == list(range(FRAMES))
    assert [f.error for f in done if f.error is not None] == []
    assert all(len(f.results["detections"]) == 1 for f in done)
    assert (backbone_1.executed, head_1.executed) == (0, 0)
    assert backbone_0.executed == head_0.executed > 0
    assert chain.run.failure() is None


def test_with_no_device_left_with_a_path_the_chain_fails_and_its_frames_name_the_stage(
    chain: Chain, carphone_frames: list[np.ndarray]
) -> None:
    """The break test's end state: a backbone only on device 1, a head only on device 0.
    Before, the chain reported no failure and every frame failed with ``no live replica on
    device 1``, an error naming no stage."""
    (backbone_0, backbone_1), (head_0, head_1) = chain.run.replicas
    head_1.fail("2 executions failed in a row")
    backbone_0.fail("acl.mdl.execute_async failed")
    assert backbone_1.failed is not None and head_0.failed is not None
    failure = chain.run.failure()
    assert isinstance(failure, BackendError)
    assert str(failure) == (
        "tensor chain 'backbone' -> 'head': no device has a live replica of every stage, and "
        "each batch runs on the device that holds its tensors (device 0 lacks stage "
        "'backbone' (backbone-0: acl.mdl.execute_async failed); device 1 lacks stage 'head' "
        "(head-1: 2 executions failed in a row))"
    )
    chain.send(carphone_frames[:4])
    batcher = chain.run.first_batcher
    batcher.join(30)  # it ends at the first batch it has no replica for
    assert not batcher.is_alive() and isinstance(batcher.failure, BackendError)
    done = chain.published()
    assert done and all(f.error is not None for f in done)
    assert all(f.error.detail.startswith("stage backbone: ") for f in done if f.error)
    assert str(chain.run.failure()) == str(failure)  # the cause, not the batcher's end

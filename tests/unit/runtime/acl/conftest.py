"""Fixtures of the ACL backend tests: model variants with sidecar manifests, real BlazeFace
input batches, reference outputs from the onnxruntime backend, and simulated backends that
are closed (and checked for leaks) after each test."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from acl_testing import GEARS, MakeBackend, MakeModel

from streamer.config import RuntimeConfig
from streamer.runtime import open_backend
from streamer.runtime.acl.options import SimOptions
from streamer.runtime.acl.sim.backend import AclSimBackend
from streamer.runtime.acl.sim.simulator import Simulator
from streamer.runtime.base import ModelSpec


@pytest.fixture
def make_model(tmp_path: Path, short_range_model: Path) -> MakeModel:
    """``make_model(name, manifest=None, source=short range, suffix=".onnx")``: a copy of an
    ONNX model with ``<name>.acl.json`` next to it; returns the path a config would use."""

    def make(
        name: str,
        manifest: dict[str, Any] | None = None,
        source: Path = short_range_model,
        suffix: str = ".onnx",
    ) -> Path:
        shutil.copyfile(source, tmp_path / f"{name}.onnx")
        if manifest is not None:
            (tmp_path / f"{name}.acl.json").write_text(json.dumps(manifest))
        return tmp_path / f"{name}{suffix}"

    return make


@pytest.fixture
def dynamic_model(make_model: MakeModel) -> Path:
    """Short-range BlazeFace built with ``--dynamic_batch_size=1,2,4,8``."""
    return make_model(
        "face_dyn", {"input_shape": {"input": [-1, 3, 128, 128]}, "dynamic_batch_size": GEARS}
    )


@pytest.fixture
def static4_model(make_model: MakeModel) -> Path:
    """Short-range BlazeFace built with ``--input_shape=input:4,3,128,128``."""
    return make_model("face_b4", {"input_shape": {"input": [4, 3, 128, 128]}})


@pytest.fixture
def make_backend() -> Iterator[MakeBackend]:
    """``make_backend(devices=(0,), **options)``: an ``acl-sim`` backend, closed afterwards;
    ``options["sim"]`` configures the simulator. The test fails if anything leaked."""
    opened: list[AclSimBackend] = []

    def make(devices: Sequence[int] = (0,), **options: Any) -> AclSimBackend:
        config = RuntimeConfig(backend="acl-sim", devices=tuple(devices), options=options)
        backend = open_backend(config)
        assert isinstance(backend, AclSimBackend)
        opened.append(backend)
        return backend

    yield make
    for backend in opened:
        if backend.abandoned_devices:  # left, as hung devices are, to the process exit
            continue
        backend.close()
        assert backend.simulator.live_resources() == {}
        assert backend.simulator.callback_errors == []


@pytest.fixture
def sim() -> Simulator:
    """A bare simulator (one device, host run mode) for rule tests."""
    return Simulator(SimOptions())


@pytest.fixture(scope="session")
def frames(
    astronaut: np.ndarray,
    chelsea: np.ndarray,
    coffee: np.ndarray,
    carphone_frames: list[np.ndarray],
) -> list[np.ndarray]:
    """Eight real images: astronaut, chelsea, coffee and five carphone frames."""
    return [astronaut, chelsea, coffee, *carphone_frames[:100:20]]


@pytest.fixture(scope="session")
def reference(short_range_model: Path) -> Iterator[Callable[[np.ndarray], tuple[np.ndarray, ...]]]:
    """Outputs of the onnxruntime backend for one short-range batch."""
    with (
        open_backend(RuntimeConfig()) as backend,
        backend.load(ModelSpec("ref", short_range_model, max_in_flight=1)) as model,
    ):

        def run(batch: np.ndarray) -> tuple[np.ndarray, ...]:
            model.enqueue([batch])
            done = model.dequeue(10_000)
            assert done is not None and done.outputs is not None
            return done.outputs

        yield run

"""Start-up and teardown order in the call log, on every exit path, with nothing leaked."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from acl_testing import MakeBackend, blazeface_input

from streamer.config import RuntimeConfig
from streamer.errors import BackendError
from streamer.runtime.acl.backend import AclBackend
from streamer.runtime.acl.errors import AclError
from streamer.runtime.acl.options import SimOptions
from streamer.runtime.acl.sim.calllog import CallLog
from streamer.runtime.acl.sim.simulator import Simulator
from streamer.runtime.base import ModelSpec

pytestmark = pytest.mark.timeout(60)

STARTUP = [
    "acl.rt.set_device",
    "acl.rt.create_context",
    "acl.rt.create_stream",
    "acl.rt.get_run_mode",
]
DEVICE_TEARDOWN = [
    "acl.rt.set_context",
    "acl.rt.synchronize_device",
    "acl.rt.destroy_stream",
    "acl.rt.destroy_context",
    "acl.rt.reset_device",
]
PAIRS = {
    "acl.rt.malloc": "acl.rt.free",
    "acl.rt.malloc_host": "acl.rt.free_host",
    "acl.mdl.create_dataset": "acl.mdl.destroy_dataset",
    "acl.create_data_buffer": "acl.destroy_data_buffer",
    "acl.mdl.create_desc": "acl.mdl.destroy_desc",
    "acl.mdl.load_from_file": "acl.mdl.unload",
    "acltdtCreateQueue": "acltdtDestroyQueue",
    "acltdtCreateQueueAttr": "acltdtDestroyQueueAttr",
    "acl.rt.subscribe_report": "acl.rt.unsubscribe_report",
    "acl.rt.set_device": "acl.rt.reset_device",
    "acl.rt.create_context": "acl.rt.destroy_context",
    "acl.rt.create_stream": "acl.rt.destroy_stream",
    "acl.init": "acl.finalize",
}


HANDLES = {
    "acl.mdl.create_dataset",
    "acl.create_data_buffer",
    "acl.mdl.create_desc",
    "acltdtCreateQueueAttr",
}


def succeeded(log: CallLog) -> list[str]:
    """API names of the calls that succeeded, in order."""
    names = []
    for call in log.calls():
        result = call.result
        if call.api in HANDLES:
            ok = bool(result)
        elif isinstance(result, tuple):
            ok = result[-1] == 0
        else:
            ok = result == 0
        if ok:
            names.append(call.api)
    return names


def assert_balanced(log: CallLog) -> None:
    """Every successful acquisition has its release (WithQ loads are released by unload)."""
    count = Counter(succeeded(log))
    for acquire, release in PAIRS.items():
        extra = count["acl.mdl.load_from_file_with_q"] + count["aclmdlLoadFromFileWithQ"]
        expected = count[acquire] + (extra if acquire == "acl.mdl.load_from_file" else 0)
        assert count[release] == expected, f"{acquire} x{expected}, {release} x{count[release]}"


def subsequence(names: Sequence[str], wanted: Sequence[str]) -> bool:
    """``wanted`` appears in ``names`` in this order (other calls may sit between)."""
    remaining = iter(names)
    return all(any(name == want for name in remaining) for want in wanted)


def backend_on(sim: Simulator, devices: Sequence[int] = (0,), **options: Any) -> AclBackend:
    config = RuntimeConfig(backend="acl", devices=tuple(devices), options=options)
    return AclBackend(config, acl=sim.acl, tdt_library=sim.tdt_library, acl_library=sim.acl_library)


def test_startup_and_teardown_order_on_two_devices() -> None:
    sim = Simulator(SimOptions(device_count=2))
    backend = backend_on(sim, devices=(0, 1))
    assert sim.log.names() == ["acl.init", *STARTUP, *STARTUP]
    assert [c.args for c in sim.log.calls("acl.rt.set_device")] == [(0,), (1,)]
    sim.log.clear()
    backend.close()
    assert sim.log.names() == [*DEVICE_TEARDOWN, *DEVICE_TEARDOWN, "acl.finalize"]
    assert [c.args for c in sim.log.calls("acl.rt.reset_device")] == [(1,), (0,)]
    assert sim.live_resources() == {}
    backend.close()
    assert sim.log.names()[-1] == "acl.finalize", "close is idempotent"


@pytest.mark.parametrize(
    ("failing", "released"),
    [
        ("acl.init", []),
        ("acl.rt.create_context", ["acl.rt.reset_device", "acl.finalize"]),
        ("acl.rt.get_run_mode", [*DEVICE_TEARDOWN, "acl.finalize"]),
    ],
)
def test_startup_failure_half_way_releases_in_reverse(failing: str, released: list[str]) -> None:
    sim = Simulator(SimOptions(fail_calls={failing: 500003}))
    with pytest.raises(AclError, match=f"{failing} failed: ACL_ERROR_RT_FAILURE"):
        backend_on(sim)
    names = sim.log.names()
    assert names[names.index(failing) + 1 :] == released
    assert sim.live_resources() == {}


def test_a_missing_second_device_releases_the_first() -> None:
    sim = Simulator(SimOptions(device_count=1))
    with pytest.raises(AclError, match="ACL_ERROR_INVALID_DEVICE"):
        backend_on(sim, devices=(0, 1))
    assert sim.log.names() == [
        "acl.init",
        *STARTUP,
        "acl.rt.set_device",
        *DEVICE_TEARDOWN,
        "acl.finalize",
    ]
    assert sim.live_resources() == {}


def run_batches(model: Any, frames: list[np.ndarray], count: int = 3) -> None:
    """``count`` batches, as many in flight as the model takes: max_in_flight (2), or one in
    queue mode."""
    batch = blazeface_input(frames[:4])
    in_flight = 1 if model.mode == "queue" else 2
    pending = 0
    for _ in range(count):
        if pending == in_flight:
            done = model.dequeue(5000)
            assert done is not None and done.error is None
            pending -= 1
        model.enqueue([batch])
        pending += 1
    for _ in range(pending):
        done = model.dequeue(5000)
        assert done is not None and done.error is None


@pytest.mark.parametrize("mode", ["queue", "async", "sync"])
def test_model_lifecycle_and_nothing_leaked(
    mode: str, make_backend: MakeBackend, static4_model: Path, frames: list[np.ndarray]
) -> None:
    backend = make_backend()
    sim = backend.simulator
    before = sim.live_resources()
    model = backend.load(ModelSpec("face", static4_model, mode=mode))
    run_batches(model, frames)
    live = sim.live_resources()
    assert "datasets" not in live and "data_buffers" not in live, "per-batch datasets released"
    sim.log.clear()
    model.close()
    names = sim.log.names()
    expected = {
        "queue": [
            "acl.rt.free_host",
            "acl.mdl.unload",
            "acl.mdl.destroy_desc",
            "acltdtDestroyQueue",
            "acltdtDestroyQueue",
            "acltdtDestroyQueue",
            "acltdtDestroyQueueAttr",
        ],
        "async": [
            "acl.rt.synchronize_stream_with_timeout",
            "acl.rt.unsubscribe_report",
            "acl.rt.free_host",
            "acl.rt.free",
            "acl.mdl.unload",
            "acl.mdl.destroy_desc",
        ],
        "sync": ["acl.rt.free_host", "acl.rt.free", "acl.mdl.unload", "acl.mdl.destroy_desc"],
    }[mode]
    assert subsequence(names, expected), names
    assert sim.live_resources() == before


@pytest.mark.parametrize("mode", ["queue", "async", "sync"])
def test_every_acquisition_is_released(
    mode: str, static4_model: Path, frames: list[np.ndarray]
) -> None:
    sim = Simulator(SimOptions())
    backend = backend_on(sim)
    model = backend.load(ModelSpec("face", static4_model, mode=mode))
    run_batches(model, frames)
    model.close()
    backend.close()
    assert_balanced(sim.log)
    assert sim.live_resources() == {} and sim.violations == []


@pytest.mark.parametrize(
    ("mode", "failing"),
    [
        ("async", "acl.rt.subscribe_report"),
        ("async", "acl.rt.malloc"),
        ("async", "acl.rt.malloc_host"),
        ("sync", "acl.rt.malloc"),
        ("queue", "acltdtCreateQueue"),
        ("queue", "aclmdlLoadFromFileWithQ"),
        ("queue", "acl.rt.malloc_host"),
    ],
)
def test_load_failure_half_way_releases_everything(
    mode: str, failing: str, static4_model: Path, frames: list[np.ndarray]
) -> None:
    sim = Simulator(SimOptions(fail_calls={failing: 500003}))
    backend = backend_on(sim)
    before = sim.live_resources()
    with pytest.raises(BackendError, match=failing):
        backend.load(ModelSpec("face", static4_model, mode=mode))
    assert sim.live_resources() == before
    backend.close()
    assert_balanced(sim.log)
    assert sim.live_resources() == {}


def test_close_closes_models_left_open(make_backend: MakeBackend, static4_model: Path) -> None:
    backend = make_backend()
    for mode in ("queue", "async", "sync"):
        backend.load(ModelSpec(mode, static4_model, mode=mode))
    backend.close()
    assert backend.simulator.live_resources() == {}


def test_a_failing_release_does_not_leak_the_others() -> None:
    """Every release is still attempted; what the documented order releases after the one
    that failed (its context, the device, acl.init) is refused while it lives (rule
    ``teardown``), so it is left too, and nothing else."""
    sim = Simulator(SimOptions(fail_calls={"acl.rt.destroy_stream": 107000}))
    backend = backend_on(sim)
    sim.log.clear()
    with pytest.raises(AclError, match="acl.rt.destroy_stream"):
        backend.close()
    assert sim.log.names() == [*DEVICE_TEARDOWN, "acl.finalize"]
    assert set(sim.live_resources()) == {"streams", "contexts", "devices", "initialized"}
    assert [(v.rule, v.api) for v in sim.violations] == [
        ("teardown", "acl.rt.destroy_context"),
        ("teardown", "acl.rt.reset_device"),
        ("teardown", "acl.finalize"),
    ]

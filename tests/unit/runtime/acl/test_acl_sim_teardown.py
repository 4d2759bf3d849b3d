"""Rule "teardown" of the simulator (:mod:`streamer.runtime.acl.sim.teardown`): a release out of
the documented order is refused, recorded, and leaves the resource alive; the backend's own
exit paths break it nowhere and leave nothing behind."""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path

import pytest
from acl_testing import MakeBackend, open_device, rules

from streamer.errors import StreamerError
from streamer.runtime.acl.constants import AclCode, MallocPolicy
from streamer.runtime.acl.sim.simulator import Simulator
from streamer.runtime.acl.tdt import TdtQueueApi
from streamer.runtime.acl.withq import WithQLoader
from streamer.runtime.base import ModelSpec

pytestmark = pytest.mark.timeout(30)

FAILURE = AclCode.ERROR_FAILURE
MEMORY_MB = {"queue": 64, "async": 3, "sync": 3}
"""Device memory for one static4 model but not two (async and sync: about 2 MiB each)."""
FAILING = {"queue": "aclmdlLoadFromFileWithQ", "async": "BAD_ALLOC", "sync": "BAD_ALLOC"}


def violations(sim: Simulator) -> list[tuple[str, str, int]]:
    return [(v.rule, v.api, v.code) for v in sim.violations]


def finish(sim: Simulator) -> None:
    """Reset device 0 and finalize, in order; nothing may be left."""
    assert sim.acl.rt.reset_device(0) == 0
    assert sim.acl.finalize() == 0
    assert sim.live_resources() == {}


def test_a_subscribed_stream_is_not_destroyed(sim: Simulator) -> None:
    context = open_device(sim)
    stream, _ = sim.acl.rt.create_stream()
    me = threading.get_ident()
    assert sim.acl.rt.subscribe_report(me, stream) == 0
    assert sim.acl.rt.destroy_stream(stream) == AclCode.ERROR_RT_STREAM_SUBSCRIBE
    assert violations(sim) == [
        ("teardown", "acl.rt.destroy_stream", AclCode.ERROR_RT_STREAM_SUBSCRIBE)
    ]
    assert sim.live_resources()["streams"] == [stream]
    assert sim.acl.rt.unsubscribe_report(me, stream) == 0
    assert sim.acl.rt.destroy_stream(stream) == 0
    assert sim.acl.rt.destroy_context(context) == 0
    finish(sim)
    assert rules(sim) == ["teardown"]


def test_a_context_with_a_live_stream_is_not_destroyed(sim: Simulator) -> None:
    context = open_device(sim)
    stream, _ = sim.acl.rt.create_stream()
    assert sim.acl.rt.destroy_context(context) == FAILURE
    assert violations(sim) == [("teardown", "acl.rt.destroy_context", FAILURE)]
    assert sim.live_resources()["contexts"] == [context]
    assert sim.acl.rt.synchronize_device() == 0, "the context is still current"
    assert sim.acl.rt.destroy_stream(stream) == 0
    assert sim.acl.rt.destroy_context(context) == 0
    finish(sim)


def _context(sim: Simulator, _model: Path) -> Callable[[], object]:
    context, _ = sim.acl.rt.create_context(0)
    return lambda: sim.acl.rt.destroy_context(context)


def _stream(sim: Simulator, _model: Path) -> Callable[[], object]:
    stream, _ = sim.acl.rt.create_stream()  # in the device's default context
    return lambda: sim.acl.rt.destroy_stream(stream)


def _memory(sim: Simulator, _model: Path) -> Callable[[], object]:
    ptr, _ = sim.acl.rt.malloc(1024, MallocPolicy.NORMAL_ONLY)
    return lambda: sim.acl.rt.free(ptr)


def _queue(sim: Simulator, _model: Path) -> Callable[[], object]:
    tdt = TdtQueueApi(sim.tdt_library)
    qid = tdt.create_queue(0)
    return lambda: sim.tdt_library.acltdtDestroyQueue(qid)


def _model(sim: Simulator, model: Path) -> Callable[[], object]:
    model_id, _ = sim.acl.mdl.load_from_file(str(model))
    return lambda: sim.acl.mdl.unload(model_id)


ACQUIRE = {
    "contexts": _context,
    "streams": _stream,
    "device memory": _memory,
    "tdt queues": _queue,
    "models": _model,
}


@pytest.mark.parametrize("kind", ACQUIRE)
def test_the_last_device_reset_waits_for_what_lives_on_the_device(
    kind: str, sim: Simulator, static4_model: Path
) -> None:
    assert sim.acl.init() == 0
    assert sim.acl.rt.set_device(0) == 0
    release = ACQUIRE[kind](sim, static4_model)
    assert sim.acl.rt.reset_device(0) == FAILURE
    assert violations(sim) == [("teardown", "acl.rt.reset_device", FAILURE)]
    assert kind in sim.violations[0].message
    assert sim.live_resources()["devices"] == [0], "the refused reset closed nothing"
    assert release() == 0
    finish(sim)


def test_only_the_last_reset_of_a_device_is_checked(sim: Simulator) -> None:
    assert sim.acl.init() == 0
    assert sim.acl.rt.set_device(0) == 0
    assert sim.acl.rt.set_device(0) == 0
    ptr, _ = sim.acl.rt.malloc(64, MallocPolicy.NORMAL_ONLY)
    assert sim.acl.rt.reset_device(0) == 0, "the device stays set"
    assert sim.acl.rt.reset_device(0) == FAILURE
    assert sim.acl.rt.free(ptr) == 0
    finish(sim)
    assert rules(sim) == ["teardown"]


def test_finalize_waits_for_every_device_reset(sim: Simulator) -> None:
    assert sim.acl.init() == 0
    assert sim.acl.rt.set_device(0) == 0
    assert sim.acl.finalize() == FAILURE
    assert violations(sim) == [("teardown", "acl.finalize", FAILURE)]
    assert sim.acl.rt.set_device(0) == 0, "still initialised"
    assert sim.acl.rt.reset_device(0) == 0
    finish(sim)


def test_a_queue_bound_to_a_loaded_model_is_not_destroyed(
    sim: Simulator, static4_model: Path
) -> None:
    context = open_device(sim)
    tdt = TdtQueueApi(sim.tdt_library)
    ins, outs = [tdt.create_queue(0)], [tdt.create_queue(0), tdt.create_queue(0)]
    model_id = WithQLoader(sim.acl, sim.acl_library).load(str(static4_model), ins, outs)
    assert sim.tdt_library.acltdtDestroyQueue(ins[0]) == FAILURE
    assert violations(sim) == [("teardown", "acltdtDestroyQueue", FAILURE)]
    assert sim.live_resources()["queues"] == [*ins, *outs]
    assert sim.acl.mdl.unload(model_id) == 0
    for qid in [*ins, *outs]:
        tdt.destroy_queue(qid)
    assert sim.acl.rt.destroy_context(context) == 0
    finish(sim)


def test_the_backend_closes_every_mode_in_order(
    make_backend: MakeBackend, static4_model: Path
) -> None:
    backend = make_backend(devices=(0, 1))
    for device in (0, 1):
        for mode in ("queue", "async", "sync"):
            backend.load(ModelSpec(f"{mode}{device}", static4_model, mode=mode, device=device))
    backend.close()
    assert backend.simulator.violations == []
    assert backend.simulator.live_resources() == {}


@pytest.mark.parametrize("mode", ["queue", "async", "sync"])
def test_a_start_up_whose_second_model_fails_half_way_leaves_nothing(
    mode: str, make_backend: MakeBackend, static4_model: Path
) -> None:
    """The daemon's start-up: the first model loads; the second is loaded, described and
    given some memory, then runs out of device memory (queue mode: its WithQ load fails
    after its queues exist). The backend is then closed with the first model still open."""
    backend = make_backend(
        sim={"with_q_load_fails_after_n_loads": 1, "device_memory_mb": MEMORY_MB[mode]}
    )
    backend.load(ModelSpec("first", static4_model, mode=mode))
    with pytest.raises(StreamerError, match=FAILING[mode]):
        backend.load(ModelSpec("second", static4_model, mode=mode))
    backend.close()
    assert backend.simulator.violations == []
    assert backend.simulator.live_resources() == {}

"""Device paths through a tensor-linked run: a backbone and its head, each with a replica on
device 0 and one on device 1, of a real onnxruntime model that nothing runs (the replicas'
devices are labels here; ``device_memory`` says the tensors stay on them). Replicas leave
rotation by ``Replica.fail``."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import ExitStack
from pathlib import Path

import pytest
from structlog.testing import capture_logs

from streamer.config import RuntimeConfig
from streamer.runtime import ModelSpec, QueueModel, open_backend
from streamer.scheduling.device_paths import DevicePaths, LinkedReplica, tensor_runs
from streamer.scheduling.replica import Replica

HEAD_GONE_ON_1 = (
    "stage 'head' has no live replica on device 1, and the tensor chain 'backbone' -> 'head' "
    "runs each batch on one device"
)


Load = Callable[[str, int], list[tuple[int, QueueModel]]]
"""``(stage name, replicas per device)`` → ``(device, model)`` on devices 0 and 1."""


@pytest.fixture
def load(short_range_model: Path) -> Iterator[Load]:
    """Loads a stage's models (named as the stage, so its replicas are ``<stage>-<i>``);
    all are closed at teardown."""
    with ExitStack() as stack:
        backend = stack.enter_context(open_backend(RuntimeConfig()))

        def stage(name: str, per_device: int) -> list[tuple[int, QueueModel]]:
            spec = ModelSpec(name, short_range_model)
            devices = [d for d in (0, 1) for _ in range(per_device)]
            return [(d, stack.enter_context(backend.load(spec))) for d in devices]

        yield stage


def split(
    load: Load, device_memory: bool = True, per_device: int = 1
) -> tuple[DevicePaths, list[Replica], list[Replica]]:
    """A backbone → head run with ``per_device`` replicas of each stage on devices 0 and 1;
    the paths and each stage's replicas, device 0's first."""
    paths = DevicePaths(["backbone", "head"], [False, True], device_memory)
    backbone = paths.replicas(load("backbone", per_device))
    head = paths.replicas(load("head", per_device))
    return paths, backbone, head


def test_runs_are_the_stages_joined_by_tensor_links() -> None:
    assert tensor_runs([False, True]) == [range(0, 2)]
    assert tensor_runs([False, False, True, True, False]) == [range(1, 4)]
    assert tensor_runs([False, True, False, True]) == [range(0, 2), range(2, 4)]
    assert tensor_runs([False, False]) == []
    assert tensor_runs([False]) == []


def test_a_replica_that_fails_takes_the_other_stage_s_replica_on_its_device_along(
    load: Load,
) -> None:
    """Before, backbone-1 went on making batches that only a head on device 1 could take:
    each failed with ``no live replica on device 1``."""
    paths, backbone, head = split(load)
    assert all(isinstance(r, LinkedReplica) for r in [*backbone, *head])
    with capture_logs() as logs:
        head[1].fail("device 1 reset")
    assert backbone[1].failed == HEAD_GONE_ON_1  # at once, on the thread that failed head-1
    assert backbone[0].failed is None and head[0].failed is None
    assert [(e["replica"], e["reason"]) for e in logs if e["event"] == "replica_failed"] == [
        ("head-1", "device 1 reset"),
        ("backbone-1", HEAD_GONE_ON_1),
    ]
    assert paths.failure() is None  # device 0 has a path


def test_an_upstream_replica_that_fails_takes_the_downstream_one_along(
    load: Load,
) -> None:
    paths, backbone, head = split(load)
    backbone[0].fail("2 executions failed in a row")
    assert head[0].failed == (
        "stage 'backbone' has no live replica on device 0, and the tensor chain "
        "'backbone' -> 'head' runs each batch on one device"
    )
    assert backbone[1].failed is None and head[1].failed is None
    assert paths.failure() is None


def test_a_downstream_replica_finishes_the_batches_it_holds_before_it_leaves(load: Load) -> None:
    """head-0 holds a batch whose inputs are already in device 0's memory: it runs it, and
    leaves rotation as that batch leaves it (failing it would lose frames that can be
    published)."""
    paths, backbone, head = split(load)
    head[0].took()
    backbone[0].fail("2 executions failed in a row")
    assert head[0].failed is None
    head[0].finished()
    assert head[0].failed == (
        "stage 'backbone' has no live replica on device 0, and the tensor chain "
        "'backbone' -> 'head' runs each batch on one device"
    )
    assert backbone[1].failed is None and head[1].failed is None
    assert paths.failure() is None


def test_with_no_device_left_with_a_path_the_run_fails_and_says_why(
    load: Load,
) -> None:
    """The break test's end state: the only live backbone on device 1, the only live head
    on device 0. Before, every later frame failed while nothing stopped the daemon."""
    paths, backbone, head = split(load)
    head[1].fail("2 executions failed in a row")
    assert paths.failure() is None
    backbone[0].fail("acl.mdl.execute_async failed")
    assert all(r.failed is not None for r in [*backbone, *head])
    assert paths.failure() == (
        "tensor chain 'backbone' -> 'head': no device has a live replica of every stage, and "
        "each batch runs on the device that holds its tensors (device 0 lacks stage "
        "'backbone' (backbone-0: acl.mdl.execute_async failed); device 1 lacks stage 'head' "
        "(head-1: 2 executions failed in a row))"
    )


def test_a_device_keeps_its_path_while_a_replica_of_each_stage_lives_there(
    load: Load,
) -> None:
    paths, backbone, head = split(load, per_device=2)
    assert [r.device for r in head] == [0, 0, 1, 1]
    head[2].fail("device 1 reset")
    assert [r.failed for r in backbone] == [None] * 4  # head-3 still serves device 1
    head[3].fail("device 1 reset")
    assert [r.failed for r in backbone] == [None, None, HEAD_GONE_ON_1, HEAD_GONE_ON_1]
    assert paths.failure() is None


def test_without_device_memory_any_replica_takes_any_batch(load: Load) -> None:
    """onnxruntime hands host arrays on: no run is kept to a device."""
    paths, backbone, head = split(load, device_memory=False)
    assert not any(isinstance(r, LinkedReplica) for r in [*backbone, *head])
    head[1].fail("x")
    backbone[0].fail("y")
    assert backbone[1].failed is None and head[0].failed is None
    assert paths.failure() is None


def test_a_stage_outside_every_run_keeps_its_replicas(load: Load) -> None:
    """A detector that reads the frame, then backbone → head: the detector is in no run."""
    paths = DevicePaths(["detector", "backbone", "head"], [False, False, True], True)
    detector, backbone, head = (
        paths.replicas(load(n, 1)) for n in ("detector", "backbone", "head")
    )
    assert not any(isinstance(r, LinkedReplica) for r in detector)
    detector[1].fail("device 1 reset")
    assert backbone[1].failed is None and head[1].failed is None
    head[1].fail("device 1 reset")
    assert backbone[1].failed == HEAD_GONE_ON_1 and detector[0].failed is None

"""What the benchmark reads of the machine around a run (``streamer.bench.machine``): the CPU
other processes used, and the CPU left idle, in cores."""

from __future__ import annotations

import os

import pytest

from streamer.bench.machine import CpuSnapshot, idle_cores, machine_idle_s, others_cores


def test_idle_cores_are_idle_cpu_seconds_over_the_wall_time() -> None:
    assert idle_cores(30.0, 31.0, 2.0) == 0.5
    assert idle_cores(30.0, 30.0, 2.0) == 0.0


@pytest.mark.parametrize(
    ("start", "end", "wall"),
    [(30.0, 31.0, 0.0), (-1.0, 31.0, 2.0), (30.0, -1.0, 2.0)],
    ids=["no wall time", "unreadable at the start", "unreadable at the end"],
)
def test_idle_that_cannot_be_read_is_none_not_a_number(
    start: float, end: float, wall: float
) -> None:
    assert idle_cores(start, end, wall) is None


def test_others_are_the_machine_s_busy_time_less_ours() -> None:
    before = CpuSnapshot(wall_s=100.0, machine_busy_s=50.0, ours_s=20.0)
    after = CpuSnapshot(wall_s=102.0, machine_busy_s=53.0, ours_s=22.5)
    assert others_cores(before, after) == 0.25  # 3 s busy, 2.5 s of it ours, in 2 s


def test_the_machine_s_own_counters_are_read() -> None:
    before, busy = machine_idle_s(), CpuSnapshot.take()
    sum(i * i for i in range(200_000))  # some CPU of our own between the readings
    after, busy_after = machine_idle_s(), CpuSnapshot.take()
    assert after >= before > 0
    assert busy_after.machine_busy_s >= busy.machine_busy_s > 0
    assert busy_after.ours_s >= busy.ours_s > 0
    idle = idle_cores(before, after, busy_after.wall_s - busy.wall_s)
    assert idle is None or 0 <= idle <= (os.cpu_count() or 1) + 1  # 10 ms ticks

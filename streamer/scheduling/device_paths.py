"""Device paths through a chain's tensor-linked runs, on a backend with device memory.

A *tensor-linked run* is a stage and the ``tensor`` stages after it
(:mod:`streamer.scheduling.tensor_link`). On ACL a stage's outputs stay in the memory of the
device that made them, so each batch goes down the whole run on one device: device ``d`` has
a *path* through the run while every stage of the run has a live replica on ``d``.

When a replica leaves rotation (:meth:`~streamer.scheduling.replica.Replica.fail`) and its
device loses its path, the replicas the run still has on that device leave rotation too
(:meth:`DevicePaths.prune`, on the thread that failed the replica). One upstream of the
missing stage leaves at once: it would make batches that no replica can take on, each
failing ``no live replica on device d``; the batches it holds, with host inputs, run again
on a device with a path (the dispatcher's retry), and the dispatchers send every later batch
there. One downstream of it gets no new batch, so it first finishes those it holds (their
inputs are already in its device's memory) and leaves once it holds none. A run with no
device left that has a path cannot run at all: :meth:`DevicePaths.failure` says why, and
the pipeline stops.

On onnxruntime the tensors handed on are host arrays that any replica takes: no run is kept
to a device, and nothing here acts (``device_memory`` False).
"""

from __future__ import annotations

import threading
from collections.abc import Sequence

from streamer.runtime.base import QueueModel
from streamer.scheduling.replica import Replica

__all__ = ["DevicePaths", "LinkedReplica", "tensor_runs"]


def tensor_runs(tensor_fed: Sequence[bool]) -> list[range]:
    """The stage indices of each run of two or more stages joined by ``tensor`` links.

    Args:
        tensor_fed: per stage in chain order, whether it takes the stage before it through
            the ``tensor`` adapter (stage 0 never does).

    Returns:
        The runs in chain order, each a range of consecutive stage indices.
    """
    runs: list[range] = []
    start = 0
    for index in range(1, len(tensor_fed) + 1):
        if index == len(tensor_fed) or not tensor_fed[index]:
            if index - start > 1:
                runs.append(range(start, index))
            start = index
    return runs


class DevicePaths:
    """Which devices still have a path through each tensor-linked run of one chain; takes
    the replicas of a device without one out of rotation.

    Thread-safe: any replica's threads (through :class:`LinkedReplica`) call :meth:`prune`,
    one at a time, the control thread calls :meth:`failure`.

    Args:
        names: the stages' names, in chain order.
        tensor_fed: per stage, whether it takes the stage before it through the ``tensor``
            adapter.
        device_memory: the backend keeps the tensors a stage hands on in device memory
            (:attr:`~streamer.runtime.base.Backend.device_memory`); without it no run is
            kept to a device.
    """

    def __init__(
        self, names: Sequence[str], tensor_fed: Sequence[bool], device_memory: bool
    ) -> None:
        self._names = list(names)
        self._runs = tensor_runs(tensor_fed) if device_memory else []
        self._replicas: list[list[Replica]] = []
        self._lock = threading.RLock()  # a prune fails replicas, whose fail prunes again
        self._cut: set[Replica] = set()  # replicas that left rotation here, for lack of a path
        self.waiting = False
        """A replica downstream of a stage gone from its device still finishes the batches it
        holds, and leaves rotation once it holds none (:meth:`LinkedReplica.finished`)."""

    def replicas(self, models: Sequence[tuple[int, QueueModel]]) -> list[Replica]:
        """Make the replicas of the next stage in chain order, one per ``(device, model)``:
        :class:`LinkedReplica` objects for a stage in a run, plain replicas otherwise. Call
        once per stage, before any replica can fail."""
        stage = len(self._replicas)
        linked = any(stage in run for run in self._runs)
        replicas = [
            LinkedReplica(i, device, model, self) if linked else Replica(i, device, model)
            for i, (device, model) in enumerate(models)
        ]
        self._replicas.append(replicas)
        return replicas

    def prune(self) -> None:
        """Take out of rotation every live replica of a run on a device where a stage of the
        run has no live replica, with a reason naming that stage and the device; one
        downstream of that stage only once it holds no batch (:attr:`waiting` until then).
        Any thread. Idempotent: replicas never come back, so a device without a path stays
        so."""
        with self._lock:
            self.waiting = False
            for run in self._runs:
                for device in self._devices(run):
                    lacking = self._lacking(run, device)
                    if lacking:
                        self._cut_off(run, device, lacking)

    def failure(self) -> str | None:
        """Why a run cannot go on: no device has a live replica of each of its stages. The
        message names the run's stages and, per device, the stages it lacks and why their
        replicas there failed; None while every run has a device with a path."""
        for run in self._runs:
            devices = self._devices(run)
            if all(self._lacking(run, device) for device in devices):
                why = "; ".join(self._causes(run, device) for device in devices)
                return (
                    f"tensor chain {self._chain(run)}: no device has a live replica of every "
                    f"stage, and each batch runs on the device that holds its tensors ({why})"
                )
        return None

    def _devices(self, run: range) -> list[int]:
        """The devices the run's stages have replicas on, in order."""
        return sorted({r.device for stage in run for r in self._replicas[stage]})

    def _lacking(self, run: range, device: int) -> list[int]:
        """The run's stages with no live replica on ``device``."""
        return [
            stage
            for stage in run
            if not any(r.device == device and r.failed is None for r in self._replicas[stage])
        ]

    def _cut_off(self, run: range, device: int, lacking: list[int]) -> None:
        """Fail the run's live replicas on ``device``, which lacks the ``lacking`` stages:
        those downstream of one of them only once they hold no batch."""
        names = ", ".join(repr(self._names[stage]) for stage in lacking)
        which = f"stage {names} has" if len(lacking) == 1 else f"stages {names} have"
        reason = (
            f"{which} no live replica on device {device}, and the tensor chain "
            f"{self._chain(run)} runs each batch on one device"
        )
        for stage in run:
            for replica in self._replicas[stage]:
                if replica.device != device or replica.failed is not None:
                    continue
                if stage > lacking[0]:
                    self.waiting = True  # first: a last batch finishing meanwhile prunes again
                    if replica.in_flight:
                        continue
                replica.fail(reason)
                if replica.failed is reason:  # not failed meanwhile for a cause of its own
                    self._cut.add(replica)

    def _causes(self, run: range, device: int) -> str:
        """The stages ``device`` lacks for a cause of their own (not for a lack of a path),
        each with its replicas there and why they failed."""
        with self._lock:
            cut = set(self._cut)
        causes = []
        for stage in self._lacking(run, device):
            failed = [
                f"{r.name}: {r.failed}"
                for r in self._replicas[stage]
                if r.device == device and r not in cut
            ]
            if failed:
                causes.append(f"stage {self._names[stage]!r} ({', '.join(failed)})")
        return f"device {device} lacks " + " and ".join(causes)

    def _chain(self, run: range) -> str:
        """The run's stages for messages: ``'backbone' -> 'head'``."""
        return " -> ".join(repr(self._names[stage]) for stage in run)


class LinkedReplica(Replica):
    """A replica of a stage in a tensor-linked run: when it leaves rotation, so do the
    replicas of the run on its device that lose their path (:meth:`DevicePaths.prune`), and
    one left to finish its batches leaves as it finishes the last.

    Args:
        index, device, model: as for :class:`~streamer.scheduling.replica.Replica`.
        paths: the chain's device paths.
    """

    def __init__(self, index: int, device: int, model: QueueModel, paths: DevicePaths) -> None:
        super().__init__(index, device, model)
        self._paths = paths

    def fail(self, reason: str) -> None:
        """Take the replica out of rotation (:meth:`Replica.fail`), then the replicas of the
        run on its device if that device has no path left; any thread."""
        super().fail(reason)
        self._paths.prune()

    def finished(self) -> None:
        """A batch left it (:meth:`Replica.finished`); the last one a replica was left to
        finish takes it out of rotation. Its threads, or the dispatcher's."""
        super().finished()
        if self._paths.waiting and self.in_flight == 0:
            self._paths.prune()

"""Routing frames through a chain of model stages.

Stage 0 takes frames from admission. When a frame leaves a stage (its batch came back, or it
failed, or it had no items there), the router sends it on: to egress after the last stage or
on error, else into the next stage. A *single* stage runs the frame itself (its tensor); an
*item* stage (:mod:`streamer.vision.stages`) runs several items per frame (pyramid gears,
crops of the upstream detections), made here and batched across frames; when the last item
of a frame is back the stage's ``finish`` folds them into the frame's results. A frame with
no items for a stage (no upstream detection) skips it, and is still published once. An item
that fails fails its frame; every failure in a stage names it once, its detail starting
``stage <name>: `` (:func:`stage_error`). A *tensor* stage
(:mod:`streamer.scheduling.tensor_link`) takes each finished batch of the stage before it
whole, its frames' ``handover`` holding the inputs; the batch's failed frames go to egress.

Thread-safe: the batcher and dequeue threads of every stage call :meth:`ChainRouter.put`.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from streamer.errors import FrameError, Reason
from streamer.frames import Batch, Frame
from streamer.vision.stages import ItemStage

__all__ = [
    "ChainRouter",
    "ChainStage",
    "StageExit",
    "make_items",
    "stage_error",
    "store_outputs",
]


def stage_error(stage: str, error: FrameError) -> FrameError:
    """``error`` as a frame's error in ``stage``: its detail starts ``stage <stage>: ``
    exactly once (an error from one of the stage's replicas already does)."""
    prefix = f"stage {stage}: "
    if error.detail.startswith(prefix):
        return error
    return FrameError(error.reason, prefix + error.detail)


@dataclass
class ChainStage:
    """What the router needs of one stage.

    Attributes:
        name: the stage's (model's) name.
        items: its item logic, or None for a single stage (the frame is the item).
        inbox: where its batcher takes items from (stage 0's is fed by admission instead).
        tensor: it takes the previous stage's batches through the ``tensor`` adapter.
    """

    name: str
    items: ItemStage | None
    inbox: Any
    tensor: bool = False


class ChainRouter:
    """Moves finished frames to the next stage or to egress.

    Args:
        stages: the chain, in order.
        results: egress's queue.
        keep_images: frames keep their decoded image until they leave the chain (a later
            stage crops from it).
    """

    def __init__(self, stages: Sequence[ChainStage], results: Any, keep_images: bool) -> None:
        self._stages = list(stages)
        self._results = results
        self._keep_images = keep_images
        self._lock = threading.Lock()

    def exit(self, index: int) -> StageExit:
        """The outbox of stage ``index``'s threads."""
        return StageExit(self, index)

    def after_stage(self, index: int, item: Any) -> None:
        """Take what stage ``index`` finished: a batch, or a marker for egress."""
        if not isinstance(item, Batch):
            self._results.put(item)
            return
        if index == len(self._stages) - 1 and not any(f.parent for f in item.frames):
            self._release_images(item.frames)
            self._results.put(item)  # the whole batch, as the metrics like it
            return
        if index + 1 < len(self._stages) and self._stages[index + 1].tensor:
            self._hand_over(index + 1, item)
            return
        for frame in item.frames:
            if frame.parent is not None:
                self._item_done(index, frame)
            elif frame.children is not None and not frame.children:
                frame.children = None
                self.route(frame, index + 1)
            else:
                self.route(frame, index + 1)

    def route(self, frame: Frame, index: int) -> None:
        """Send ``frame`` into stage ``index`` (or egress past the last stage)."""
        while index < len(self._stages) and frame.error is None:
            stage = self._stages[index]
            if stage.items is None:
                raise AssertionError("single and tensor stages take batches, not one frame")
            if self._start_items(frame, stage, index):
                return
            index += 1
        self._release_images([frame])
        self._results.put(Batch([frame]))

    def _hand_over(self, index: int, batch: Batch) -> None:
        """Stage ``index`` takes ``batch`` as it is (the ``tensor`` adapter): its frames with
        a handover, in row order, with its rows; the others failed and go to egress (any
        handover they hold is released)."""
        good = [f for f in batch.good if f.error is None and f.handover is not None]
        kept = {id(f) for f in good}
        failed = [f for f in batch.frames if id(f) not in kept]
        for frame in failed:
            if frame.handover is not None:
                frame.handover.release()
                frame.handover = None
        if failed:
            self._release_images(failed)
            self._results.put(Batch(failed))
        if good:
            now = time.monotonic_ns()
            for frame in good:
                frame.prepared_at_ns = now  # ready for this stage's batcher: its wait starts
            self._stages[index].inbox.put(Batch(good, list(good), batch.rows))

    def _start_items(self, frame: Frame, stage: ChainStage, index: int) -> bool:
        """Queue the frame's items for ``stage``; False when it has none (skip the stage)."""
        assert stage.items is not None and frame.image is not None
        try:
            tensors, transforms = stage.items.items(frame.image, frame.results)
        except FrameError as error:
            frame.fail(error)
            return False
        if not tensors:
            return False
        frame.children = make_items(frame, tensors, transforms)
        frame.outstanding = len(frame.children)
        for child in frame.children:
            stage.inbox.put(child)
        return True

    def _item_done(self, index: int, item: Frame) -> None:
        parent = item.parent
        assert parent is not None
        with self._lock:
            parent.outstanding -= 1
            last = parent.outstanding == 0
        if last:
            self._finish(parent, self._stages[index])
            self.route(parent, index + 1)

    def _finish(self, frame: Frame, stage: ChainStage) -> None:
        items, frame.children = frame.children or [], None
        failed = next((i.error for i in items if i.error is not None), None)
        started = [i.infer_start_ns for i in items if i.infer_start_ns]
        if started:
            frame.infer_start_ns = frame.infer_start_ns or min(started)
            frame.infer_end_ns = max(i.infer_end_ns for i in items)
        frame.model = stage.name
        if failed is not None:
            frame.fail(stage_error(stage.name, failed))
            return
        assert stage.items is not None
        outputs = [i.results["outputs"] for i in items]
        try:
            frame.results = stage.items.finish(outputs, [i.transform for i in items], frame.results)
        except FrameError as error:
            frame.fail(stage_error(stage.name, error))
        except Exception as exc:  # a postprocessing bug fails this frame, not the daemon
            detail = f"{type(exc).__name__}: {exc}"
            frame.fail(stage_error(stage.name, FrameError(Reason.POSTPROCESS_FAILED, detail)))

    def _release_images(self, frames: Sequence[Frame]) -> None:
        if self._keep_images:
            for frame in frames:
                frame.image = None


def make_items(
    frame: Frame, tensors: Sequence[Any], transforms: Sequence[Any], clock_ns: int | None = None
) -> list[Frame]:
    """Item frames of ``frame``: its source and seq, their own tensor and transform, never
    published themselves. Their batching deadline (``received_at_ns``) runs from
    ``clock_ns`` (default: now); they are ready for their batcher now (``prepared_at_ns``)."""
    now = time.monotonic_ns()
    clock = now if clock_ns is None else clock_ns
    items = []
    for tensor, transform in zip(tensors, transforms, strict=True):
        item = Frame(frame.source, frame.seq, clock, frame.received_at, prepared_at_ns=now)
        item.tensor, item.transform, item.parent = tensor, transform, frame
        items.append(item)
    return items


def store_outputs(outputs: Sequence[Any], items: list[Frame]) -> None:
    """The postprocess of an item stage: keep each item's rows for the stage's ``finish``."""
    for row, item in enumerate(items):
        item.results = {"outputs": tuple(output[row] for output in outputs)}


class StageExit:
    """The outbox of one stage's threads: ``put`` routes through the chain router."""

    def __init__(self, router: ChainRouter, index: int) -> None:
        self._router = router
        self._index = index

    def put(self, item: Any) -> None:
        self._router.after_stage(self._index, item)

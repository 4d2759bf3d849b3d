"""Replacing the running chain by a reloaded one without losing a frame (SIGHUP).

The whole chain is replaced, whatever changed in it (a model file, a plug-in, the number of
stages or replicas), and the in-band marker is :data:`~streamer.frames.STOP` itself:

1. the new chain is loaded and its threads started, all but its first batcher; a chain that
   fails to load or start is released and the old one goes on (the pipeline logs why);
2. under the pipeline's submit lock, so that every frame admitted before the marker is
   prepared for the old chain's first stage and every frame after it for the new one's, the
   new chain goes into service and STOP is queued in admission;
3. the old first batcher takes STOP: it flushes what it holds and stops its replicas after
   their last batch. Once it has ended, the new first batcher starts and takes every frame
   after the marker (:func:`hand_over_admission`);
4. the old chain drains stage by stage as at shutdown, its results going to the shared
   egress (which keeps each source in order), and its models are closed
   (:func:`retire`).

Frames before the marker thus finish on the old chain and frames after it run on the new one.
"""

from __future__ import annotations

import time

import structlog

from streamer.scheduling.chain_run import ChainRun

__all__ = ["hand_over_admission", "retire"]

_log = structlog.get_logger(__name__)


def hand_over_admission(old: ChainRun, new: ChainRun, timeout_s: float) -> None:
    """Step 3: wait for the old first batcher to take the marker and end, then start the
    new one. An old batcher still running after ``timeout_s`` seconds (its models are stuck)
    is aborted with its chain, so the new chain starts anyway.

    Raises:
        StreamerError: the new first batcher failed to start.
    """
    old.first_batcher.join(timeout_s)
    if old.first_batcher.is_alive():
        _log.error("reload_swap_stuck", stage=old.stages[0].name, timeout_s=timeout_s)
        old.abort.set()
        old.first_batcher.join(timeout_s)
    new.launch_first_batcher(timeout_s)


def retire(old: ChainRun, timeout_s: float) -> bool:
    """Step 4: drain the old chain within ``timeout_s`` seconds and close its models.

    Returns:
        True when it drained and was closed; False when it did not drain in time (it is
        aborted; its models are left for the pipeline to close after its threads ended).
    """
    if old.drain(time.monotonic() + timeout_s):
        old.close()
        return True
    _log.error("reload_swap_stuck", stages=[s.name for s in old.stages], timeout_s=timeout_s)
    old.abort.set()
    return False

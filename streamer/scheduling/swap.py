"""Replacing the running chain by a reloaded one without losing a frame (SIGHUP).

The whole chain is replaced, whatever changed in it (a model file, a plug-in, the number of
stages or replicas), and the in-band marker is :data:`~streamer.frames.STOP` itself:

1. the new chain is loaded and its threads started, all but its first batcher; a chain that
   fails to load or start is released and the old one goes on (the pipeline logs why);
2. under the admission queue's lock, once the frames being prepared are queued, the chain
   frames are prepared for is switched and STOP is queued (``AdmissionQueue.put_marker``
   with a switch): every frame before the marker was prepared for the old chain's first
   stage, every frame after it for the new one's;
3. the old chain drains stage by stage as at shutdown, its results going to the shared
   egress, and its models are closed (:func:`retire`); one that does not drain in time is
   given up, and the frames still queued before its marker are dropped (``shutdown``) with
   the marker (``AdmissionQueue.discard_through``): they were prepared for it;
4. only then does the new first batcher start and take the frames after the marker.

Frames before the marker thus finish on the old chain and frames after it run on the new one,
and no result of the new chain can overtake one of the old: each source stays in order
without leaning on egress's bounded reorder window. The price is a pause of one drain (the
old chain's latency) at each reload, during which admission fills and ``block`` ingresses
push back.
"""

from __future__ import annotations

import time

import structlog

from streamer.scheduling.chain_run import ChainRun

__all__ = ["retire"]

_log = structlog.get_logger(__name__)


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
    old.give_up()
    return False

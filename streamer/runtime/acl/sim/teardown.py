"""Rule "teardown": resources are released in the documented order, newest first.

The order (reference/pyacl.md §6 "Teardown" and "Queue mode"; seeds, the queue-mode sample
and the async sample of "模型异步推理" / "接口调用流程", C and Python alike): model resources
first (``acl.mdl.unload``, ``destroy_desc``, ``rt.free`` of the data buffers,
``destroy_data_buffer``, ``destroy_dataset``; queue mode: ``aclmdlUnload`` → destroy the
description → ``acltdtDestroyQueue`` → ``acltdtDestroyQueueAttr``), then
``rt.destroy_stream`` → ``rt.destroy_context`` → ``rt.reset_device`` → ``acl.finalize``; async
mode ends its callbacks before that: ``synchronize_stream`` → ``unsubscribe_report`` → stop
the callback thread, and only then ``destroy_stream`` (§6 "Async with callbacks", step 4; the
async samples, C and Python, release the runtime resources after ``unsubscribe_report`` and
joining the thread).

The simulator refuses a call that releases a resource while what the documents release before
it is still alive; the resource stays alive (the call has no effect) and the refusal is a
violation of rule ``teardown``:

- ``acl.rt.destroy_stream`` of a stream a thread is still subscribed to (``subscribe_report``
  without ``unsubscribe_report``): ``ACL_ERROR_RT_STREAM_SUBSCRIBE`` (107011, "error
  subscribe stream" in RT ``include/external/acl/error_codes/rt_error_codes.h``; the error-code
  table of the CANN docs gives it as a stream not subscribed or subscribed twice), the
  runtime's code for a stream whose subscription state does not allow the call.
- ``acl.rt.destroy_context`` of a context in which a stream was created and not destroyed
  (stream → context).
- ``acl.rt.reset_device`` that closes the device for the last time (``set_device`` is
  reference counted) while explicit contexts, streams, loaded models, ``acl.rt.malloc``
  memory or tdt queues of that device are alive (model resources and stream → context →
  device). A tdt queue belongs to the device of the context current when it was created (the
  queue-mode sample creates its queues after ``aclrtCreateContext``); one created with no
  context current is not counted.
- ``acl.finalize`` while a device is still set (device → finalize).
- ``acltdtDestroyQueue`` of a queue still bound to a loaded model (``aclmdlUnload`` → destroy
  queues).

The documents give no code for the last four; the simulator returns ``ACL_ERROR_FAILURE``
(500001), the generic failure it already returns for the other documented rules without a
code (S13, S28): the arguments are valid handles, so an "invalid parameter" code would
mislead. What the documents do not order is not checked: the order of ``unload`` and
dataset destruction differs between the samples (§6); and while the samples unload their one
model before destroying their one stream, no document says a stream must outlive the models
that ran on it (streamer destroys a model's own stream, once synchronised, before unloading
the model), so only the device reset waits for both.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from streamer.runtime.acl.constants import AclCode
from streamer.runtime.acl.sim.binding import SimError
from streamer.runtime.acl.sim.memory import MemoryKind

if TYPE_CHECKING:
    from streamer.runtime.acl.sim.simulator import Simulator

__all__ = [
    "check_destroy_context",
    "check_destroy_queue",
    "check_destroy_stream",
    "check_finalize",
    "check_reset_device",
]

RULE = "teardown"


def check_destroy_stream(sim: Simulator, stream: int) -> None:
    """Raises: SimError: a thread is still subscribed to ``stream``."""
    if sim.reports.subscribed(stream):
        raise SimError(
            AclCode.ERROR_RT_STREAM_SUBSCRIBE,
            RULE,
            f"stream {stream:#x} is still subscribed: unsubscribe_report before destroy_stream",
        )


def check_destroy_context(sim: Simulator, context: int) -> None:
    """Raises: SimError: a stream created in ``context`` is alive."""
    streams = [s.handle for s in sim.live_streams() if s.context == context]
    if streams:
        raise SimError(
            AclCode.ERROR_FAILURE,
            RULE,
            f"context {context:#x} still has streams {_hex(streams)}: destroy_stream first",
        )


def check_reset_device(sim: Simulator, device: int) -> None:
    """Raises: SimError: this reset closes ``device`` while resources on it are alive."""
    if sim.devices.open_count(device) != 1:
        return  # not the last reset (or not set: the device check refuses it)
    alive = {
        "contexts": sim.devices.explicit_contexts(device),
        "streams": [s.handle for s in sim.live_streams() if s.device == device],
        "models": sim.models.loaded_on(device),
        "device memory": [
            a.start for a in sim.memory.live() if a.kind == MemoryKind.DEVICE and a.device == device
        ],
        "tdt queues": sim.queues.on_device(device),
    }
    left = {kind: items for kind, items in alive.items() if items}
    if left:
        what = "; ".join(f"{kind} {_hex(items)}" for kind, items in left.items())
        raise SimError(
            AclCode.ERROR_FAILURE,
            RULE,
            f"device {device} reset with {what} still alive: release them first",
        )


def check_finalize(sim: Simulator) -> None:
    """Raises: SimError: a device is still set."""
    devices = sim.devices.live()["devices"]
    if devices:
        raise SimError(
            AclCode.ERROR_FAILURE,
            RULE,
            f"devices {devices} are still set: reset_device before acl.finalize",
        )


def check_destroy_queue(sim: Simulator, qid: int) -> None:
    """Raises: SimError: queue ``qid`` is bound to a loaded model."""
    model = sim.queues.bound_model(qid)
    if model is not None:
        raise SimError(
            AclCode.ERROR_FAILURE,
            RULE,
            f"queue {qid} is bound to loaded model {model}: unload it before destroying queues",
        )


def _hex(items: list[int]) -> str:
    return "[" + ", ".join(f"{item:#x}" if item > 0xFFFF else str(item) for item in items) + "]"

"""The pyACL backend: Ascend NPUs behind the queue-bound model contract (DESIGN.md §4).

Module map::

    backend.py        AclBackend: options, runtime, mode choice, model loading
    device.py         acl.init / set_device / context / stream / run mode, and teardown
    options.py        [runtime.options] validation (pydantic, unknown keys rejected)
    constants.py      ACL numbers (pyACL exports none); errors.py: codes → AclError
    teardown.py       reverse-order release on every exit path
    pool.py           secondary allocation from large acl.rt.malloc blocks
    allocators.py     device / host blocks; transfer.py: copies by run mode
    loaded.py         model id + description; description.py: → ModelInfo
    gears.py          dynamic kind, each batch's gear, its setter, real output dims
    dataset.py        aclmdlDataset + aclDataBuffer
    tdt.py            tdt queue C API through ctypes; withq.py: aclmdlLoadFromFileWithQ
    queue_binding.py  a queue-mode model and its tdt queues, loaded, released, reloaded
    report.py         the process_report callback thread (async mode)
    model_base.py     what the modes share; model_queue.py / model_async.py / model_sync.py
    operators.py      NMS / top-k as acl.op single operators; single_op.py: one dynamic-shape
                      execution (infer_shape first); op_shapes.py: tensor descs, dims rules
    aipp_static.py    static AIPP (ATC aipp_op); aipp_dynamic.py: dynamic AIPP config,
                      parameters, plan; aipp_rules.py: the combination rules; aipp_set.py:
                      the aclmdlAIPP; aipp_load.py: dynamic AIPP at model load
    sim/              the API-faithful simulator behind backend = "acl-sim"

Nothing here imports ``acl`` at import time: :func:`~streamer.runtime.acl.backend.import_acl`
does, when the ``acl`` backend is opened.
"""

from __future__ import annotations

from streamer.runtime.acl.backend import AclBackend
from streamer.runtime.acl.errors import AclError

__all__ = ["AclBackend", "AclError"]

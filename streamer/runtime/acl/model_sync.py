"""Sync mode: ``acl.mdl.execute`` in the enqueue thread (simplest; for debugging).

``acl.mdl.execute`` returns when the outputs are written (SAM
``python/common/acllite/acllite_model.py``). A non-zero code fails that batch only; the next
batch runs normally.

pyACL calls ``aclmdlExecute`` without releasing the GIL (RT ``python/pyACL/mdl/mdl_wrap.cpp``;
only ``synchronize_stream``, ``synchronize_stream_with_timeout``, ``process_report`` and
``synchronize_device`` release it): every other Python thread of the daemon stops for the
length of each execution, and while one hangs nothing runs, so no close can happen during it
and no timeout can abandon it (the systemd watchdog ends such a process). Production configs
use queue or async mode; ``auto`` never picks sync. The simulator does not hold the GIL, so
there the other threads go on.
"""

from __future__ import annotations

import time

from streamer.runtime.acl.errors import AclError, code_name
from streamer.runtime.acl.model_base import inference_error
from streamer.runtime.acl.model_dataset import Batch, DatasetModel

__all__ = ["SyncModel"]


class SyncModel(DatasetModel):
    """Executes each batch synchronously in :meth:`enqueue`."""

    mode = "sync"

    def _submit(self, batch: Batch) -> None:
        model_id = self._loaded.model_id
        ret = self._acl.mdl.execute(model_id, batch.input_dataset, batch.output_dataset)
        if ret:
            batch.fail(inference_error(str(AclError(ret, code_name(ret), "acl.mdl.execute"))))
        else:
            batch.end_ns = time.monotonic_ns()
            batch.done = True
        self._push(batch)

    def _stop(self) -> bool:
        self._release_in_flight()
        return True

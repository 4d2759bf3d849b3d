"""Sync mode: ``acl.mdl.execute`` in the enqueue thread (simplest; for debugging).

``acl.mdl.execute`` returns when the outputs are written (SAM
``python/common/acllite/acllite_model.py``). A non-zero code fails that batch only; the next
batch runs normally.
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
        ret = self._acl.mdl.execute(
            self._loaded.model_id, batch.input_dataset, batch.output_dataset
        )
        if ret:
            batch.fail(inference_error(str(AclError(ret, code_name(ret), "acl.mdl.execute"))))
        else:
            batch.end_ns = time.monotonic_ns()
            batch.done = True
        self._push(batch)

    def _stop(self) -> None:
        self._release_in_flight()

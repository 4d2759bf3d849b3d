"""Sync mode: ``acl.mdl.execute`` in the enqueue thread (simplest; for debugging).

``acl.mdl.execute`` returns when the outputs are written (SAM
``python/common/acllite/acllite_model.py``). A non-zero code fails that batch only; the next
batch runs normally. A model closed while its enqueue thread is still inside
``acl.mdl.execute`` (a hung execution the pipeline gave up on) is abandoned, not released.
"""

from __future__ import annotations

import time

from streamer.runtime.acl.errors import AclError, code_name
from streamer.runtime.acl.model_base import ModelParts, inference_error
from streamer.runtime.acl.model_dataset import Batch, DatasetModel

__all__ = ["SyncModel"]


class SyncModel(DatasetModel):
    """Executes each batch synchronously in :meth:`enqueue`."""

    mode = "sync"

    def __init__(self, parts: ModelParts, max_in_flight: int) -> None:
        super().__init__(parts, max_in_flight)
        self._executing = False

    def _submit(self, batch: Batch) -> None:
        self._executing = True
        try:
            ret = self._acl.mdl.execute(
                self._loaded.model_id, batch.input_dataset, batch.output_dataset
            )
        finally:
            self._executing = False
        if ret:
            batch.fail(inference_error(str(AclError(ret, code_name(ret), "acl.mdl.execute"))))
        else:
            batch.end_ns = time.monotonic_ns()
            batch.done = True
        self._push(batch)

    def _stop(self) -> bool:
        if self._executing:  # the enqueue thread is still inside acl.mdl.execute
            return False
        self._release_in_flight()
        return True

"""``aclmdlDataset`` and its ``aclDataBuffer`` entries.

Build (SAM ``python/common/acllite/acllite_model.py``): ``acl.mdl.create_dataset``, then per
tensor ``acl.create_data_buffer(ptr, size)`` and ``acl.mdl.add_dataset_buffer``. Release: every
data buffer (``acl.destroy_data_buffer``), then ``acl.mdl.destroy_dataset``; the memory the
buffers point at belongs to the caller (the memory pool).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from streamer.runtime.acl.errors import check_handle, check_ret
from streamer.runtime.acl.teardown import Teardown

__all__ = ["create_dataset"]


def create_dataset(acl: Any, buffers: Sequence[tuple[int, int]], teardown: Teardown) -> int:
    """A dataset over ``buffers`` (``(address, size in bytes)`` each, model index order).

    Releases are pushed on ``teardown`` (buffers are released before the dataset).

    Raises:
        AclError: a call failed (what was created is released by ``teardown``).
    """
    dataset = check_handle(acl.mdl.create_dataset(), "acl.mdl.create_dataset")
    teardown.push("acl.mdl.destroy_dataset", acl.mdl.destroy_dataset, dataset)
    for ptr, size in buffers:
        buffer = check_handle(acl.create_data_buffer(ptr, size), "acl.create_data_buffer")
        teardown.push("acl.destroy_data_buffer", acl.destroy_data_buffer, buffer)
        _, ret = acl.mdl.add_dataset_buffer(dataset, buffer)
        check_ret(ret, "acl.mdl.add_dataset_buffer")
    return dataset

"""``aclmdlDataset`` and its ``aclDataBuffer`` entries.

Build (SAM ``python/common/acllite/acllite_model.py``): ``acl.mdl.create_dataset``, then per
tensor ``acl.create_data_buffer(ptr, size)`` and ``acl.mdl.add_dataset_buffer``. Release: every
data buffer (``acl.destroy_data_buffer``), then ``acl.mdl.destroy_dataset``; the memory the
buffers point at belongs to the caller (the memory pool). A data buffer of another dataset
(the previous model's output in a ``tensor`` chain) can be added as it is: it is not
destroyed here, its creator destroys it after this dataset
(:mod:`~streamer.runtime.acl.device_tensor`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from streamer.runtime.acl.errors import check_handle, check_ret
from streamer.runtime.acl.teardown import Teardown

__all__ = ["create_dataset"]


def create_dataset(
    acl: Any, buffers: Sequence[tuple[int, int] | int], teardown: Teardown
) -> tuple[int, list[int]]:
    """A dataset over ``buffers`` (model index order): ``(address, size in bytes)`` each, for
    which a data buffer is created, or an existing data buffer handle, added as it is.

    Releases are pushed on ``teardown`` (the created buffers are released before the
    dataset).

    Returns:
        The dataset handle and its data buffer handles, in order.

    Raises:
        AclError: a call failed (what was created is released by ``teardown``).
    """
    dataset = check_handle(acl.mdl.create_dataset(), "acl.mdl.create_dataset")
    teardown.push("acl.mdl.destroy_dataset", acl.mdl.destroy_dataset, dataset)
    handles = []
    for entry in buffers:
        if isinstance(entry, int):
            buffer = entry
        else:
            buffer = check_handle(acl.create_data_buffer(*entry), "acl.create_data_buffer")
            teardown.push("acl.destroy_data_buffer", acl.destroy_data_buffer, buffer)
        _, ret = acl.mdl.add_dataset_buffer(dataset, buffer)
        check_ret(ret, "acl.mdl.add_dataset_buffer")
        handles.append(buffer)
    return dataset, handles

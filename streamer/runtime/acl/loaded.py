"""A loaded model id and its description, released as the samples do.

Load sequence (SAM ``python/common/acllite/acllite_model.py``; seeds, queue-mode sample):
``load`` → ``acl.mdl.create_desc`` → ``acl.mdl.get_desc``. Release: ``acl.mdl.unload`` then
``acl.mdl.destroy_desc`` (queue-mode page, step 4), in the context that loaded it (S11).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from streamer.runtime.acl.description import ModelDescription, read_description
from streamer.runtime.acl.errors import check_handle, check_ret
from streamer.runtime.acl.teardown import Teardown

__all__ = ["LoadedModel", "load_model", "load_plain"]


@dataclass(frozen=True)
class LoadedModel:
    """A model id with its description handle and what it describes."""

    model_id: int
    desc: int
    description: ModelDescription


def load_plain(acl: Any, path: str) -> int:
    """``acl.mdl.load_from_file`` in the current context; returns the model id.

    Raises:
        AclError: the load failed.
    """
    model_id, ret = acl.mdl.load_from_file(path)
    check_ret(ret, "acl.mdl.load_from_file")
    return int(model_id)


def load_model(acl: Any, name: str, load: Callable[[], int], teardown: Teardown) -> LoadedModel:
    """Load with ``load`` (plain or WithQ), then read the description.

    The release (unload, then destroy the description) is pushed on ``teardown`` as soon as
    the model id exists, so a failure while describing still unloads it.

    Raises:
        AclError: loading or describing failed.
        ModelError: the model has a tensor type streamer cannot represent.
    """
    model_id = load()
    desc_handle: list[int] = []

    def release() -> None:
        teardown.release("acl.mdl.unload", acl.mdl.unload, model_id)
        for handle in desc_handle:
            teardown.release("acl.mdl.destroy_desc", acl.mdl.destroy_desc, handle)

    teardown.push_call(release)
    desc = check_handle(acl.mdl.create_desc(), "acl.mdl.create_desc")
    desc_handle.append(desc)
    check_ret(acl.mdl.get_desc(desc, model_id), "acl.mdl.get_desc")
    return LoadedModel(model_id, desc, read_description(acl, desc, name))

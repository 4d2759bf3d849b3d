"""ACL return codes and the one place that turns them into exceptions.

::

    BackendError (streamer.errors)
    └── AclError          a pyACL / tdt call returned non-zero: ``code``, ``name``, ``api``

Every pyACL and tdt call of the backend goes through :func:`check_ret` (aclError codes) or
:func:`check_handle` (calls that return a handle, NULL on failure).
A failure that concerns one batch only (an execution) is turned into a per-batch
:class:`~streamer.errors.FrameError` by the executor that made the call, using the
:class:`AclError` text.

The codes and their names are :class:`~streamer.runtime.acl.constants.AclCode`.
"""

from __future__ import annotations

from streamer.errors import BackendError
from streamer.runtime.acl.constants import AclCode

__all__ = [
    "QUEUE_WAIT_CODES",
    "AclError",
    "check_handle",
    "check_ret",
    "code_name",
]


QUEUE_WAIT_CODES = frozenset(
    {AclCode.ERROR_RT_QUEUE_EMPTY, AclCode.ERROR_RT_QUEUE_FULL, AclCode.ERROR_RT_REPORT_TIMEOUT}
)
"""Codes a tdt enqueue/dequeue with ``timeout > 0`` may return when it expires: queue full /
empty, or the driver's wait timeout mapped to ``RT_ERROR_REPORT_TIMEOUT``. Which one is not
documented (reference/pyacl.md §5), so all three mean "try again": backpressure, not failure."""


def code_name(code: int) -> str:
    """The C macro name of an aclError, e.g. ``ACL_ERROR_RT_QUEUE_FULL``; ``UNKNOWN`` if new."""
    try:
        return f"ACL_{AclCode(code).name}"
    except ValueError:
        return "UNKNOWN"


class AclError(BackendError):
    """A pyACL or tdt call returned a non-zero code.

    Args:
        code: the numeric return value (an aclError).
        name: its symbolic name, e.g. ``ACL_ERROR_RT_QUEUE_FULL``.
        api: the call, as written in Python (``acl.mdl.execute``) or C (``acltdtEnqueueData``).
    """

    def __init__(self, code: int, name: str, api: str) -> None:
        super().__init__(f"{api} failed: {name} ({code})")
        self.code = code
        self.name = name
        self.api = api

    def where(self, place: str) -> AclError:
        """This error with ``place`` (e.g. ``model 'face' on device 0``) before its message."""
        error = AclError(self.code, self.name, self.api)
        error.args = (f"{place}: {self}",)
        return error


def check_ret(ret: int, api: str) -> None:
    """Raise :class:`AclError` unless ``ret`` is ``ACL_SUCCESS`` (0).

    Raises:
        AclError: ``ret`` is non-zero.
    """
    if ret != AclCode.SUCCESS:
        raise AclError(ret, code_name(ret), api)


def check_handle(handle: int | None, api: str) -> int:
    """Return ``handle``, or raise :class:`AclError` if the call returned NULL (0 / None):
    ``acl.mdl.create_dataset``, ``acl.create_data_buffer``, ``acltdtCreateQueueAttr``...

    Raises:
        AclError: ``handle`` is NULL (code ``ACL_ERROR_FAILURE``: these calls return no code).
    """
    if not handle:
        raise AclError(AclCode.ERROR_FAILURE, "NULL handle", api)
    return int(handle)

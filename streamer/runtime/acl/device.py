"""pyACL process and device lifecycle, in the documented order.

Start-up (SAM ``python/common/acllite/acllite_resource.py``; seeds, queue-mode sample)::

    acl.init → for each device: rt.set_device → rt.create_context → rt.create_stream
             → rt.get_run_mode

Teardown runs the reverse on every exit path, including a failure half way through start-up:
``rt.set_context → rt.synchronize_device → rt.destroy_stream → rt.destroy_context →
rt.reset_device`` per device (newest first; the context is made current again so its stream
is destroyed where it was created), then ``acl.finalize``. A device marked
:attr:`DeviceContext.hung` (a model's work on it did not finish: a hung execution) is left
alone, and so is ``acl.finalize``: synchronising would wait for the hung task without end, and
the process exit reclaims the device. Several devices are served by switching contexts with
``acl.rt.set_context``, which the multi-device page recommends over ``set_device`` (seeds
"多Device场景").
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import structlog

from streamer.runtime.acl.constants import RunMode
from streamer.runtime.acl.errors import check_ret
from streamer.runtime.acl.teardown import Teardown

__all__ = ["AclRuntime", "DeviceContext"]

_log = structlog.get_logger(__name__)


class DeviceContext:
    """One opened device: its context, its start-up stream and the run mode.

    Attributes:
        device_id: the device.
        context: the explicit context created for it.
        run_mode: ``ACL_HOST`` or ``ACL_DEVICE``.
        hung: set by a model closed while its work still ran on the device; the device's
            releases are then skipped (module docstring).
    """

    def __init__(
        self,
        acl: Any,
        device_id: int,
        context: int,
        stream: int,
        run_mode: RunMode,
        teardown: Teardown,
    ) -> None:
        self.device_id = device_id
        self.context = context
        self.run_mode = run_mode
        self.hung = False
        self._acl = acl
        self._stream = stream
        self._stream_lent = False
        self._teardown = teardown

    def release(self) -> None:
        """Synchronise, then destroy the stream and the context and reset the device; or,
        when :attr:`hung`, nothing (logged as ``acl_device_abandoned``).

        Raises:
            AclError: the first release that failed (all of them are attempted).
        """
        if self.hung:
            dropped = self._teardown.discard()
            _log.error("acl_device_abandoned", device=self.device_id, releases=dropped)
            return
        self._teardown.close()

    def activate(self) -> None:
        """Make this device's context current in the calling thread (``acl.rt.set_context``).

        Raises:
            AclError: ``set_context`` failed.
        """
        check_ret(self._acl.rt.set_context(self.context), "acl.rt.set_context")

    def take_stream(self, teardown: Teardown) -> int:
        """A stream for one model: the start-up stream if free, else a new one.

        The matching release (hand the start-up stream back, or destroy the new one) is pushed
        on ``teardown``. Call with this device's context current.

        Raises:
            AclError: ``acl.rt.create_stream`` failed.
        """
        if not self._stream_lent:
            self._stream_lent = True
            teardown.push_call(self._return_stream)
            return self._stream
        stream, ret = self._acl.rt.create_stream()
        check_ret(ret, "acl.rt.create_stream")
        teardown.push("acl.rt.destroy_stream", self._acl.rt.destroy_stream, stream)
        return int(stream)

    def _return_stream(self) -> None:
        self._stream_lent = False


class AclRuntime:
    """``acl.init`` and every configured device, released by :meth:`close`.

    Args:
        acl: the pyACL module (or the simulator's).
        devices: device ids to open.
        config_path: ``acl.json`` for ``acl.init``, or None.

    Raises:
        AclError: a start-up call failed; everything opened before it is released first.
    """

    def __init__(self, acl: Any, devices: Sequence[int], config_path: Path | None) -> None:
        self._acl = acl
        self._teardown = Teardown()
        self.devices: dict[int, DeviceContext] = {}
        with self._teardown.on_error():
            ret = acl.init(str(config_path)) if config_path is not None else acl.init()
            check_ret(ret, "acl.init")
            self._teardown.push_call(self._finalize)
            for device in devices:
                self.devices[device] = opened = _open_device(acl, device)
                self._teardown.push_call(opened.release)

    def close(self) -> None:
        """Release every device, then finalize (not after a hung device). Idempotent.

        Raises:
            AclError: the first release that failed (all of them are attempted).
        """
        self._teardown.close()

    def _finalize(self) -> None:
        if any(device.hung for device in self.devices.values()):
            _log.error("acl_finalize_skipped", reason="a device is hung")
            return
        check_ret(self._acl.finalize(), "acl.finalize")


def _open_device(acl: Any, device_id: int) -> DeviceContext:
    """Set the device, create its context and start-up stream; on failure what was created
    is released before the error propagates.

    Raises:
        AclError: a call failed.
    """
    teardown = Teardown()
    with teardown.on_error():
        check_ret(acl.rt.set_device(device_id), "acl.rt.set_device")
        teardown.push("acl.rt.reset_device", acl.rt.reset_device, device_id)
        context, ret = acl.rt.create_context(device_id)
        check_ret(ret, "acl.rt.create_context")
        teardown.push("acl.rt.destroy_context", acl.rt.destroy_context, context)
        stream, ret = acl.rt.create_stream()
        check_ret(ret, "acl.rt.create_stream")
        teardown.push("acl.rt.destroy_stream", acl.rt.destroy_stream, stream)
        # Drain: every task on the device finished before its resources go (multi-device).
        teardown.push("acl.rt.synchronize_device", acl.rt.synchronize_device)
        teardown.push("acl.rt.set_context", acl.rt.set_context, context)
        mode, ret = acl.rt.get_run_mode()
        check_ret(ret, "acl.rt.get_run_mode")
    run_mode = RunMode(mode)
    _log.info("acl_device_opened", device=device_id, run_mode=run_mode.name)
    return DeviceContext(acl, device_id, int(context), int(stream), run_mode, teardown)

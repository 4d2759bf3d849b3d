"""``aclmdlLoadFromFileWithQ``: pyACL's binding where the build has it, else ctypes.

pyACL compiles ``acl.mdl.load_from_file_with_q`` only under ``USE_MDL``, which the public
build does not define (RT ``python/pyACL/mdl/pymdl_methods.cpp``), so its presence is
feature-detected with ``hasattr``; otherwise the C function is called on ``libascendcl.so``
(GE ``docs/zh/api/graph_engine_api/c/acl/aclmdlLoadFromFileWithQ.md``)::

    aclError aclmdlLoadFromFileWithQ(const char *modelPath, uint32_t *modelId,
                                     const uint32_t *inputQ, size_t inputQNum,
                                     const uint32_t *outputQ, size_t outputQNum);

The pyACL form takes the raw addresses of ``uint32`` arrays of queue ids (format ``"skkkk"``,
RT ``python/pyACL/mdl/mdl_wrap.cpp``).
"""

from __future__ import annotations

import ctypes
from collections.abc import Sequence
from typing import Any

import numpy as np
import structlog

from streamer.runtime.acl.errors import check_ret

__all__ = ["WithQLoader"]

_log = structlog.get_logger(__name__)
_SYMBOL = "aclmdlLoadFromFileWithQ"


class WithQLoader:
    """Loads a model bound to tdt queues, by whichever route the installation offers.

    Args:
        acl: the pyACL module.
        acl_library: ``ctypes.CDLL("libascendcl.so")`` (or the simulator's), or None.
    """

    def __init__(self, acl: Any, acl_library: Any | None) -> None:
        self._acl = acl
        self._function = None
        if not hasattr(acl.mdl, "load_from_file_with_q") and acl_library is not None:
            function = getattr(acl_library, _SYMBOL, None)
            if function is not None:
                u32p = ctypes.POINTER(ctypes.c_uint32)
                function.argtypes = [
                    ctypes.c_char_p,
                    u32p,
                    u32p,
                    ctypes.c_size_t,
                    u32p,
                    ctypes.c_size_t,
                ]
                function.restype = ctypes.c_int
                self._function = function

    @classmethod
    def open_library(cls, acl: Any, name: str) -> WithQLoader:
        """A loader for the real installation: ``ctypes.CDLL(name)`` if pyACL lacks WithQ."""
        if hasattr(acl.mdl, "load_from_file_with_q"):
            return cls(acl, None)
        try:
            library = ctypes.CDLL(name)
        except OSError as exc:
            _log.info("acl_library_unavailable", library=name, detail=str(exc))
            library = None
        return cls(acl, library)

    @property
    def available(self) -> bool:
        """Whether queue-bound loading is possible at all."""
        return self._function is not None or hasattr(self._acl.mdl, "load_from_file_with_q")

    def load(self, path: str, inputs: Sequence[int], outputs: Sequence[int]) -> int:
        """Load ``path`` bound to the queue ids; returns the model id.

        Raises:
            AclError: the load failed (e.g. ``ACL_ERROR_API_NOT_SUPPORT`` for OM2 files).
            RuntimeError: :attr:`available` is False.
        """
        if hasattr(self._acl.mdl, "load_from_file_with_q"):
            return self._load_pyacl(path, inputs, outputs)
        if self._function is None:
            raise RuntimeError("aclmdlLoadFromFileWithQ is not available")
        model_id = ctypes.c_uint32(0)
        in_array = (ctypes.c_uint32 * len(inputs))(*inputs)
        out_array = (ctypes.c_uint32 * len(outputs))(*outputs)
        ret = self._function(
            path.encode(), ctypes.byref(model_id), in_array, len(inputs), out_array, len(outputs)
        )
        check_ret(ret, _SYMBOL)
        return model_id.value

    def _load_pyacl(self, path: str, inputs: Sequence[int], outputs: Sequence[int]) -> int:
        in_ids = np.asarray(inputs, dtype=np.uint32).tobytes()
        out_ids = np.asarray(outputs, dtype=np.uint32).tobytes()
        model_id, ret = self._acl.mdl.load_from_file_with_q(
            path,
            self._acl.util.bytes_to_ptr(in_ids),
            len(inputs),
            self._acl.util.bytes_to_ptr(out_ids),
            len(outputs),
        )
        check_ret(ret, "acl.mdl.load_from_file_with_q")
        return int(model_id)

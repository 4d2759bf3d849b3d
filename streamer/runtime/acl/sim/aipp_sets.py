"""Simulated ``aclmdlAIPP`` objects: ``create_aipp``, the ``set_aipp_*`` setters, ``destroy_aipp``.

Checks, as GE makes them (GE ``api/acl/acl_model/model/acl_aipp_om2.cpp``, functions
``aclmdlCreateAIPPImplOm2`` … ``aclmdlSetAIPPPixelVarReciImplOm2``; value ranges from the RT
``python/docs/zh/api_ref/ge/function-set_aipp_*.md`` pages), each failing with
``ACL_ERROR_INVALID_PARAM``:

- ``create_aipp(0)`` returns NULL (0); so does a batch size above 127, which ``kAippDynamicPara``
  cannot count (its ``batchNum`` is an ``int8``).
- An unknown or destroyed handle.
- ``set_aipp_input_format``: a value outside ``aclAippInputFormat``.
- Switches (CSC, R/B swap) other than 0 or 1; with CSC on, a matrix value outside
  [-32677, 32676].
- ``set_aipp_src_image_size``: width outside [2, 4096], height outside [1, 4096].
- Per-batch setters: ``batch_index`` ≥ the set's batch size ("batch_index … is greater than or
  equal to batch_number"); mean outside [0, 255], min outside [0, 255], variance reciprocal
  outside [-65504, 65504].
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Sequence

from streamer.runtime.acl.constants import AclCode, AippInputFormat
from streamer.runtime.acl.sim.aipp_data import AippParameters
from streamer.runtime.acl.sim.binding import SimError

__all__ = ["SimAippSets"]

_MAX_BATCH = 127
_MAX_SIZE = 4096
_CSC_RANGE = (-32677, 32676)
_LEVELS = (0, 255)
_FP16_MAX = 65504.0
_RULE = "AIPP"


class SimAippSets:
    """The ``aclmdlAIPP`` objects of the simulator, by handle; thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._handles = itertools.count(0x5A10_0000_0040, 0x40)
        self._sets: dict[int, AippParameters] = {}

    def create(self, batch_size: int) -> int:
        """A new set for ``batch_size`` images, or 0 (module docstring)."""
        if not 0 < batch_size <= _MAX_BATCH:
            return 0
        with self._lock:
            handle = next(self._handles)
            self._sets[handle] = AippParameters(batch_size)
            return handle

    def destroy(self, handle: int) -> None:
        """Raises: SimError: unknown handle."""
        with self._lock:
            if self._sets.pop(handle, None) is None:
                raise _invalid(f"no aclmdlAIPP {handle:#x}")

    def get(self, handle: int) -> AippParameters:
        """Raises: SimError: unknown handle."""
        with self._lock:
            params = self._sets.get(handle)
        if params is None:
            raise _invalid(f"no aclmdlAIPP {handle:#x}")
        return params

    def set_input_format(self, handle: int, input_format: int) -> None:
        """Raises: SimError: unknown handle or format."""
        params = self.get(handle)
        if input_format not in set(AippInputFormat):
            raise _invalid(f"unsupported inputFormat {input_format}")
        params.input_format = input_format

    def set_csc(
        self, handle: int, switch: int, matrix: Sequence[int], biases: Sequence[int]
    ) -> None:
        """Set the colour-space conversion: ``matrix`` 9 values, ``biases`` 3 output then 3
        input biases (already 8-bit: pyACL parses them unchecked).

        Raises:
            SimError: unknown handle, a switch other than 0/1, a matrix value out of range.
        """
        params = self.get(handle)
        _switch(switch, "cscSwitch")
        params.csc_switch = switch
        if not switch:
            return
        for value in matrix:
            _in_range(value, _CSC_RANGE, "cscMatrix")
        params.csc_matrix = tuple(matrix)
        params.csc_output_bias = (biases[0], biases[1], biases[2])
        params.csc_input_bias = (biases[3], biases[4], biases[5])

    def set_rbuv_swap(self, handle: int, switch: int) -> None:
        """Raises: SimError: unknown handle, a switch other than 0/1."""
        params = self.get(handle)
        _switch(switch, "rbuvSwapSwitch")
        params.rbuv_swap_switch = switch

    def set_src_image_size(self, handle: int, width: int, height: int) -> None:
        """Raises: SimError: unknown handle, width or height out of range."""
        params = self.get(handle)
        _in_range(width, (2, _MAX_SIZE), "srcImageSizeW")
        _in_range(height, (1, _MAX_SIZE), "srcImageSizeH")
        params.src_image_size = (width, height)

    def set_mean(self, handle: int, values: Sequence[int], batch_index: int) -> None:
        """Raises: SimError: unknown handle, batch index or a value out of range."""
        params = self._batch(handle, batch_index)
        for value in values:
            _in_range(value, _LEVELS, "dtcPixelMeanChn")
        params.mean[batch_index] = values

    def set_min(self, handle: int, values: Sequence[float], batch_index: int) -> None:
        """Raises: SimError: unknown handle, batch index or a value out of range."""
        params = self._batch(handle, batch_index)
        for value in values:
            _in_range(value, _LEVELS, "dtcPixelMinChn")
        params.min[batch_index] = values

    def set_var_reci(self, handle: int, values: Sequence[float], batch_index: int) -> None:
        """Raises: SimError: unknown handle, batch index or a value out of range."""
        params = self._batch(handle, batch_index)
        for value in values:
            _in_range(value, (-_FP16_MAX, _FP16_MAX), "dtcPixelVarReciChn")
        params.var_reci[batch_index] = values

    def live(self) -> dict[str, list[int]]:
        """The sets not destroyed."""
        with self._lock:
            return {"aipp_sets": list(self._sets)}

    def _batch(self, handle: int, batch_index: int) -> AippParameters:
        """Raises: SimError: unknown handle, ``batch_index`` ≥ its batch size."""
        params = self.get(handle)
        if batch_index >= params.batch_size:
            raise _invalid(
                f"batch_index ({batch_index}) is greater than or equal to batch_number "
                f"({params.batch_size})"
            )
        return params


def _invalid(message: str) -> SimError:
    return SimError(AclCode.ERROR_INVALID_PARAM, _RULE, message)


def _switch(value: int, name: str) -> None:
    if value not in (0, 1):
        raise _invalid(f"{name} {value} is not 0 or 1")


def _in_range(value: float, bounds: tuple[float, float], name: str) -> None:
    if not bounds[0] <= value <= bounds[1]:
        raise _invalid(f"{name} {value} is outside [{bounds[0]}, {bounds[1]}]")

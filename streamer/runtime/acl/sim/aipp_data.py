"""The simulator's dynamic AIPP parameters and their bytes in a model's AIPP input.

``acl.mdl.set_input_aipp`` copies an ``aclmdlAIPP`` into the ``ascend_dynamic_aipp_data``
input of a dataset, and the AIPP operator reads it there when the model runs (GE
``GeExecutor::SetDynamicAippData``). The device struct is ``kAippDynamicPara``: a 64-byte head
(input format, switches, batch count, source size, colour-space conversion) and one 96-byte
block per batch index (crop, padding, and the per-channel mean, min and variance
reciprocal): :func:`aipp_data_size` bytes for a batch (GE ``aclmdlGetAippDataSize``; TBE
``aipp_comm.py``, ``DYNC_PARAM_HEAD_STRUCT_SIZE`` / ``DYNC_PARAM_BATCH_STRUCT_SIZE``).

The simulator keeps those sizes and its own layout inside them: the head has a marker in its
reserved bytes, so an execution can tell parameters that were written from memory that never
was (``acl.rt.malloc`` memory is not zeroed); min and variance reciprocal are kept as float32
(the device keeps float16), like the rest of the simulated model.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field

import numpy as np

__all__ = [
    "AIPP_BATCH_BYTES",
    "AIPP_HEAD_BYTES",
    "AippParameters",
    "aipp_data_size",
    "decode",
    "encode",
]

AIPP_HEAD_BYTES = 64
AIPP_BATCH_BYTES = 96
CHANNELS = 4
"""Channels of each per-batch setter (the fourth is unused for three-channel images)."""

_HEAD = struct.Struct("<BbbbB3xii9h6B")
_MARKER = struct.Struct("<I")
_MARKER_AT = AIPP_HEAD_BYTES - _MARKER.size
_MARKER_VALUE = 0x41495050  # "AIPP"
_BATCH = struct.Struct("<4h4f4f")


def aipp_data_size(batch_size: int) -> int:
    """Bytes of the parameters of ``batch_size`` images."""
    return AIPP_HEAD_BYTES + AIPP_BATCH_BYTES * batch_size


@dataclass
class AippParameters:
    """One ``aclmdlAIPP``: what the ``acl.mdl.set_aipp_*`` calls set, defaults as
    ``aclmdlCreateAIPP`` leaves them (everything 0, variance reciprocal 1.0; GE
    ``aclmdlCreateAIPPImpl``).

    Attributes:
        batch_size: batch indices, from ``create_aipp``.
        input_format: ``aclAippInputFormat``, 0 = not set.
        csc_switch, rbuv_swap_switch: 0 or 1.
        csc_matrix: 9 int16, row major; csc_output_bias, csc_input_bias: 3 uint8 each.
        src_image_size: (width, height), pixels; 0 = not set.
        mean: int16 (batch_size, 4); min, var_reci: float32 (batch_size, 4).
    """

    batch_size: int
    input_format: int = 0
    csc_switch: int = 0
    rbuv_swap_switch: int = 0
    csc_matrix: tuple[int, ...] = (0,) * 9
    csc_output_bias: tuple[int, int, int] = (0, 0, 0)
    csc_input_bias: tuple[int, int, int] = (0, 0, 0)
    src_image_size: tuple[int, int] = (0, 0)
    mean: np.ndarray = field(init=False)
    min: np.ndarray = field(init=False)
    var_reci: np.ndarray = field(init=False)

    def __post_init__(self) -> None:
        self.mean = np.zeros((self.batch_size, CHANNELS), np.int16)
        self.min = np.zeros((self.batch_size, CHANNELS), np.float32)
        self.var_reci = np.ones((self.batch_size, CHANNELS), np.float32)


def encode(params: AippParameters) -> bytes:
    """The :func:`aipp_data_size` bytes of ``params``, as written into the AIPP input."""
    head = bytearray(AIPP_HEAD_BYTES)
    _HEAD.pack_into(
        head,
        0,
        params.input_format,
        params.csc_switch,
        params.rbuv_swap_switch,
        0,
        params.batch_size,
        *params.src_image_size,
        *params.csc_matrix,
        *params.csc_output_bias,
        *params.csc_input_bias,
    )
    _MARKER.pack_into(head, _MARKER_AT, _MARKER_VALUE)
    blocks = bytearray(AIPP_BATCH_BYTES * params.batch_size)
    for index in range(params.batch_size):
        values = (*params.mean[index], *params.min[index], *params.var_reci[index])
        _BATCH.pack_into(blocks, AIPP_BATCH_BYTES * index, *values)
    return bytes(head + blocks)


def decode(data: bytes) -> AippParameters | None:
    """The parameters in the AIPP input ``data``, or None when none were written.

    Raises:
        ValueError: ``data`` is shorter than its head says.
    """
    if len(data) < AIPP_HEAD_BYTES or _MARKER.unpack_from(data, _MARKER_AT)[0] != _MARKER_VALUE:
        return None
    fields = _HEAD.unpack_from(data, 0)
    fmt, csc, swap, _, batch, width, height = fields[:7]
    if len(data) < aipp_data_size(batch):
        raise ValueError(f"{len(data)} bytes for the AIPP parameters of {batch} images")
    params = AippParameters(
        batch, fmt, csc, swap, fields[7:16], fields[16:19], fields[19:22], (width, height)
    )
    for index in range(batch):
        values = _BATCH.unpack_from(data, AIPP_HEAD_BYTES + AIPP_BATCH_BYTES * index)
        params.mean[index] = values[:CHANNELS]
        params.min[index] = values[CHANNELS : 2 * CHANNELS]
        params.var_reci[index] = values[2 * CHANNELS :]
    return params

"""Simulator rules of dynamic-shape single operators (``acl.op.infer_shape``,
``acl.op.execute_v2``, tensor descriptions; O1-O8 of
:mod:`streamer.runtime.acl.sim.single_ops`), and the ACL operators' shape rules on top of them:
each rule broken on purpose gives the documented code."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import pytest
from acl_testing import in_thread, open_device, rules

from streamer.errors import FrameError
from streamer.runtime.acl.constants import (
    ACL_FORMAT_ND,
    ACL_UNKNOWN_RANK,
    AclCode,
    DataType,
    MallocPolicy,
    MemcpyKind,
    RunMode,
)
from streamer.runtime.acl.op_shapes import MaxShapeMissing, MaxShapeWrong, execution_dims
from streamer.runtime.acl.operators import GATHER_OP, NMS_OP, TOP_K_OP, AclOperators
from streamer.runtime.acl.options import SimOptions
from streamer.runtime.acl.sim.simulator import Simulator

pytestmark = pytest.mark.timeout(30)

FLOAT, INT32 = int(DataType.FLOAT), int(DataType.INT32)
BOXES = np.array([[[0, 0, 10, 10], [1, 1, 11, 11], [50, 50, 60, 60]]], np.float32)
SCORES = np.array([[[0.9, 0.8, 0.7]]], np.float32)


class Op:
    """Raw pyACL calls on a simulator, the way an application writes them."""

    def __init__(self, sim: Simulator) -> None:
        self.sim = sim
        self.acl = sim.acl

    def desc(self, data_type: int, dims: Sequence[int]) -> int:
        desc = self.acl.create_tensor_desc(data_type, list(dims), ACL_FORMAT_ND)
        assert desc != 0
        return int(desc)

    def device(self, array: np.ndarray, size: int | None = None) -> tuple[int, int]:
        """A data buffer over device memory holding ``array``: (buffer, ptr)."""
        nbytes = size if size is not None else max(array.nbytes, 1)
        ptr, ret = self.acl.rt.malloc(nbytes, MallocPolicy.NORMAL_ONLY)
        assert ret == 0
        data = array.tobytes()
        if data:
            src = self.acl.util.bytes_to_ptr(data)
            kind = MemcpyKind.HOST_TO_DEVICE
            assert self.acl.rt.memcpy(ptr, nbytes, src, min(len(data), nbytes), kind) == 0
        return self.acl.create_data_buffer(ptr, nbytes), ptr

    def host(self, array: np.ndarray) -> tuple[int, bytes]:
        """A data buffer over the application's memory: (buffer, the bytes to keep alive)."""
        data = array.tobytes()
        return self.acl.create_data_buffer(self.acl.util.bytes_to_ptr(data), len(data)), data

    def nms_inputs(self, limit: int = 10) -> tuple[list[int], list[np.ndarray]]:
        arrays = [
            BOXES,
            SCORES,
            np.array([limit], np.int32),
            np.array([0.5], np.float32),
            np.array([0.0], np.float32),
        ]
        types = [FLOAT, FLOAT, INT32, FLOAT, FLOAT]
        return [self.desc(t, a.shape) for t, a in zip(types, arrays, strict=True)], arrays

    def dims(self, desc: int) -> list[int]:
        count = self.acl.get_tensor_desc_num_dims(desc)
        return [self.acl.get_tensor_desc_dim_v2(desc, i)[0] for i in range(count)]


@pytest.fixture
def op(sim: Simulator) -> Op:
    open_device(sim)
    return Op(sim)


def test_o2_nms_infers_a_range_and_top_k_exact_dims(op: Op) -> None:
    descs, arrays = op.nms_inputs(limit=2)
    host = [op.host(a) for a in arrays]
    out = op.desc(INT32, [-1])
    ret = op.acl.op.infer_shape(NMS_OP, descs, [b for b, _ in host], 1, [out], 0)
    assert ret == 0
    assert op.dims(out) == [-1, 3]
    assert op.acl.get_tensor_desc_dim_range(out, 0, 2) == ([0, 2], 0)  # B·C·min(N, 2)
    assert op.acl.get_tensor_desc_dim_range(out, 1, 2) == ([3, 3], 0)
    assert op.acl.get_tensor_desc_dim_range(out, 0, 1)[1] == AclCode.ERROR_INVALID_PARAM
    x, k = np.zeros((2, 7), np.float32), np.array(3, np.int32)
    top = [op.desc(FLOAT, [2, 7]), op.desc(INT32, [])]
    inputs = [op.host(x), op.host(k)]
    outs = [op.desc(FLOAT, [-1]), op.desc(INT32, [-1])]
    assert op.acl.op.infer_shape(TOP_K_OP, top, [b for b, _ in inputs], 2, outs, 0) == 0
    assert [op.dims(d) for d in outs] == [[2, 3], [2, 3]]


def test_o2_unknown_rank_cannot_be_read_by_dim() -> None:
    sim = Simulator(SimOptions(unknown_rank_ops=[NMS_OP]))
    op = Op(sim)
    open_device(sim)
    descs, arrays = op.nms_inputs()
    host = [op.host(a) for a in arrays]
    out = op.desc(INT32, [-1])
    assert op.acl.op.infer_shape(NMS_OP, descs, [b for b, _ in host], 1, [out], 0) == 0
    assert op.acl.get_tensor_desc_num_dims(out) == ACL_UNKNOWN_RANK
    assert op.acl.get_tensor_desc_dim_v2(out, 0)[1] == AclCode.ERROR_INVALID_PARAM
    assert op.acl.get_tensor_desc_dim_range(out, 0, 2)[1] == AclCode.ERROR_INVALID_PARAM
    assert rules(sim) == ["O2", "O2"]


def test_o1_infer_shape_checks_its_arguments(op: Op) -> None:
    descs, arrays = op.nms_inputs()
    kept = [op.host(a) for a in arrays]
    host = [b for b, _ in kept]
    out = op.desc(INT32, [-1])
    infer = op.acl.op.infer_shape
    assert infer("NoSuchOp", descs, host, 1, [out], 0) == AclCode.ERROR_OP_NOT_FOUND
    assert infer(NMS_OP, descs, host, 2, [out], 0) == AclCode.ERROR_INVALID_PARAM
    assert infer(NMS_OP, descs[:4], host[:4], 1, [out], 0) == AclCode.ERROR_OP_INPUT_NOT_MATCH
    wrong = [op.desc(INT32, BOXES.shape), *descs[1:]]
    assert infer(NMS_OP, wrong, host, 1, [out], 0) == AclCode.ERROR_OP_INPUT_NOT_MATCH
    on_device = [op.device(a)[0] for a in arrays]  # ACL_HOST: infer_shape reads host memory
    assert infer(NMS_OP, descs, on_device, 1, [out], 0) == AclCode.ERROR_INVALID_PARAM
    with pytest.raises(TypeError, match="acl.op.infer_shape args parse failed"):
        infer(NMS_OP, tuple(descs), host, 1, [out], 0)
    assert kept and rules(op.sim) == ["O1"] * 5


def _execute(op: Op, out_rows: int, **broken: Any) -> tuple[int, int]:
    """NMS through execute_v2 with an output of ``out_rows`` rows; returns (ret, out desc)."""
    descs, arrays = op.nms_inputs()
    inputs = [op.device(a)[0] for a in arrays]
    out = op.desc(INT32, [out_rows, 3])
    output, _ = op.device(np.zeros(0), max(out_rows * 12, 1))
    stream, ret = op.acl.rt.create_stream()
    assert ret == 0
    args = {"descs": descs, "inputs": inputs, "outs": [out], "outputs": [output], **broken}
    ret = op.acl.op.execute_v2(
        NMS_OP, args["descs"], args["inputs"], args["outs"], args["outputs"], 0, stream
    )
    return ret, out


def test_o6_a_range_maximum_runs_synchronously_and_writes_the_exact_dims(op: Op) -> None:
    ret, out = _execute(op, out_rows=3)
    assert ret == 0
    assert op.dims(out) == [2, 3]  # two boxes kept, written back without synchronize_stream


def test_o5_an_output_smaller_than_what_the_op_produces_fails(op: Op) -> None:
    """The code is returned and no rule is broken: the caller could not know the size."""
    ret, out = _execute(op, out_rows=1)
    assert ret == AclCode.ERROR_OP_OUTPUT_NOT_MATCH
    assert op.dims(out) == [1, 3] and rules(op.sim) == []


def test_o4_input_desc_larger_than_its_buffer_and_host_memory_fail(op: Op) -> None:
    descs, arrays = op.nms_inputs()
    small = [op.device(a, 4)[0] if i == 0 else op.device(a)[0] for i, a in enumerate(arrays)]
    ret, _ = _execute(op, 3, inputs=small)
    assert ret == AclCode.ERROR_OP_INPUT_NOT_MATCH
    kept = [op.host(a) for a in arrays]  # application memory, under ACL_HOST
    ret, _ = _execute(op, 3, inputs=[b for b, _ in kept])
    assert ret == AclCode.ERROR_INVALID_PARAM
    ret, _ = _execute(op, 3, outs=[op.desc(INT32, [-1, 3])])  # not concrete
    assert ret == AclCode.ERROR_OP_OUTPUT_NOT_MATCH
    assert rules(op.sim) == ["O4", "O4", "O5"]


def test_o3_execute_needs_a_context_and_a_stream_of_its_device() -> None:
    sim = Simulator(SimOptions(device_count=2))
    op = Op(sim)
    open_device(sim, 1)
    stream_1, _ = sim.acl.rt.create_stream()
    context_0 = open_device(sim, 0)
    descs, arrays = op.nms_inputs()
    inputs = [op.device(a)[0] for a in arrays]
    out = op.desc(INT32, [3, 3])
    output, _ = op.device(np.zeros(9, np.int32))

    def execute(stream: int) -> int:
        return int(sim.acl.op.execute_v2(NMS_OP, descs, inputs, [out], [output], 0, stream))

    assert execute(stream_1) == AclCode.ERROR_RT_PARAM_INVALID  # stream of device 1
    assert in_thread(lambda: execute(0)) == AclCode.ERROR_RT_CONTEXT_NULL  # no context
    assert execute(0) == 0 and context_0
    assert rules(sim) == ["O3", "S10"]


def test_o7_attributes_the_op_does_not_have_are_refused(op: Op) -> None:
    descs, arrays = op.nms_inputs()
    kept = [op.host(a) for a in arrays]
    attr = op.acl.op.create_attr()
    assert op.acl.op.set_attr_int(attr, "center_point_box", 1) == 0
    out = op.desc(INT32, [-1])
    ret = op.acl.op.infer_shape(NMS_OP, descs, [b for b, _ in kept], 1, [out], attr)
    assert ret == AclCode.ERROR_OP_ATTR_NOT_MATCH
    assert op.acl.op.set_attr_float(attr, "nope", 1.5) == 0
    with pytest.raises(TypeError, match="set_attr_int args parse failed"):
        op.acl.op.set_attr_int(attr, "x", 2**63)
    op.acl.op.destroy_attr(attr)
    assert rules(op.sim) == ["O7"]


def test_o8_gather_infers_from_axis_and_fails_on_an_index_out_of_range(op: Op) -> None:
    """GatherV2's output shape needs the value of ``axis`` (not of ``x``: a data buffer over
    no memory stands for a device operand under ACL_HOST); an index past x's rows fails the
    execution, reported by ``synchronize_stream`` since the dims were exact."""
    x = np.arange(12, dtype=np.float32).reshape(4, 3)
    descs = [op.desc(FLOAT, [4, 3]), op.desc(INT32, [2]), op.desc(INT32, [])]
    kept = [op.host(np.array([3, 1], np.int32)), op.host(np.array(0, np.int32))]
    axis_1 = op.host(np.array(1, np.int32))
    null = op.acl.create_data_buffer(0, 0)
    indices, axis = kept[0][0], kept[1][0]
    out = op.desc(FLOAT, [-1])
    infer = op.acl.op.infer_shape
    assert infer(GATHER_OP, descs, [null, indices, axis], 1, [out], 0) == 0
    assert op.dims(out) == [2, 3]
    no_match = AclCode.ERROR_OP_INPUT_NOT_MATCH
    assert infer(GATHER_OP, descs, [null, indices, null], 1, [out], 0) == no_match  # no axis
    assert infer(GATHER_OP, descs, [null, indices, axis_1[0]], 1, [out], 0) == no_match
    stream, _ = op.acl.rt.create_stream()
    output, ptr = op.device(np.zeros(6, np.float32))
    out = op.desc(FLOAT, [2, 3])
    for rows, code in (([3, 1], 0), ([4, 0], AclCode.ERROR_GE_FAILURE)):
        inputs = [op.device(x)[0], op.device(np.array(rows, np.int32))[0]]
        inputs.append(op.device(np.array(0, np.int32))[0])
        assert op.acl.op.execute_v2(GATHER_OP, descs, inputs, [out], [output], 0, stream) == 0
        assert op.acl.rt.synchronize_stream(stream) == code
    host, _ = op.acl.rt.malloc_host(24)
    assert op.acl.rt.memcpy(host, 24, ptr, 24, MemcpyKind.DEVICE_TO_HOST) == 0
    got = np.frombuffer(op.acl.util.ptr_to_bytes(host, 24), np.float32).reshape(2, 3)
    assert got.tolist() == x[[3, 1]].tolist()
    assert rules(op.sim) == ["O1", "O1", "O8"]


# The ACL operators on these rules ---------------------------------------------------------


def _operators(sim: Simulator, max_shapes: dict[str, list[list[int]]]) -> AclOperators:
    open_device(sim)
    return AclOperators(sim.acl, RunMode.HOST, max_shapes)


def test_unknown_rank_uses_the_configured_maximum_shape() -> None:
    sim = Simulator(SimOptions(unknown_rank_ops=[NMS_OP]))
    with _operators(sim, {NMS_OP: [[16, 3]]}) as ops:
        assert ops.nms(BOXES, SCORES, 10, 0.5).tolist() == [[0, 0, 0], [0, 0, 2]]
    too_small = pytest.raises(
        FrameError, match=r"op_max_shapes\.NonMaxSuppressionV6: an output does not fit .*100022"
    )
    with _operators(sim, {NMS_OP: [[1, 3]]}) as ops, too_small as failed:
        ops.nms(BOXES, SCORES, 10, 0.5)  # the maximum is too small for the two boxes kept
    assert isinstance(failed.value.__cause__, MaxShapeWrong), "the setting is at fault"
    with _operators(sim, {}) as ops, pytest.raises(FrameError, match="op_max_shapes"):
        ops.nms(BOXES, SCORES, 10, 0.5)
    for bound, why in (
        (2**31 - 1, r"25769803764 bytes of device memory, more than the device can allocate"),
        (2**62, r"more than a size_t holds"),  # 2**62 x 3 x 4 bytes: no wrap to a small size
    ):
        too_large = pytest.raises(FrameError, match=rf"op_max_shapes\.NonMaxSuppressionV6: .*{why}")
        with _operators(sim, {NMS_OP: [[bound, 3]]}) as ops, too_large as failed:
            ops.nms(BOXES, SCORES, 10, 0.5)
        assert isinstance(failed.value.__cause__, MaxShapeWrong), "the setting is at fault"


def test_an_unbounded_dim_takes_the_configured_maximum_of_the_output_rank(
    sim: Simulator,
) -> None:
    """A dim whose range has no maximum (``[1, -1]``) takes the configured one, from a shape
    of the output's rank; another rank is the setting's fault, not a missing setting."""
    open_device(sim)
    desc = sim.acl.create_tensor_desc(INT32, [-1, 3], ACL_FORMAT_ND)
    try:
        assert execution_dims(sim.acl, desc, [64, 3]) == ((64, 3), True)
        with pytest.raises(MaxShapeMissing, match=r"dim 0 has the range \[1, -1\]"):
            execution_dims(sim.acl, desc, None)
        with pytest.raises(MaxShapeWrong, match="has rank 1, but the output has rank 2"):
            execution_dims(sim.acl, desc, [64])
    finally:
        sim.acl.destroy_tensor_desc(desc)


def test_operators_release_every_handle_and_only_copy_the_kept_rows(sim: Simulator) -> None:
    with _operators(sim, {}) as ops:
        assert ops.nms(BOXES, SCORES, 10, 0.5).shape == (2, 3)
        assert ops.top_k(np.arange(6, dtype=np.float32).reshape(2, 3), 2)[1].tolist() == [
            [2, 1],
            [2, 1],
        ]
    live = sim.live_resources()
    assert "tensor_descs" not in live and "op_attrs" not in live and "streams" not in live
    copies = [c for c in sim.log.calls("acl.rt.memcpy") if c.args[4] == 2]
    assert [c.args[3] for c in copies][:1] == [2 * 3 * 4]  # 2 kept rows, not the range maximum
    apis = [c.api for c in sim.log.calls()]
    infer, execute = apis.index("acl.op.infer_shape"), apis.index("acl.op.execute_v2")
    assert infer < apis.index("acl.get_tensor_desc_dim_range", infer) < execute
    assert sim.violations == []

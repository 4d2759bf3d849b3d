"""Simulator rules of models, gears and execution (reference/pyacl.md §9, S11-S18)."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import numpy as np
import pytest
from acl_testing import (
    GEARS,
    Loaded,
    MakeModel,
    Reference,
    open_device,
    rules,
    tiny_model,
    write_manifest,
)

from streamer.runtime.acl.constants import ACL_DYNAMIC_TENSOR_NAME, AclCode, CallbackBlock
from streamer.runtime.acl.options import SimOptions
from streamer.runtime.acl.sim.simulator import Simulator

pytestmark = pytest.mark.timeout(30)


def test_description_of_a_dynamic_batch_model(sim: Simulator, dynamic_model: Path) -> None:
    open_device(sim)
    model = Loaded(sim, dynamic_model)
    mdl = sim.acl.mdl
    assert mdl.get_num_inputs(model.desc) == 2
    assert mdl.get_input_index_by_name(model.desc, ACL_DYNAMIC_TENSOR_NAME) == (1, 0)
    assert mdl.get_input_dims(model.desc, 0)[0]["dims"] == [-1, 3, 128, 128]
    assert mdl.get_input_size_by_index(model.desc, 0) == 8 * 3 * 128 * 128 * 4
    assert mdl.get_output_dims(model.desc, 0)[0]["dims"] == [-1, 896, 16]
    assert mdl.get_dynamic_batch(model.desc) == ({"batchCount": 4, "batch": GEARS}, 0)


def test_s14_gear_limits(sim: Simulator, make_model: MakeModel, static4_model: Path) -> None:
    open_device(sim)
    static = Loaded(sim, static4_model)
    assert sim.acl.mdl.get_dynamic_batch(static.desc) == ({"batchCount": 0, "batch": []}, 0)
    too_many = make_model(
        "many",
        {"input_shape": {"input": [-1, 3, 128, 128]}, "dynamic_batch_size": list(range(1, 130))},
    )
    assert sim.acl.mdl.load_from_file(str(too_many))[1] == AclCode.ERROR_GE_PARAM_INVALID
    assert "dynamic_batch_size" in sim.problems[-1]


def test_s11_execute_and_unload_only_in_the_loading_context(
    sim: Simulator, static4_model: Path
) -> None:
    first = open_device(sim)
    model = Loaded(sim, static4_model)
    second, _ = sim.acl.rt.create_context(0)
    assert (
        sim.acl.mdl.execute(model.model_id, model.in_ds, model.out_ds)
        == AclCode.ERROR_INVALID_MODEL_ID
    )
    assert sim.acl.mdl.unload(model.model_id) == AclCode.ERROR_INVALID_MODEL_ID
    assert sim.acl.rt.set_context(first) == 0
    model.upload(np.zeros((4, 3, 128, 128), np.float32))
    assert sim.acl.mdl.execute(model.model_id, model.in_ds, model.out_ds) == 0
    assert sim.acl.mdl.unload(model.model_id) == 0
    assert rules(sim) == ["S11", "S11"]
    assert second


def test_s12_outputs_are_valid_only_after_synchronize(
    make_model: MakeModel, static4_model: Path
) -> None:
    """The stream is held by a blocking callback that only this thread can run, so the
    execution cannot start before it is let go: ``execute_async`` returning at all shows it
    does not wait for the execution, with no clock to read on a loaded machine."""
    sim = Simulator(SimOptions(run_mode="device"))
    open_device(sim)
    model = Loaded(sim, static4_model)
    stream, _ = sim.acl.rt.create_stream()
    me = threading.get_ident()
    assert sim.acl.rt.subscribe_report(me, stream) == 0
    assert sim.acl.rt.launch_callback(lambda data: None, [], CallbackBlock.BLOCK, stream) == 0
    model.upload(np.full((4, 3, 128, 128), 0.5, np.float32))
    assert sim.acl.mdl.execute_async(model.model_id, model.in_ds, model.out_ds, stream) == 0
    before = sim.acl.util.ptr_to_bytes(model.outputs[1][0], 16)
    assert before == b"\xff" * 16, "outputs are not written yet"
    assert sim.acl.rt.process_report(10_000) == 0, "the held stream goes on"
    assert sim.acl.rt.synchronize_stream(stream) == 0
    assert sim.acl.util.ptr_to_bytes(model.outputs[1][0], 16) != before
    assert sim.acl.rt.unsubscribe_report(me, stream) == 0
    assert sim.acl.rt.destroy_stream(stream) == 0


def test_s13_one_model_never_runs_on_two_streams_at_once(static4_model: Path) -> None:
    sim = Simulator(SimOptions(execute_delay_ms=100))
    open_device(sim)
    model = Loaded(sim, static4_model)
    model.upload(np.zeros((4, 3, 128, 128), np.float32))
    first, _ = sim.acl.rt.create_stream()
    second, _ = sim.acl.rt.create_stream()
    execute_async = sim.acl.mdl.execute_async
    assert execute_async(model.model_id, model.in_ds, model.out_ds, first) == 0
    assert execute_async(model.model_id, model.in_ds, model.out_ds, second) == AclCode.ERROR_FAILURE
    assert sim.acl.mdl.execute(model.model_id, model.in_ds, model.out_ds) == AclCode.ERROR_FAILURE
    assert sim.acl.rt.synchronize_stream(first) == 0
    assert execute_async(model.model_id, model.in_ds, model.out_ds, second) == 0
    assert sim.acl.rt.synchronize_stream(second) == 0
    assert rules(sim) == ["S13", "S13"]


def test_s13_concurrent_synchronous_executes(static4_model: Path) -> None:
    sim = Simulator(SimOptions(execute_delay_ms=200))
    context = open_device(sim)
    model = Loaded(sim, static4_model)
    model.upload(np.zeros((4, 3, 128, 128), np.float32))

    def execute_elsewhere() -> None:
        sim.acl.rt.set_context(context)
        sim.acl.mdl.execute(model.model_id, model.in_ds, model.out_ds)

    thread = threading.Thread(target=execute_elsewhere)
    thread.start()
    deadline = time.monotonic() + 5
    while not sim.models.find(model.model_id).busy and time.monotonic() < deadline:
        time.sleep(0.005)  # until the other thread is inside its 200 ms execution
    assert sim.acl.mdl.execute(model.model_id, model.in_ds, model.out_ds) == AclCode.ERROR_FAILURE
    thread.join()
    assert rules(sim) == ["S13"]


def test_s15_gears_only_from_the_list_through_the_gear_input(
    sim: Simulator, dynamic_model: Path, reference: Reference
) -> None:
    open_device(sim)
    model = Loaded(sim, dynamic_model)
    mdl = sim.acl.mdl
    assert (
        mdl.execute(model.model_id, model.in_ds, model.out_ds)
        == AclCode.ERROR_GE_DYNAMIC_BATCH_SIZE_INVALID
    )
    assert (
        mdl.set_dynamic_batch_size(model.model_id, model.in_ds, 1, 3)
        == AclCode.ERROR_GE_DYNAMIC_BATCH_SIZE_INVALID
    )
    assert (
        mdl.set_dynamic_batch_size(model.model_id, model.in_ds, 0, 2) == AclCode.ERROR_INVALID_PARAM
    )
    batch = np.random.default_rng(1).uniform(-1, 1, (2, 3, 128, 128)).astype(np.float32)
    model.upload(batch)
    assert mdl.set_dynamic_batch_size(model.model_id, model.in_ds, 1, 2) == 0
    assert mdl.execute(model.model_id, model.in_ds, model.out_ds) == 0
    np.testing.assert_allclose(model.download(0, (2, 896, 16)), reference(batch)[0], atol=1e-4)
    assert rules(sim) == ["S15", "S15", "S15"]


def test_s16_one_dynamic_kind_per_model(
    sim: Simulator, make_model: MakeModel, dynamic_model: Path
) -> None:
    open_device(sim)
    model = Loaded(sim, dynamic_model)
    mdl = sim.acl.mdl
    assert (
        mdl.set_dynamic_hw_size(model.model_id, model.in_ds, 1, 128, 128)
        == AclCode.ERROR_MODEL_NOT_DYNAMIC
    )
    dims = {"name": "", "dimCount": 4, "dims": [1, 3, 128, 128]}
    assert (
        mdl.set_input_dynamic_dims(model.model_id, model.in_ds, 1, dims)
        == AclCode.ERROR_MODEL_NOT_DYNAMIC
    )
    both = make_model(
        "both",
        {
            "input_shape": {"input": [-1, 3, 128, 128]},
            "dynamic_batch_size": [1, 2],
            "dynamic_dims": [[1], [2]],
        },
    )
    assert mdl.load_from_file(str(both))[1] == AclCode.ERROR_GE_PARAM_INVALID
    assert "mutually exclusive" in sim.problems[-1]
    assert rules(sim) == ["S16", "S16"]


def test_dynamic_image_size_and_dims_gears(sim: Simulator, tmp_path: Path) -> None:
    open_device(sim)
    hw_path = tiny_model(tmp_path / "hw.onnx")
    write_manifest(
        hw_path, {"input_shape": {"x": [1, 3, -1, -1]}, "dynamic_image_size": [[8, 8], [16, 12]]}
    )
    hw = Loaded(sim, hw_path)
    mdl = sim.acl.mdl
    assert mdl.get_dynamic_hw(hw.desc, -1) == ({"hwCount": 2, "hw": [[8, 8], [16, 12]]}, 0)
    assert (
        mdl.set_dynamic_hw_size(hw.model_id, hw.in_ds, 1, 16, 16)
        == AclCode.ERROR_GE_DYNAMIC_BATCH_SIZE_INVALID
    )
    x = np.linspace(-1, 1, 3 * 16 * 12, dtype=np.float32).reshape(1, 3, 16, 12)
    hw.upload(x)
    assert mdl.set_dynamic_hw_size(hw.model_id, hw.in_ds, 1, 16, 12) == 0
    assert mdl.execute(hw.model_id, hw.in_ds, hw.out_ds) == 0
    np.testing.assert_array_equal(hw.download(0, (1, 3, 16, 12)), np.maximum(x, 0))

    dims_path = tiny_model(tmp_path / "dims.onnx")
    write_manifest(
        dims_path, {"input_shape": {"x": [-1, 3, -1, 4]}, "dynamic_dims": [[1, 2], [2, 4]]}
    )
    dims = Loaded(sim, dims_path)
    assert mdl.get_input_dynamic_gear_count(dims.desc, -1) == (2, 0)
    gears, ret = mdl.get_input_dynamic_dims(dims.desc, -1, 2)
    assert ret == 0 and [g["dims"] for g in gears] == [[1, 3, 2, 4], [2, 3, 4, 4]]
    x = np.linspace(-1, 1, 2 * 3 * 4 * 4, dtype=np.float32).reshape(2, 3, 4, 4)
    dims.upload(x)
    assert mdl.set_input_dynamic_dims(dims.model_id, dims.in_ds, 1, gears[1]) == 0
    assert mdl.execute(dims.model_id, dims.in_ds, dims.out_ds) == 0
    np.testing.assert_array_equal(dims.download(0, (2, 3, 4, 4)), np.maximum(x, 0))


def test_refused_manifests_and_missing_files(
    sim: Simulator, make_model: MakeModel, tmp_path: Path
) -> None:
    open_device(sim)
    load = sim.acl.mdl.load_from_file
    assert load(str(tmp_path / "none.om"))[1] == AclCode.ERROR_GE_EXEC_MODEL_PATH_INVALID
    no_manifest = make_model("plain")  # the ONNX batch dim is symbolic: ATC needs a shape
    assert load(str(no_manifest))[1] == AclCode.ERROR_GE_PARAM_INVALID
    wrong = make_model("wrong", {"input_shape": {"input": [1, 3, 64, 64]}})
    assert load(str(wrong))[1] == AclCode.ERROR_GE_PARAM_INVALID
    unknown = make_model("unknown", {"input_shape": {"image": [1, 3, 128, 128]}})
    assert load(str(unknown))[1] == AclCode.ERROR_GE_PARAM_INVALID
    om = make_model("om", {"input_shape": {"input": [1, 3, 128, 128]}}, suffix=".om")
    assert load(str(om))[1] == 0, "face.om runs face.onnx with face.acl.json"
    assert len(sim.problems) == 3


def test_dataset_mismatch(sim: Simulator, static4_model: Path) -> None:
    open_device(sim)
    model = Loaded(sim, static4_model)
    empty = sim.acl.mdl.create_dataset()
    assert (
        sim.acl.mdl.execute(model.model_id, empty, model.out_ds)
        == AclCode.ERROR_MODEL_INPUT_NOT_MATCH
    )
    assert (
        sim.acl.mdl.execute(model.model_id, model.in_ds, empty)
        == AclCode.ERROR_MODEL_OUTPUT_NOT_MATCH
    )
    small = sim.acl.mdl.create_dataset()
    sim.acl.mdl.add_dataset_buffer(small, sim.acl.create_data_buffer(model.inputs[0][0], 64))
    assert (
        sim.acl.mdl.execute(model.model_id, small, model.out_ds)
        == AclCode.ERROR_GE_EXEC_MODEL_DATA_SIZE_INVALID
    )


@pytest.mark.parametrize(
    ("offset", "gap"),
    [(8, 0), (0, 0), (0, 32), (0, 64)],
    ids=["unaligned", "no-padding", "padding-not-aligned", "as-documented"],
)
def test_buffers_carved_from_one_block_follow_the_secondary_allocation_rule(
    sim: Simulator, static4_model: Path, offset: int, gap: int
) -> None:
    """Seeds "内存二次分配管理": each piece of a block starts on a 64-byte boundary and takes
    ``ALIGN_UP(len, 32) + 32`` bytes; the simulator refuses an execution over pieces that do
    not (the real runtime would overrun memory)."""
    open_device(sim)
    model = Loaded(sim, static4_model)
    mdl = sim.acl.mdl
    sizes = [mdl.get_input_size_by_index(model.desc, 0)] + [
        mdl.get_output_size_by_index(model.desc, i) for i in range(mdl.get_num_outputs(model.desc))
    ]
    assert all(size % 64 == 0 for size in sizes)
    block, ret = sim.acl.rt.malloc(offset + sum(sizes) + gap * len(sizes), 2)
    assert ret == 0
    datasets = [mdl.create_dataset(), mdl.create_dataset()]
    cursor = block + offset
    for index, size in enumerate(sizes):
        buffer = sim.acl.create_data_buffer(cursor, size)
        mdl.add_dataset_buffer(datasets[min(index, 1)], buffer)
        cursor += size + gap
    ret = mdl.execute(model.model_id, *datasets)
    if gap == 64:
        assert ret == 0
        assert rules(sim) == []
    else:
        assert ret == AclCode.ERROR_MEMORY_ADDRESS_UNALIGNED == 200003
        assert rules(sim) == ["secondary-allocation"]


def test_injected_execute_failures(static4_model: Path) -> None:
    sim = Simulator(SimOptions(fail_every_n_executes=2))
    open_device(sim)
    model = Loaded(sim, static4_model)
    model.upload(np.zeros((4, 3, 128, 128), np.float32))
    codes = [sim.acl.mdl.execute(model.model_id, model.in_ds, model.out_ds) for _ in range(4)]
    assert codes == [0, AclCode.ERROR_GE_FAILURE, 0, AclCode.ERROR_GE_FAILURE]


def test_fail_calls_makes_any_api_fail(static4_model: Path) -> None:
    sim = Simulator(SimOptions(fail_calls={"acl.mdl.load_from_file": 545001}))
    open_device(sim)
    assert sim.acl.mdl.load_from_file(str(static4_model)) == (0, 545001)


def test_input_format_decides_where_resolution_gears_go(sim: Simulator, tmp_path: Path) -> None:
    """ATC ``--input_format``: H and W are dims 2, 3 in NCHW and 1, 2 in NHWC; resolution
    gears need one of those, dims gears need ND (seeds "动态维度（ND格式）")."""
    open_device(sim)
    load = sim.acl.mdl.load_from_file
    shape = {"x": [1, 3, -1, -1]}
    cases = [
        {"input_format": "NHWC", "dynamic_image_size": [[4, 4], [8, 8]]},
        {"input_format": "ND", "dynamic_image_size": [[4, 4], [8, 8]]},
        {"input_format": "NCHW", "dynamic_dims": [[4, 4], [8, 8]]},
        {"dynamic_dims": [[4, 4], [8, 8]]},
    ]
    codes = []
    for k, options in enumerate(cases):
        path = tiny_model(tmp_path / f"relu{k}.onnx")
        write_manifest(path, {"input_shape": shape, **options})
        codes.append(load(str(path))[1])
    assert codes == [AclCode.ERROR_GE_PARAM_INVALID] * 3 + [0], "no format: ND for dims gears"
    assert "dynamic_image_size needs -1 at dims [1, 2] (H, W in NHWC)" in sim.problems[0]
    assert "needs input_format NCHW or NHWC" in sim.problems[1]
    assert "dynamic_dims needs input_format ND" in sim.problems[2]


def test_recent_error_message_per_thread(sim: Simulator, tmp_path: Path) -> None:
    """``acl.get_recent_err_msg`` returns the calling thread's last failure and clears it."""
    open_device(sim)
    acl = sim.acl
    assert acl.get_recent_err_msg() is None
    assert acl.mdl.load_from_file(str(tmp_path / "none.om"))[1] != 0
    other: list[object] = []
    thread = threading.Thread(target=lambda: other.append(acl.get_recent_err_msg()))
    thread.start()
    thread.join()
    assert other == [None], "another thread's failure is not this one's"
    message = acl.get_recent_err_msg()
    assert message is not None and message.startswith("acl.mdl.load_from_file: no model")
    assert acl.get_recent_err_msg() is None

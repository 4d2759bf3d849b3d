"""Error translation, option validation, the backend registry and the missing-pyACL message."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest
from acl_testing import MakeBackend

from streamer.config import PluginConfig, RuntimeConfig, load_config
from streamer.errors import BackendError, ConfigError
from streamer.runtime import check_runtime, open_backend
from streamer.runtime.acl.backend import AclBackend
from streamer.runtime.acl.constants import AclCode
from streamer.runtime.acl.errors import AclError, check_handle, check_ret, code_name
from streamer.runtime.acl.options import parse_model_options, parse_options
from streamer.runtime.acl.sim.backend import AclSimBackend
from streamer.runtime.base import ModelSpec

pytestmark = pytest.mark.timeout(30)


def test_check_ret_names_the_code_and_the_call() -> None:
    check_ret(0, "acl.rt.malloc")
    with pytest.raises(
        AclError, match=r"acltdtEnqueueData failed: ACL_ERROR_RT_QUEUE_FULL \(207014\)"
    ) as caught:
        check_ret(207014, "acltdtEnqueueData")
    assert (caught.value.code, caught.value.name, caught.value.api) == (
        207014,
        "ACL_ERROR_RT_QUEUE_FULL",
        "acltdtEnqueueData",
    )
    assert isinstance(caught.value, BackendError)
    assert code_name(123456) == "UNKNOWN"


@pytest.mark.parametrize(
    ("code", "name"),
    [
        (107001, "ACL_ERROR_RT_INVALID_DEVICEID"),
        (207001, "ACL_ERROR_RT_MEMORY_ALLOCATION"),
        (507899, "ACL_ERROR_RT_DRV_INTERNAL_ERROR"),
    ],
)
def test_runtime_codes_are_named(code: int, name: str) -> None:
    """Codes a device returns (a wrong device id, device memory exhausted, a driver failure)
    are printed by their macro name (RT ``rt_error_codes.h``), not as ``UNKNOWN``."""
    assert code_name(code) == name
    with pytest.raises(AclError, match=rf"acl\.rt\.set_device failed: {name} \({code}\)"):
        check_ret(code, "acl.rt.set_device")


def test_null_handles() -> None:
    assert check_handle(0x1000, "acl.mdl.create_dataset") == 0x1000
    with pytest.raises(AclError, match="NULL handle") as null:
        check_handle(None, "acltdtCreateQueueAttr")
    assert null.value.code == AclCode.ERROR_FAILURE


@pytest.mark.parametrize(
    ("options", "key"),
    [
        ({"queue_depht": 8}, "runtime.options.queue_depht: unknown key"),
        (
            {"queue_depth": 1},
            "runtime.options.queue_depth: Input should be greater than or equal to 2",
        ),
        ({"sim": {"run_mode": "cloud"}}, "runtime.options.sim.run_mode"),
        ({"sim": {"fail_every_n_executes": 0}}, "runtime.options.sim.fail_every_n_executes"),
        ({"result_timeout_ms": 2**31}, "runtime.options.result_timeout_ms: Input should be less"),
        ({"callback_flush_ms": float("inf")}, "runtime.options.callback_flush_ms: Input should"),
        (
            {"callback_flush_ms": 600, "result_timeout_ms": 500},
            "runtime.options: Value error, callback_flush_ms",
        ),
        (
            {"op_max_shapes": {"NonMaxSuppressionV6": [[-1, 3]]}},
            "op_max_shapes.NonMaxSuppressionV6",
        ),
        ({"sim": {"device_lost_after_n_executes": {"-3": 2}}}, "device_lost_after_n_executes"),
        ({"sim": {"device_lost_after_n_executes": {"1_0": 2}}}, "device_lost_after_n_executes"),
        ({"sim": {"device_lost_after_n_executes": {" 1": 2}}}, "device_lost_after_n_executes"),
        ({"sim": {"device_lost_after_n_executes": {"00": 2}}}, "device_lost_after_n_executes"),
        ({"sim": {"fail_calls": {"acl.rt.malloc": 2**40}}}, "runtime.options.sim.fail_calls"),
    ],
)
def test_invalid_options_name_the_key(options: dict[str, Any], key: str) -> None:
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        parse_options(options, simulated=True)


NMS, TOP_K, GATHER = "NonMaxSuppressionV6", "TopKV2", "GatherV2"


@pytest.mark.parametrize(
    ("max_shapes", "problem"),
    [
        ({NMS: []}, "NonMaxSuppressionV6: one maximum shape per output, 1 (selected_indices)"),
        ({NMS: [[4096, 3], [10]]}, "NonMaxSuppressionV6: one maximum shape per output"),
        ({NMS: [[4096]]}, "NonMaxSuppressionV6: selected_indices is [K, 3]"),
        ({NMS: [[4096, 3, 1]]}, "NonMaxSuppressionV6: selected_indices is [K, 3]"),
        ({NMS: [[4096, 4]]}, "NonMaxSuppressionV6: selected_indices is [K, 3]"),
        ({TOP_K: [[8, 100]]}, "TopKV2: one maximum shape per output, 2 (values, indices)"),
        ({TOP_K: [[8, 100], [800]]}, "TopKV2: values and indices are both [..., k]"),
        ({GATHER: [[]]}, "GatherV2: every output has at least one dim"),
        ({"NonMaxSuppression": [[4096, 3]]}, "NonMaxSuppression: not an operator"),
    ],
)
def test_op_max_shapes_that_do_not_fit_the_operator_name_it(
    max_shapes: dict[str, Any], problem: str
) -> None:
    """Refused at start-up (exit 2), not left to fail every frame or exit 1 unnamed."""
    with pytest.raises(ConfigError) as refused:
        parse_options({"op_max_shapes": max_shapes}, simulated=True)
    assert str(refused.value).startswith(f"runtime.options.op_max_shapes.{problem}")


def test_op_max_shapes_of_every_operator() -> None:
    max_shapes = {NMS: [[4096, 3]], TOP_K: [[8, 100], [8, 100]], GATHER: [[800, 16]]}
    assert parse_options({"op_max_shapes": max_shapes}, simulated=False).op_max_shapes == (
        max_shapes
    )


def test_sim_options_only_for_acl_sim() -> None:
    with pytest.raises(
        ConfigError, match=r'runtime\.options\.sim: only valid with runtime\.backend = "acl-sim"'
    ):
        parse_options({"sim": {}}, simulated=False)
    assert parse_options({}, simulated=True).sim is not None
    assert parse_options({}, simulated=False).sim is None


def test_model_options_override_the_runtime_ones() -> None:
    base = parse_options({"callback_interval": 4}, simulated=False)
    assert parse_model_options(base, {}, "face").callback_interval == 4
    assert parse_model_options(base, {"callback_interval": 2}, "face").callback_interval == 2
    with pytest.raises(ConfigError, match=r"model 'face' options\.sim"):
        parse_model_options(base, {"sim": {}}, "face")
    with pytest.raises(ConfigError, match=r"model 'face' options: .*callback_flush_ms \(20000\)"):
        parse_model_options(base, {"callback_flush_ms": 20_000}, "face")


def test_unknown_fail_call_and_too_few_devices_are_config_errors() -> None:
    with pytest.raises(ConfigError, match=r"fail_calls: unknown \['acl\.rt\.mallok'\]"):
        AclSimBackend(
            RuntimeConfig(backend="acl-sim", options={"sim": {"fail_calls": {"acl.rt.mallok": 1}}})
        )
    with pytest.raises(
        ConfigError, match="sim.device_count: 1 devices, but runtime.devices uses device 1"
    ):
        AclSimBackend(
            RuntimeConfig(backend="acl-sim", devices=(0, 1), options={"sim": {"device_count": 1}})
        )


def test_a_fault_on_a_device_the_config_does_not_use_is_a_config_error() -> None:
    """It would never happen: a typo in a fault test that silently tests nothing."""
    options = {"sim": {"device_lost_after_n_executes": {"7": 3}}}
    with pytest.raises(ConfigError, match=r"devices \[7\] are not in runtime.devices \[0, 1\]"):
        AclSimBackend(RuntimeConfig(backend="acl-sim", devices=(0, 1), options=options))


def test_a_device_id_beyond_the_simulated_machine_is_a_config_error() -> None:
    """The simulator sized itself to the largest id: 2**31 - 1 built tables for 2**31
    devices until memory ran out."""
    with pytest.raises(ConfigError, match="runtime.devices: device 2147483647, but the simulator"):
        AclSimBackend(RuntimeConfig(backend="acl-sim", devices=(0, 2**31 - 1)))


@pytest.mark.parametrize(
    ("devices", "sim", "message"),
    [
        ((0,), {"fail_calls": {"acl.rt.mallok": 1}}, r"fail_calls: unknown \['acl\.rt\.mallok'\]"),
        ((0, 1), {"device_count": 1}, "device_count: 1 devices, but runtime.devices uses device 1"),
        ((0,), {"device_lost_after_n_executes": {"7": 3}}, r"devices \[7\] are not in"),
        ((2**31 - 1,), {}, "runtime.devices: device 2147483647, but the simulator"),
    ],
)
def test_options_the_simulator_refuses_are_refused_without_opening_it(
    devices: tuple[int, ...], sim: dict[str, Any], message: str
) -> None:
    """A SIGHUP checks [runtime] with check_runtime: these passed it (`reload_needs_restart`)
    and the next start then exited 2 on them."""
    config = RuntimeConfig(backend="acl-sim", devices=devices, options={"sim": sim})
    with pytest.raises(ConfigError, match=message):
        check_runtime(config)
    with pytest.raises(ConfigError, match=message):
        open_backend(config)


def test_registry_opens_acl_sim() -> None:
    with open_backend(RuntimeConfig(backend="acl-sim")) as backend:
        assert isinstance(backend, AclSimBackend) and backend.name == "acl-sim"
        assert backend.queue_mode_available


def test_a_relative_acl_config_path_is_taken_from_the_config_folder(tmp_path: Path) -> None:
    """As README says of relative file paths in a config: the acl.json that acl.init reads
    sits beside the config file, not in the daemon's working directory."""
    (tmp_path / "etc").mkdir()
    config_file = tmp_path / "etc" / "streamer.toml"
    config_file.write_text(
        '[[ingress]]\nuri = "pull+bind:tcp://127.0.0.1:5555"\n'
        '[[egress]]\nuri = "pub+bind:tcp://127.0.0.1:5556"\n'
        '[runtime]\nbackend = "acl-sim"\n[runtime.options]\nacl_config_path = "acl.json"\n'
        '[[models]]\nname = "face"\npath = "face.om"\n'
        'preprocess = { kind = "letterbox" }\npostprocess = { kind = "blazeface" }\n'
    )
    with open_backend(load_config(config_file).runtime) as backend:
        assert isinstance(backend, AclSimBackend)
        inits = backend.simulator.log.calls("acl.init")
    assert [call.args for call in inits] == [(str(tmp_path.resolve() / "etc" / "acl.json"),)]


def test_acl_without_pyacl_says_what_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "acl", None)  # makes `import acl` fail, even on a CANN box
    with pytest.raises(BackendError) as caught:
        open_backend(RuntimeConfig(backend="acl"))
    message = str(caught.value)
    assert "source /usr/local/Ascend/ascend-toolkit/set_env.sh" in message
    assert "CANN toolkit" in message and '"acl-sim"' in message
    assert AclBackend.name == "acl"


@pytest.mark.parametrize("kind", ["letterbox", "mtcnn_rnet"])
def test_the_in_graph_rewrite_is_refused(
    make_backend: MakeBackend, short_range_model: Path, kind: str
) -> None:
    """``normalize = "model"`` rewrites an ONNX graph on onnxruntime; ACL runs a compiled
    .om, so it is a config error at load, not a silent ``device`` (the fixture checks that
    nothing was left allocated)."""
    backend = make_backend()
    spec = ModelSpec(
        "face", short_range_model, preprocess=PluginConfig(kind=kind, normalize="model")
    )
    with pytest.raises(ConfigError, match='normalize: "model" is the onnxruntime backend') as e:
        backend.load(spec)
    assert "`streamer models sim-layout` lays the models out" in str(e.value)

import re
import threading
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
from click.testing import CliRunner
from onnx import TensorProto, helper
from structlog.testing import capture_logs

from streamer.cli import main
from streamer.config import PluginConfig, RuntimeConfig
from streamer.errors import BackendError, ConfigError, EnqueueInterruptedError, ModelError
from streamer.runtime import ModelSpec, open_backend
from streamer.runtime.base import QueueModel
from streamer.runtime.onnx import _check_providers


def test_model_info_and_fifo_batches(short_range_model: Path) -> None:
    spec = ModelSpec("face", short_range_model, max_in_flight=3, batch_gears=(1, 2, 4))
    with open_backend(RuntimeConfig(options={"intra_op_threads": 1})) as backend:
        with backend.load(spec) as model:
            info = model.info
            assert [t.name for t in info.inputs] == ["input"]
            assert info.inputs[0].shape == (-1, 3, 128, 128) and info.dynamic_batch
            assert [t.shape for t in info.outputs] == [(-1, 896, 16), (-1, 896, 1)]
            assert info.batch_gears == (1, 2, 4)
            rng = np.random.default_rng(0)
            batches = [rng.uniform(-1, 1, (n, 3, 128, 128)).astype(np.float32) for n in (1, 4, 2)]
            model.attach_thread()
            for batch in batches:
                model.enqueue([batch])
            for batch in batches:
                done = model.dequeue(5000)
                assert done is not None and done.error is None and done.outputs is not None
                assert done.outputs[0].shape == (len(batch), 896, 16)
                assert done.end_ns >= done.start_ns > 0
            assert model.dequeue(10) is None


def test_a_bad_batch_fails_alone(short_range_model: Path) -> None:
    with (
        open_backend(RuntimeConfig()) as backend,
        backend.load(ModelSpec("face", short_range_model)) as model,
    ):
        model.enqueue([np.zeros((1, 3, 64, 64), np.float32)])
        model.enqueue([np.zeros((1, 3, 128, 128), np.float32)])
        bad, good = model.dequeue(5000), model.dequeue(5000)
        assert bad is not None and bad.error is not None
        assert bad.error.reason == "inference_failed" and bad.outputs is None
        assert good is not None and good.error is None


def test_missing_and_invalid_model_files(tmp_path: Path) -> None:
    with open_backend(RuntimeConfig()) as backend:
        with pytest.raises(ModelError, match="no file"):
            backend.load(ModelSpec("face", tmp_path / "none.onnx"))
        junk = tmp_path / "junk.onnx"
        junk.write_bytes(b"not a model")
        with pytest.raises(ModelError, match="cannot load"):
            backend.load(ModelSpec("face", junk))
        with pytest.raises(ModelError, match=f"cannot read {tmp_path}: Is a directory"):
            backend.load(ModelSpec("face", tmp_path))


def test_in_graph_preprocessing_is_logged_once_per_model_and_normalisation(
    short_range_model: Path,
) -> None:
    """Each replica and each reload loads the model again; the line says what the graph
    does, once (it came twice at every start of the default config, two replicas)."""
    letterbox = {"kind": "letterbox", "normalize": "model", "mean": 0.5, "std": 0.5}
    spec = ModelSpec("face", short_range_model, preprocess=PluginConfig(**letterbox))
    bgr = ModelSpec("face", short_range_model, preprocess=PluginConfig(**letterbox, color="bgr"))
    with capture_logs() as logs, open_backend(RuntimeConfig()) as backend:
        for each in (spec, spec, bgr, spec, ModelSpec("face", short_range_model)):
            with backend.load(each) as model:
                assert model.info.inputs[0].dtype == (np.uint8 if each.preprocess else np.float32)
    said = [(e["model"], e["swap_rb"]) for e in logs if e["event"] == "preprocess_in_graph"]
    assert said == [("face", True), ("face", False)]


def second_enqueue(
    model: QueueModel, batch: np.ndarray
) -> tuple[threading.Thread, list[BackendError]]:
    """Enqueue ``batch`` on a thread of its own, after one batch already went in: the
    thread, and the BackendError it raised, if any."""
    model.enqueue([batch])
    errors: list[BackendError] = []

    def enqueue() -> None:
        try:
            model.enqueue([batch])
        except BackendError as exc:
            errors.append(exc)

    thread = threading.Thread(target=enqueue)
    thread.start()
    thread.join(0.3)
    assert thread.is_alive()  # held back by the batch in flight
    return thread, errors


def test_enqueue_blocks_beyond_max_in_flight(short_range_model: Path) -> None:
    with (
        open_backend(RuntimeConfig()) as backend,
        backend.load(ModelSpec("face", short_range_model, max_in_flight=1)) as model,
    ):
        batch = np.zeros((1, 3, 128, 128), np.float32)
        second, errors = second_enqueue(model, batch)
        assert model.dequeue(5000) is not None
        second.join(5)
        assert not second.is_alive() and not errors
        assert model.dequeue(5000) is not None


def test_interrupt_ends_an_enqueue_waiting_for_room(short_range_model: Path) -> None:
    with (
        open_backend(RuntimeConfig()) as backend,
        backend.load(ModelSpec("face", short_range_model, max_in_flight=1)) as model,
    ):
        batch = np.zeros((1, 3, 128, 128), np.float32)
        second, errors = second_enqueue(model, batch)
        model.interrupt()
        second.join(5)
        assert not second.is_alive() and isinstance(errors[0], EnqueueInterruptedError)
        with pytest.raises(EnqueueInterruptedError, match="interrupted"):
            model.enqueue([batch])  # and every later one gives up at once


@pytest.mark.parametrize(
    ("options", "says"),
    [
        ({"intra_op_thread": 1}, "runtime.options.intra_op_thread: unknown key"),
        ({"intra_op_threads": -1}, "runtime.options.intra_op_threads: Input should be greater"),
        ({"providers": []}, "runtime.options.providers: Tuple should have at least 1 item"),
        ({"intra_op_threads": True}, "runtime.options.intra_op_threads: Input should be a valid"),
        ({"intra_op_threads": "2"}, "runtime.options.intra_op_threads: Input should be a valid"),
        ({"rows_per_run": -1}, "runtime.options.rows_per_run: Input should be greater"),
        (
            {"providers": ["CPUExecutionProvider", "NopeExecutionProvider"]},
            "runtime.options.providers: Value error, ['NopeExecutionProvider'] not in this "
            "onnxruntime build",
        ),
    ],
)
def test_unknown_or_invalid_options_are_config_errors(options: dict[str, Any], says: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(says)):
        open_backend(RuntimeConfig(options=options))


def test_a_models_own_options_are_checked_too(short_range_model: Path) -> None:
    spec = ModelSpec("face", short_range_model, options={"intra_op_threadz": 2})
    with open_backend(RuntimeConfig()) as backend:
        with pytest.raises(ConfigError, match="model 'face' options.intra_op_threadz: unknown key"):
            backend.load(spec)


def test_streamer_check_exits_2_on_an_option_typo(tmp_path: Path) -> None:
    config = tmp_path / "c.toml"
    config.write_text(
        '[[ingress]]\nuri = "pull+bind:tcp://127.0.0.1:5555"\n'
        '[[egress]]\nuri = "pub+bind:tcp://127.0.0.1:5556"\n'
        "[runtime.options]\nintra_op_thread = 1\n"
        '[[models]]\nname = "face"\nasset = "blazeface_short_range"\n'
        'preprocess = { kind = "letterbox" }\npostprocess = { kind = "blazeface" }\n'
    )
    result = CliRunner().invoke(main, ["check", "--config", str(config)])
    assert result.exit_code == 2
    assert (
        "runtime.options.intra_op_thread: unknown key (known: intra_op_threads, providers, "
        "rows_per_run); "
        "did you mean 'intra_op_threads'?" in result.output
    )


def test_a_session_none_of_whose_providers_started_is_a_backend_error(
    short_range_model: Path,
) -> None:
    """onnxruntime runs on the CPU when the providers asked for cannot start (a CUDA build
    without a GPU), saying so only on stderr: asked for CUDA alone, the daemon served on
    the CPU; asked for CUDA then the CPU, it may, and says so."""
    spec = ModelSpec("face", short_range_model)
    cpu = ["CPUExecutionProvider"]
    with pytest.raises(BackendError, match=r"none of runtime.options.providers \['CUDA"):
        _check_providers(spec, ["CUDAExecutionProvider"], cpu)
    with capture_logs() as logs:
        _check_providers(spec, ["CUDAExecutionProvider", *cpu], cpu)
        _check_providers(spec, cpu, cpu)
    assert [(e["event"], e["active"]) for e in logs] == [("provider_fallback", cpu)]


def _centering_model(path: Path, output_rows: str | int = "batch") -> Path:
    """y = x - mean(x over the batch axis): a run's outputs depend on the rows it ran with,
    so they show how a batch was cut. ``output_rows`` names y's first dimension; y has
    ``mean``'s single row instead when it is 1."""
    mean = helper.make_node("ReduceMean", ["x"], ["mean"], axes=[0], keepdims=1)
    last = helper.make_node("Sub", ["x", "mean"], ["y"])
    if output_rows == 1:
        last = helper.make_node("Identity", ["mean"], ["y"])
    graph = helper.make_graph(
        [mean, last],
        "centering",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [output_rows, 3])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    onnx.save(model, path)
    return path


def _run(model: QueueModel, batch: np.ndarray) -> np.ndarray:
    model.enqueue([batch])
    done = model.dequeue(5000)
    assert done is not None and done.error is None and done.outputs is not None
    return np.asarray(done.outputs[0])


def _centred_in_runs(batch: np.ndarray, rows: int) -> np.ndarray:
    runs = [batch[i : i + rows] for i in range(0, len(batch), rows)]
    return np.concatenate([run - run.mean(axis=0, keepdims=True) for run in runs])


def test_rows_per_run_cuts_a_batch_into_runs_and_joins_their_outputs(tmp_path: Path) -> None:
    path = _centering_model(tmp_path / "centering.onnx")
    batch = np.arange(15, dtype=np.float32).reshape(5, 3) ** 2
    with open_backend(RuntimeConfig(options={"rows_per_run": 2})) as backend:
        with backend.load(ModelSpec("c", path)) as model:
            assert model.rows_per_run == 2
            np.testing.assert_allclose(_run(model, batch), _centred_in_runs(batch, 2))
            np.testing.assert_allclose(_run(model, batch[:2]), _centred_in_runs(batch[:2], 2))
        with backend.load(ModelSpec("c", path, options={"rows_per_run": 0})) as whole:
            np.testing.assert_allclose(_run(whole, batch), _centred_in_runs(batch, 5))


def test_rows_per_run_gives_blazeface_the_same_outputs(short_range_model: Path) -> None:
    batch = np.random.default_rng(0).uniform(-1, 1, (8, 3, 128, 128)).astype(np.float32)
    outputs = {}
    for rows in (0, 2, 3):
        options = {"intra_op_threads": 1, "rows_per_run": rows}
        with open_backend(RuntimeConfig(options=options)) as backend:
            with backend.load(ModelSpec("face", short_range_model)) as model:
                model.enqueue([batch])
                done = model.dequeue(5000)
                assert done is not None and done.outputs is not None
                outputs[rows] = done.outputs
    for rows in (2, 3):
        for cut, whole in zip(outputs[rows], outputs[0], strict=True):
            assert cut.shape == whole.shape
            np.testing.assert_allclose(cut, whole, rtol=1e-4, atol=1e-4)


def test_rows_per_run_is_ignored_without_a_named_batch_axis(tmp_path: Path) -> None:
    """An output whose first dimension is not the inputs' named one cannot be joined: the
    model runs whole batches, said once per model (not per replica or reload)."""
    path = _centering_model(tmp_path / "fixed.onnx", output_rows=1)
    batch = np.ones((4, 3), np.float32)
    with (
        capture_logs() as logs,
        open_backend(RuntimeConfig(options={"rows_per_run": 2})) as backend,
    ):
        for _ in range(2):
            with backend.load(ModelSpec("c", path)) as model:
                assert model.rows_per_run == 0
                assert _run(model, batch).shape == (1, 3)
    said = [e for e in logs if e["event"] == "rows_per_run_ignored"]
    assert [(e["model"], e["rows_per_run"]) for e in said] == [("c", 2)]


def _filtering_model(path: Path) -> Path:
    """y = the rows of x whose first value is above 5, declared ``["batch", 3]`` as x is."""
    nodes = [
        helper.make_node("Gather", ["x", "zero"], ["first"], axis=1),
        helper.make_node("Greater", ["first", "five"], ["keep"]),
        helper.make_node("Compress", ["x", "keep"], ["y"], axis=0),
    ]
    constants = [
        helper.make_tensor("zero", TensorProto.INT64, [], [0]),
        helper.make_tensor("five", TensorProto.FLOAT, [], [5.0]),
    ]
    graph = helper.make_graph(
        nodes,
        "filtering",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 3])],
        constants,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    onnx.save(model, path)
    return path


def test_an_output_that_is_not_batch_first_after_all_turns_rows_per_run_off(
    tmp_path: Path,
) -> None:
    """The output says ``batch`` but has other rows: the first cut batch runs again whole,
    with a warning, and the model's later batches run whole."""
    path = _filtering_model(tmp_path / "filtering.onnx")
    batch = np.arange(12, dtype=np.float32).reshape(4, 3)
    with (
        capture_logs() as logs,
        open_backend(RuntimeConfig(options={"rows_per_run": 2})) as backend,
    ):
        with backend.load(ModelSpec("c", path)) as model:
            assert model.rows_per_run == 2
            for _ in range(2):
                np.testing.assert_allclose(_run(model, batch), batch[2:])
            assert model.rows_per_run == 0
    warned = [e for e in logs if e["event"] == "rows_per_run_off"]
    assert [(e["model"], e["rows"], e["output_shapes"]) for e in warned] == [("c", 2, [[0, 3]])]

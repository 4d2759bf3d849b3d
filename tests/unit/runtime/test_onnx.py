import re
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from click.testing import CliRunner
from onnx import TensorProto, helper
from onnx_graphs import spin_body
from structlog.testing import capture_logs

from streamer.cli import main
from streamer.config import PluginConfig, RuntimeConfig
from streamer.errors import BackendError, ConfigError, EnqueueInterruptedError, ModelError
from streamer.release import abandoned
from streamer.runtime import ModelSpec, open_backend
from streamer.runtime import onnx as onnx_runtime
from streamer.runtime.base import QueueModel
from streamer.runtime.onnx import _check_providers
from streamer.runtime.onnx_rows import RowRuns


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


def _model(
    path: Path, nodes: list[Any], y_shape: list[Any], constants: tuple[Any, ...] = ()
) -> Path:
    """A one-input graph, x float ``["batch", 3]`` → y float ``y_shape``, saved at ``path``."""
    graph = helper.make_graph(
        nodes,
        path.stem,
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, y_shape)],
        list(constants),
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    onnx.save(model, path)
    return path


def _int64(name: str, *values: int) -> Any:
    return helper.make_tensor(name, TensorProto.INT64, [len(values)], list(values))


def _doubling(path: Path) -> Path:
    """y = x + x: rows independent, the model rows_per_run is for."""
    return _model(path, [helper.make_node("Add", ["x", "x"], ["y"])], ["batch", 3])


def _centering(path: Path) -> Path:
    """y = x - mean(x over the batch axis): its rows mix."""
    mean = helper.make_node("ReduceMean", ["x"], ["mean"], axes=[0], keepdims=1)
    return _model(path, [mean, helper.make_node("Sub", ["x", "mean"], ["y"])], ["batch", 3])


def _filtering(path: Path) -> Path:
    """y = the rows of x whose first value is above 5, declared ``["batch", 3]``."""
    nodes = [
        helper.make_node("Gather", ["x", "zero"], ["first"], axis=1),
        helper.make_node("Greater", ["first", "five"], ["keep"]),
        helper.make_node("Compress", ["x", "keep"], ["y"], axis=0),
    ]
    constants = (
        helper.make_tensor("zero", TensorProto.INT64, [], [0]),
        helper.make_tensor("five", TensorProto.FLOAT, [], [5.0]),
    )
    return _model(path, nodes, ["batch", 3], constants)


def _narrowing(path: Path) -> Path:
    """y = the first k columns of x, k = the batch's largest first value: a padded output
    whose width depends on the batch's data."""
    nodes = [
        helper.make_node("Gather", ["x", "zero"], ["first"], axis=1),
        helper.make_node("ReduceMax", ["first"], ["most"], keepdims=1),
        helper.make_node("Cast", ["most"], ["k"], to=TensorProto.INT64),
        helper.make_node("Slice", ["x", "start", "k", "axis"], ["y"]),
    ]
    constants = (
        helper.make_tensor("zero", TensorProto.INT64, [], [0]),
        _int64("start", 0),
        _int64("axis", 1),
    )
    return _model(path, nodes, ["batch", "k"], constants)


def _swapping(path: Path) -> Path:
    """y = x reshaped to (3, batch) through a computed shape, declared ``["batch", 3]``."""
    nodes = [
        helper.make_node("Shape", ["x"], ["shape"]),
        helper.make_node("Gather", ["shape", "order"], ["swapped"], axis=0),
        helper.make_node("Reshape", ["x", "swapped"], ["y"]),
    ]
    return _model(path, nodes, ["batch", 3], (_int64("order", 1, 0),))


class _Recording:
    """A session that records the rows of each run."""

    def __init__(self, session: ort.InferenceSession) -> None:
        self.session, self.rows = session, []

    def __getattr__(self, name: str) -> Any:
        return getattr(self.session, name)

    def run(self, names: Any, feed: dict[str, np.ndarray]) -> Any:
        self.rows.append(len(feed["x"]))
        return self.session.run(names, feed)


def _run(model: QueueModel, batch: np.ndarray) -> np.ndarray:
    model.enqueue([batch])
    done = model.dequeue(5000)
    assert done is not None and done.error is None and done.outputs is not None
    return np.asarray(done.outputs[0])


def test_rows_per_run_cuts_a_batch_into_runs_and_joins_their_outputs(tmp_path: Path) -> None:
    """The first batch cut also runs whole, to compare; the next ones only cut."""
    session = _Recording(ort.InferenceSession(str(_doubling(tmp_path / "doubling.onnx"))))
    runs = RowRuns("d", session, rows_per_run=2)
    batch = np.arange(15, dtype=np.float32).reshape(5, 3)
    for _ in range(2):
        np.testing.assert_array_equal(runs.run(session, [batch])[0], batch * 2)
    np.testing.assert_array_equal(runs.run(session, [batch[:2]])[0], batch[:2] * 2)
    assert session.rows == [2, 2, 1, 5, 2, 2, 1, 2] and runs.rows_per_run == 2


def test_rows_per_run_gives_blazeface_the_same_outputs(short_range_model: Path) -> None:
    batch = np.random.default_rng(0).uniform(-1, 1, (8, 3, 128, 128)).astype(np.float32)
    outputs = {}
    for rows in (0, 2, 3):
        options = {"intra_op_threads": 1, "rows_per_run": rows}
        with open_backend(RuntimeConfig(options=options)) as backend:
            with backend.load(ModelSpec("face", short_range_model)) as model:
                assert model.rows_per_run == rows
                for _ in range(2):  # the second batch is cut without a whole run beside it
                    model.enqueue([batch])
                    done = model.dequeue(5000)
                    assert done is not None and done.outputs is not None
                    outputs[rows] = done.outputs
                assert model.rows_per_run == rows
    for rows in (2, 3):
        for cut, whole in zip(outputs[rows], outputs[0], strict=True):
            assert cut.shape == whole.shape
            np.testing.assert_allclose(cut, whole, rtol=1e-4, atol=1e-4)


def test_rows_per_run_is_ignored_without_a_named_batch_axis(tmp_path: Path) -> None:
    """An output whose first dimension is not the inputs' named one cannot be joined: the
    model runs whole batches, with a warning once per model (not per replica or reload)."""
    path = _model(
        tmp_path / "one.onnx", [helper.make_node("ReduceMean", ["x"], ["y"], axes=[0])], [1, 3]
    )
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
    assert [(e["model"], e["rows_per_run"], e["log_level"]) for e in said] == [("c", 2, "warning")]


@pytest.mark.parametrize(
    ("build", "rows", "says"),
    [
        (_centering, 2, "output 0 differs between whole and cut batches (rows not independent)"),
        (_swapping, 3, "output 0 is [3, 6] whole, [6, 3] cut"),
        (_filtering, 2, "an output is not batch-first or changes shape"),
        (_narrowing, 2, "an output is not batch-first or changes shape"),
    ],
)
def test_a_model_that_cannot_be_cut_runs_whole_batches_after_one_warning(
    tmp_path: Path, build: Callable[[Path], Path], rows: int, says: str
) -> None:
    """Rows that mix, an output that is not batch-first after all or whose width depends on
    the batch: the batch runs whole (its result is the whole run's), then every later one,
    with one warning for the model however many replicas see it."""
    path = build(tmp_path / "model.onnx")
    batch = np.array([[1, 1, 1], [2, 2, 2], [6, 1, 2], [3, 3, 3], [1, 2, 3], [7, 0, 0]], np.float32)
    whole = ort.InferenceSession(str(path)).run(None, {"x": batch})[0]
    with (
        capture_logs() as logs,
        open_backend(RuntimeConfig(options={"rows_per_run": rows})) as backend,
    ):
        for replica in range(2):
            with backend.load(ModelSpec(f"{build.__name__}", path)) as model:
                assert model.rows_per_run == rows
                for _ in range(2):
                    np.testing.assert_allclose(_run(model, batch), whole)
                assert model.rows_per_run == 0, replica
    warned = [e for e in logs if e["event"] == "rows_per_run_off"]
    assert [(e["rows_per_run"], e["detail"]) for e in warned] == [
        (rows, f"{says}: batches run whole")
    ]


def test_a_first_cut_batch_that_cannot_run_whole_is_kept_unchecked(tmp_path: Path) -> None:
    """rows_per_run may be there because a whole batch does not fit (the device's memory):
    the check's whole run failing costs the batch nothing, and later batches are cut."""
    nodes = [  # y = x expanded to (min(batch, 2), 3): fails for batches of more than 2
        helper.make_node("Shape", ["x"], ["shape"]),
        helper.make_node("Slice", ["shape", "zero", "one"], ["rows"]),
        helper.make_node("Min", ["rows", "two"], ["kept"]),
        helper.make_node("Concat", ["kept", "three"], ["target"], axis=0),
        helper.make_node("Expand", ["x", "target"], ["y"]),
    ]
    constants = (_int64("zero", 0), _int64("one", 1), _int64("two", 2), _int64("three", 3))
    path = _model(tmp_path / "small.onnx", nodes, ["batch", 3], constants)
    batch = np.arange(12, dtype=np.float32).reshape(4, 3)
    with (
        capture_logs() as logs,
        open_backend(RuntimeConfig(options={"rows_per_run": 2})) as backend,
        backend.load(ModelSpec("small", path)) as model,
    ):
        for _ in range(2):
            np.testing.assert_array_equal(_run(model, batch), batch)
        assert model.rows_per_run == 2
    assert [e["model"] for e in logs if e["event"] == "rows_per_run_unchecked"] == ["small"]


@pytest.mark.parametrize(
    "first",
    [np.zeros((4, 3), np.float32), np.full((4, 3), np.nan, np.float32)],
    ids=["equal rows", "NaN rows"],
)
def test_rows_that_mix_are_found_after_a_first_batch_that_cannot_show_it(
    tmp_path: Path, first: np.ndarray
) -> None:
    """Black frames (rows all equal: not checked, nothing run twice) or outputs all NaN
    (checked, but no proof) leave the check for the next batch whose rows differ."""
    session = _Recording(ort.InferenceSession(str(_centering(tmp_path / "centering.onnx"))))
    runs = RowRuns("centering", session, rows_per_run=2)
    batch = np.arange(12, dtype=np.float32).reshape(4, 3)
    with capture_logs() as logs:
        assert runs.run(session, [first])[0].shape == (4, 3)
        np.testing.assert_allclose(runs.run(session, [batch])[0], batch - batch.mean(axis=0))
        runs.run(session, [batch])
    checked = [] if first[0, 0] == 0 else [4]
    assert session.rows == [2, 2, *checked, 2, 2, 4, 4] and runs.rows_per_run == 0
    assert [e["event"] for e in logs] == ["rows_per_run_off"]


def test_outputs_with_a_column_of_minus_infinity_are_checked_once(tmp_path: Path) -> None:
    """Masked logits hold -inf: a check that wanted every output finite ran every batch
    twice."""
    nodes = [
        helper.make_node("Mul", ["x", "zero"], ["zeros"]),
        helper.make_node("Log", ["zeros"], ["minus_inf"]),
        helper.make_node("Concat", ["x", "minus_inf"], ["y"], axis=1),
    ]
    zero = helper.make_tensor("zero", TensorProto.FLOAT, [], [0.0])
    path = _model(tmp_path / "masked.onnx", nodes, ["batch", 6], (zero,))
    session = _Recording(ort.InferenceSession(str(path)))
    runs = RowRuns("masked", session, rows_per_run=2)
    batch = np.arange(12, dtype=np.float32).reshape(4, 3)
    for _ in range(2):
        out = runs.run(session, [batch])[0]
        assert out.shape == (4, 6) and np.isneginf(out[:, 3:]).all()
    assert session.rows == [2, 2, 4, 2, 2] and runs.rows_per_run == 2


def slow_model(path: Path, turns: int) -> Path:
    """A model of input ``x`` float32 (N,) whose execution spins a ``Loop`` of ``turns``
    turns (about 1 µs each) before its output ``y`` (N,)."""
    body = spin_body()
    graph = helper.make_graph(
        [
            helper.make_node("ReduceMean", ["x"], ["mean"], keepdims=1),  # (1,), from the input
            helper.make_node("Loop", ["turns", "true", "mean"], ["v"], body=body),
            helper.make_node("Add", ["x", "v"], ["y"]),
        ],
        "slow",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N"])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N"])],
        [
            helper.make_tensor("turns", TensorProto.INT64, [], [turns]),
            helper.make_tensor("true", TensorProto.BOOL, [], [True]),
        ],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    onnx.save(model, path)
    return path


def test_a_run_given_up_on_at_close_is_no_longer_abandoned_once_it_returned(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A slow run outlasting its model's close (a reload retiring it) was recorded as
    abandoned for good: the daemon's every later exit, a plain SIGTERM weeks on, was
    ``exit_forced`` with exit code 1, though nothing ran in native code any more."""
    monkeypatch.setattr(onnx_runtime, "_CLOSE_TIMEOUT_S", 0.1)
    spec = ModelSpec("slow", slow_model(tmp_path / "slow.onnx", 1_000_000))
    with capture_logs() as logs, open_backend(RuntimeConfig()) as backend:
        model = backend.load(spec)
        model.enqueue([np.zeros(2, np.float32)])
        model.close()  # the run, queued before the close's end marker, takes a second
        assert any(e["event"] == "model_close_timeout" for e in logs)
        left = [what for what in abandoned() if what.startswith("model 'slow': onnx-slow/")]
        assert len(left) == 1
        deadline = time.monotonic() + 30
        while left[0] in abandoned() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert left[0] not in abandoned()

"""End-to-end harness: the real daemon as a subprocess, on loopback TCP ports.

Producers and subscribers are the project's own clients (``streamer.clients``), so these
tests run what a user runs.
"""

from __future__ import annotations

import json
import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.request import urlopen

import cv2
import numpy as np
import onnx
import pytest
import zmq
from onnx import TensorProto, helper
from onnx_graphs import spin_body
from prometheus_client.parser import text_string_to_metric_families

from streamer.bench.bench_config import free_port
from streamer.clients.subscriber import Subscriber
from streamer.config import Config, load_config
from streamer.config_writer import write_config
from streamer.sim_layout import sim_layout
from streamer.transport.protocol import encode_frame

READY_TIMEOUT_S = 60.0
ROOT = Path(__file__).resolve().parents[2]


CONFIG = """
[daemon]
drain_timeout_s = {drain_timeout_s}
log_format = "json"
http_address = "127.0.0.1:{http_port}"
{daemon_extra}

[[ingress]]
uri = "pull+bind:tcp://127.0.0.1:{in_port}"
{ingress_extra}

[[egress]]
uri = "pub+bind:tcp://127.0.0.1:{out_port}"

[runtime]
backend = "{backend}"
{runtime_extra}

[[models]]
name = "face"
{model_source}
mode = "{mode}"

[models.batch]
max_size = {max_size}
max_delay_ms = {max_delay_ms}
gears = {gears}

[models.preprocess]
kind = "letterbox"
{preprocess_extra}

[models.postprocess]
kind = "blazeface"
{postprocess_extra}
"""


LIVE_DAEMONS: list[Daemon] = []
"""Every daemon started by the test running now; killed after it, however it ended."""


@pytest.fixture(autouse=True)
def _no_daemon_outlives_its_test() -> Iterator[None]:
    yield
    while LIVE_DAEMONS:
        LIVE_DAEMONS.pop().close()


class Daemon:
    """A ``streamer run`` subprocess with its JSON log lines collected on a thread."""

    def __init__(
        self,
        config_path: Path,
        in_port: int,
        out_port: int,
        http_port: int,
        env: dict[str, str] | None = None,
    ) -> None:
        self.config_path = config_path
        self.ingress = f"tcp://127.0.0.1:{in_port}"
        self.egress = f"tcp://127.0.0.1:{out_port}"
        self.http = f"http://127.0.0.1:{http_port}"
        self.logs: list[dict[str, Any]] = []
        self._lines: queue.SimpleQueue[dict[str, Any]] = queue.SimpleQueue()
        self.process = subprocess.Popen(
            [sys.executable, "-m", "streamer", "run", "--config", str(config_path)],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            env={**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})},
        )
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        LIVE_DAEMONS.append(self)

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            try:
                entry = json.loads(line)
            except json.JSONDecodeError:
                entry = {"event": "raw", "line": line.rstrip()}
            self.logs.append(entry)
            self._lines.put(entry)

    def wait_event(self, event: str, timeout_s: float = READY_TIMEOUT_S) -> dict[str, Any]:
        deadline = time.monotonic() + timeout_s
        while (left := deadline - time.monotonic()) > 0:
            try:
                entry = self._lines.get(timeout=left)
            except queue.Empty:
                break
            if entry.get("event") == event:
                return entry
        raise AssertionError(f"no {event!r} log line in {timeout_s} s; logs: {self.logs[-20:]}")

    def stop(self, timeout_s: float = 30.0) -> int:
        """SIGTERM, then the exit code; kills it if it does not exit in ``timeout_s``."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        try:
            code = self.process.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
            raise
        self.close()
        return code

    def close(self) -> None:
        """Kill the process if it still runs, and release its pipe."""
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait()
        self._reader.join(5)
        assert self.process.stdout is not None
        self.process.stdout.close()

    def final_counts(self) -> dict[str, Any]:
        stopped = [e for e in self.logs if e.get("event") == "stopped"]
        assert stopped, self.logs[-20:]
        return stopped[-1]


@pytest.fixture
def start_daemon(tmp_path: Path, assets: dict[str, Path]) -> Iterator[Callable[..., Daemon]]:
    """Start a daemon with the given settings; every daemon is stopped at teardown."""
    daemons: list[Daemon] = []

    def start(
        backend: str = "onnxruntime",
        mode: str = "auto",
        max_size: int = 8,
        max_delay_ms: float = 5.0,
        gears: tuple[int, ...] = (),
        drain_timeout_s: float = 10.0,
        model_path: Path | None = None,
        runtime_extra: str = "",
        daemon_extra: str = "",
        ingress_extra: str = "",
        preprocess_extra: str = "",
        postprocess_extra: str = "",
        asset: str = "blazeface_short_range",
        env: dict[str, str] | None = None,
        wait_ready: bool = True,
    ) -> Daemon:
        in_port, out_port, http_port = free_port(), free_port(), free_port()
        source = f'path = "{model_path}"' if model_path else f'asset = "{asset}"'
        path = tmp_path / f"daemon{len(daemons)}.toml"
        path.write_text(
            CONFIG.format(
                in_port=in_port,
                out_port=out_port,
                http_port=http_port,
                backend=backend,
                mode=mode,
                max_size=max_size,
                max_delay_ms=max_delay_ms,
                gears=list(gears),
                drain_timeout_s=drain_timeout_s,
                model_source=source,
                runtime_extra=runtime_extra,
                daemon_extra=daemon_extra,
                ingress_extra=ingress_extra,
                preprocess_extra=preprocess_extra,
                postprocess_extra=postprocess_extra,
            )
        )
        daemon = Daemon(path, in_port, out_port, http_port, env)
        daemons.append(daemon)
        if wait_ready:
            daemon.wait_event("ready")
        return daemon

    yield start
    for daemon in daemons:
        daemon.close()


Edit = Callable[[str], str]
"""A change to a config's text."""


def shipped(
    name: str, folder: Path, edit: Edit = lambda text: text, layout: dict[str, Any] | None = None
) -> Daemon:
    """A daemon on :func:`shipped_config`, ready."""
    daemon = Daemon(*shipped_config(name, folder, edit, layout))
    daemon.wait_event("ready")
    return daemon


def streamer_check(config: Path) -> subprocess.CompletedProcess[str]:
    """``streamer check --config config`` in a subprocess: loads every model, opens no
    socket; its exit code and text output."""
    return subprocess.run(
        [sys.executable, "-m", "streamer", "check", "--config", str(config)],
        capture_output=True,
        text=True,
        timeout=120,
    )


def shipped_config(
    name: str, folder: Path, edit: Edit = lambda text: text, layout: dict[str, Any] | None = None
) -> tuple[Path, int, int, int]:
    """``configs/<name>``, edited, moved to free ports and JSON logs, written to
    ``folder/<name>``: the file and its ingress, egress and HTTP ports.

    With ``layout`` (keyword arguments of :func:`streamer.sim_layout.sim_layout`, e.g.
    :func:`sim_settings`) its models are laid out for the simulator in ``folder/models`` and
    the file runs them on ``acl-sim``; ``edit`` applies before the layout.
    """
    ports = free_port(), free_port(), free_port()
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    path.write_text(shipped_text(name, ports, edit))
    if layout is not None:
        write_config(sim_layout(load_config(path), folder / "models", **layout), path)
    return (path, *ports)


def shipped_text(
    name: str, ports: tuple[int, int, int], edit: Callable[[str], str] = lambda text: text
) -> str:
    """The text of ``configs/<name>``, edited, on the given ingress, egress and HTTP ports,
    logging JSON."""
    text = edit((ROOT / "configs" / name).read_text())
    text = re.sub(r"127\.0\.0\.1:5555\b", f"127.0.0.1:{ports[0]}", text)
    text = re.sub(r"127\.0\.0\.1:5556\b", f"127.0.0.1:{ports[1]}", text)
    text = text.replace('log_format = "auto"', 'log_format = "json"')
    if "[daemon]" in text:
        return text.replace("127.0.0.1:9555", f"127.0.0.1:{ports[2]}")
    return f'[daemon]\nlog_format = "json"\nhttp_address = "127.0.0.1:{ports[2]}"\n' + text


def to_acl_sim(text: str, options: str = "") -> str:
    """A config's text on ``backend = "acl-sim"``: its onnxruntime options (which the ACL
    backends refuse) replaced by ``options``, TOML lines under ``[runtime.options]``."""
    text = text.replace('backend = "onnxruntime"', 'backend = "acl-sim"')
    text = re.sub(r"^rows_per_run = .*$", "", text, flags=re.MULTILINE)
    return re.sub(r"^intra_op_threads = .*$", options, text, flags=re.MULTILINE)


class Client:
    """A raw PUSH socket and a subscriber on one daemon, synchronised before use."""

    def __init__(self, daemon: Daemon, probe_image: np.ndarray) -> None:
        self.context = zmq.Context()
        self.push = self.context.socket(zmq.PUSH)
        self.push.setsockopt(zmq.LINGER, 0)
        self.push.setsockopt(zmq.SNDTIMEO, 10_000)
        self.push.connect(daemon.ingress)
        self.subscriber = Subscriber(daemon.egress, context=self.context)
        self._probe = cv2.imencode(".jpg", probe_image)[1].tobytes()
        self.probes = 0
        self._sync()

    def probe(self) -> None:
        """Send one probe frame (source ``probe``; :meth:`collect` leaves their results out)."""
        self.send_parts(encode_frame("probe", self.probes, self._probe, encoding="jpeg"))
        self.probes += 1

    def _sync(self) -> None:
        """Send probe frames until one's result arrives: the subscription is then live."""
        for _ in range(100):
            self.probe()
            result = self.subscriber.receive(0.2)
            if result is not None and result["source"] == "probe":
                while self.subscriber.receive(0.2) is not None:
                    pass  # results of the other probes
                return
        raise AssertionError("the subscriber never received a result")

    def send_parts(self, parts: list[Any]) -> None:
        self.push.send_multipart(parts, copy=False)

    def collect(self, count: int, timeout_s: float = 30.0) -> list[dict[str, Any]]:
        results: list[dict[str, Any]] = []
        deadline = time.monotonic() + timeout_s
        while len(results) < count and time.monotonic() < deadline:
            result = self.subscriber.receive(0.5)
            if result is not None and result["source"] != "probe":
                results.append(result)
        return results

    def close(self) -> None:
        self.subscriber.close()
        self.push.close(linger=0)
        self.context.term()


@pytest.fixture
def connect(astronaut: np.ndarray) -> Iterator[Callable[[Daemon], Client]]:
    clients: list[Client] = []

    def make(daemon: Daemon) -> Client:
        client = Client(daemon, astronaut)
        clients.append(client)
        return client

    yield make
    for client in clients:
        client.close()


BACKENDS = ("onnxruntime", "acl-sim-queue", "acl-sim-async", "acl-sim-sync")
"""The daemon configurations the end-to-end suite runs on: the embedded default, and the ACL
backend on its simulator in each execution mode."""


def sim_settings(mode: str) -> dict[str, Any]:
    """:func:`streamer.sim_layout.sim_layout` arguments for the simulator in ``mode``: queue
    mode needs a static batch, 4; the other modes get batch gears 1, 2, 4, 8."""
    return {"mode": mode, "batch_sizes": (4,) if mode == "queue" else (1, 2, 4, 8)}


def backend_settings(name: str, model: Path, folder: Path) -> dict[str, Any]:
    """``start_daemon`` arguments for one of :data:`BACKENDS`.

    For the simulator the model is laid out as on an Ascend box (:func:`sim_settings`) in
    ``folder/<mode>``: ``face.om`` in the config, with ``face.onnx`` and the ATC manifest
    ``face.acl.json`` beside it.
    """
    if name == "onnxruntime":
        return {}
    mode = name.removeprefix("acl-sim-")
    face = {"name": "face", "path": str(model), "preprocess": {"kind": "letterbox"}}
    config = Config.model_validate(
        {
            "ingress": [{"uri": "pull+bind:tcp://127.0.0.1:5555"}],
            "egress": [{"uri": "pub+bind:tcp://127.0.0.1:5556"}],
            "models": [{**face, "postprocess": {"kind": "blazeface"}}],
        }
    )
    laid_out = sim_layout(config, folder / mode, **sim_settings(mode))
    return {
        "backend": "acl-sim",
        "mode": mode,
        "model_path": laid_out.models[0].path,
        "max_size": 4,
    }


@pytest.fixture(params=BACKENDS)
def backend(
    request: pytest.FixtureRequest, tmp_path: Path, assets: dict[str, Path]
) -> dict[str, Any]:
    """Each end-to-end test that takes this fixture runs once per backend configuration."""
    return backend_settings(request.param, assets["blazeface_short_range"], tmp_path / "models")


def wedge_model(path: Path) -> Path:
    """A model with BlazeFace short range's interface whose execution never ends.

    Input ``input`` float32 (N, 3, 128, 128); outputs ``regressors`` (N, 896, 16) and
    ``classificators`` (N, 896, 1). A ``Loop`` of 2**62 turns (about 1 µs each on a CPU)
    feeds both outputs, so onnxruntime can neither skip it nor fold it at load time (its
    carried value comes from the input).
    """
    body = spin_body()
    nodes = [
        helper.make_node("ReduceMean", ["input"], ["mean"], axes=[1, 2, 3], keepdims=1),
        helper.make_node("Reshape", ["mean", "n11"], ["per_frame"]),  # (N, 1, 1)
        helper.make_node("ReduceMean", ["input"], ["all"], keepdims=0),
        helper.make_node("Reshape", ["all", "one_dim"], ["v0"]),  # (1,)
        helper.make_node("Loop", ["trips", "true", "v0"], ["v"], body=body),
        helper.make_node("Mul", ["per_frame", "zero"], ["z"]),
        helper.make_node("Add", ["z", "v"], ["t"]),
        helper.make_node("Expand", ["t", "regressors_shape"], ["regressors"]),
        helper.make_node("Expand", ["t", "classificators_shape"], ["classificators"]),
    ]
    constants = [
        helper.make_tensor("n11", TensorProto.INT64, [3], [-1, 1, 1]),
        helper.make_tensor("one_dim", TensorProto.INT64, [1], [1]),
        helper.make_tensor("trips", TensorProto.INT64, [], [2**62]),
        helper.make_tensor("true", TensorProto.BOOL, [], [True]),
        helper.make_tensor("zero", TensorProto.FLOAT, [], [0.0]),
        helper.make_tensor("regressors_shape", TensorProto.INT64, [3], [1, 896, 16]),
        helper.make_tensor("classificators_shape", TensorProto.INT64, [3], [1, 896, 1]),
    ]
    graph = helper.make_graph(
        nodes,
        "wedge",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, ["N", 3, 128, 128])],
        [
            helper.make_tensor_value_info("regressors", TensorProto.FLOAT, ["N", 896, 16]),
            helper.make_tensor_value_info("classificators", TensorProto.FLOAT, ["N", 896, 1]),
        ],
        constants,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    onnx.checker.check_model(model, full_check=True)
    onnx.save(model, path)
    return path


def samples(daemon: Daemon, name: str) -> list[Any]:
    """The samples of one metric from /metrics (``name`` as exposed, e.g. ``…_total``;
    ``"up"`` is ``streamer_replica_up``)."""
    name = "streamer_replica_up" if name == "up" else name
    with urlopen(daemon.http + "/metrics", timeout=10) as response:
        text = response.read().decode()
    return [
        sample
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == name
    ]


def metric_by_label(daemon: Daemon, name: str, label: str) -> dict[str, float]:
    """The values of one metric from /metrics, by the value of its ``label``."""
    return {sample.labels[label]: sample.value for sample in samples(daemon, name)}


def wait_metric(daemon: Daemon, name: str, at_least: float, timeout_s: float = 30.0) -> float:
    """Poll /metrics until the samples of ``name`` (as :func:`samples` takes it) add up to
    ``at_least``; their sum. What a test waits on instead of a fixed sleep, which a loaded
    machine outlasts: frames received, batches flushed to the model."""
    deadline = time.monotonic() + timeout_s
    while (total := sum(sample.value for sample in samples(daemon, name))) < at_least:
        alive = daemon.process.poll() is None
        assert alive and time.monotonic() < deadline, (name, total, daemon.logs[-10:])
        time.sleep(0.05)
    return total

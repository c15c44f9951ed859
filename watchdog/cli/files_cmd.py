"""`agent-watchdog files unit|config|roles [--install PATH]`: what the wheel carries for an
install by hand (issue 19, item 7) — the systemd unit, the example config, the PostgreSQL
roles script — printed, or installed at PATH (never over an existing file)."""

from __future__ import annotations

import os
from pathlib import Path

import click

from watchdog.cli.app import fail_cleanly, main
from watchdog.errors import StoreError

# name -> (file in the wheel's watchdog/_shipped/, the same file in a checkout)
SHIPPED = {
    "unit": ("agent-watchdog.service", "systemd/agent-watchdog.service"),
    "config": ("config.example.toml", "systemd/config.example.toml"),
    "roles": ("postgres-roles.sql", "sql/postgres-roles.sql"),
}
MODES = {"unit": 0o644, "config": 0o640, "roles": 0o644}


def shipped(name: str) -> Path:
    """The file as installed (the wheel), else as in the source tree (a checkout, editable)."""
    package = Path(__file__).resolve().parent.parent  # watchdog/
    wheel_name, tree_name = SHIPPED[name]
    for candidate in (package / "_shipped" / wheel_name, package.parent / tree_name):
        if candidate.is_file():
            return candidate
    raise StoreError(f"this installation carries no {wheel_name}; reinstall agent-watchdog-daemon from its wheel")


@main.command("files")
@click.argument("name", type=click.Choice(sorted(SHIPPED)))
@click.option("--install", "install_path", metavar="PATH", type=click.Path(dir_okay=True),
              help="Write it there (a directory: under its usual name) instead of printing it.")
@fail_cleanly
def files_cmd(name: str, install_path: str | None) -> None:
    """Print (or install) a file the package ships: the systemd unit, the example config, the
    PostgreSQL roles script (`files roles | psql -d DB -f -`)."""
    src = shipped(name)
    data = src.read_bytes()
    if install_path is None:
        click.echo(data.decode("utf-8"), nl=False)
        return
    dest = Path(install_path)
    if dest.is_dir():
        dest = dest / SHIPPED[name][0]
    try:
        fd = os.open(dest, os.O_WRONLY | os.O_CREAT | os.O_EXCL, MODES[name])
    except FileExistsError:
        raise StoreError(f"{dest} exists: not overwritten (remove it first, or compare with "
                         f"agent-watchdog files {name})") from None
    except OSError as exc:
        raise StoreError(f"cannot write {dest} ({exc.strerror})") from None
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    click.echo(f"installed {dest} ({name}, mode {MODES[name]:04o})")

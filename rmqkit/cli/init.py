"""`rmqkit init`: scaffold a topology, a handler, its test and a README snippet."""

from __future__ import annotations

from pathlib import Path

import typer

from rmqkit.scaffold import write_scaffold


def init(
    name: str = typer.Option(
        "orders", "--name", help="Names the exchange, the work queue NAME.work and the module."
    ),
    directory: Path = typer.Option(
        Path("."), "--dir", help="Where to write (default: the current directory)."
    ),
) -> None:
    """Scaffold a project in the current directory: topologies/NAME.toml, a handler with a
    model (NAME_handlers.py), its unit test using rmqkit.testing, and README.NAME.md.

    Refuses (exit 64) and writes nothing if any of these files already exists (a symlink too,
    even a dangling one: it is never followed)."""
    for path in write_scaffold(directory, name):
        typer.echo(str(path))
    typer.echo(
        f"next: rmqkit declare {directory / 'topologies' / (name + '.toml')}, then rmqkit "
        f"consume {name}_handlers:handle --queue {name}.work (see README.{name}.md)",
        err=True,
    )

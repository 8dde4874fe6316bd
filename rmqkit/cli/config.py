"""`rmqkit config`: the effective settings, secrets masked."""

from __future__ import annotations

import typer

from rmqkit.cli.common import settings_from
from rmqkit.cli.render import print_json, stdout


def config(
    ctx: typer.Context,
    as_json: bool = typer.Option(False, "--json", help="Print JSON."),
) -> None:
    """Print the effective settings (flags > environment > .env > defaults), secrets masked."""
    settings = settings_from(ctx)
    shown = settings.masked()
    if as_json:
        print_json(shown)
        return
    for key, value in shown.items():
        stdout.print(f"[bold]{key}[/bold] = {value}", highlight=False)

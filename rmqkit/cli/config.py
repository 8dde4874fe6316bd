"""`rmqkit config`: the effective settings, secrets masked; the key ring by its key ids."""

from __future__ import annotations

from typing import Any

import typer

from rmqkit.cli.common import settings_from
from rmqkit.cli.keyring_settings import keyring_of
from rmqkit.cli.render import print_json, stdout


def config(
    ctx: typer.Context,
    as_json: bool = typer.Option(False, "--json", help="Print JSON."),
) -> None:
    """Print the effective settings (flags > environment > .env > defaults), secrets masked.
    A key ring is shown by its key ids (which one is current) — never its keys."""
    settings = settings_from(ctx)
    shown: dict[str, Any] = settings.masked()
    ring = keyring_of(settings)
    # KeyRing.summary(): source, ids, dates and roles only (no material, no inline JSON)
    shown["keyring_keys"] = ring.summary() if ring is not None else None
    if as_json:
        print_json(shown)
        return
    for key, value in shown.items():
        if key == "keyring_keys":
            continue
        stdout.print(f"[bold]{key}[/bold] = {value}", highlight=False)
    if ring is None:
        stdout.print("[bold]keyring_keys[/bold] = None", highlight=False)
        return
    for ring_key in ring.keys:
        role = " (current)" if ring_key.id == ring.current_id else ""
        stdout.print(
            f"[bold]keyring_key[/bold] = {ring_key.id}{role} created {ring_key.created}",
            highlight=False,
        )
    index = ring.index_key
    stdout.print(
        f"[bold]keyring_index_key[/bold] = {index.id} created {index.created}", highlight=False
    )

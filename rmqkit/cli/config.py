"""`rmqkit config`: the effective settings, secrets masked, each with where it came from; the
key ring by its key ids."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import typer
from rich.markup import escape

from rmqkit.cli.common import SETTINGS_FLAGS, settings_from
from rmqkit.cli.keyring_settings import keyring_of
from rmqkit.cli.render import print_json, stdout
from rmqkit.settings import Settings

ENV_PREFIX = "RMQKIT_"
DOTENV = Path(".env")  # as Settings reads it: in the current directory


def config(
    ctx: typer.Context,
    as_json: bool = typer.Option(False, "--json", help="Print JSON."),
) -> None:
    """Print the effective settings (flags > environment > .env > defaults), secrets masked,
    each with where it came from: the flag, the environment variable, the .env file, or the
    default. A key ring is shown by its key ids (which one is current) — never its keys."""
    settings = settings_from(ctx)
    shown: dict[str, Any] = settings.masked()
    ring = keyring_of(settings)
    # KeyRing.summary(): source, ids, dates and roles only (no material, no inline JSON)
    shown["keyring_keys"] = ring.summary() if ring is not None else None
    origin = sources(ctx, settings)
    if as_json:
        print_json({**shown, "sources": origin})
        return
    for key, value in shown.items():
        if key == "keyring_keys":
            continue
        # the value as text (a path may hold brackets); the source as a shell comment
        stdout.print(
            f"[bold]{key}[/bold] = {escape(str(value))}  # {escape(origin[key])}", highlight=False
        )
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


def sources(ctx: typer.Context, settings: Settings) -> dict[str, str]:
    """Where each shown setting came from, in the order Settings applies them: a flag
    (``--url``), an environment variable (``env RMQKIT_URL``), the .env file (``/path/.env
    (RMQKIT_URL)``), else ``default``; the vhost and a management URL left unset follow the
    URL (``from url``)."""
    given = {k for k, v in (ctx.find_root().obj or {}).items() if v is not None}
    environment = {name.upper() for name in os.environ}  # matched case-insensitively
    dotenv = _dotenv_names()
    out: dict[str, str] = {}
    for name in settings.masked():
        variable = ENV_PREFIX + name.upper()
        if name in SETTINGS_FLAGS and name in given:
            out[name] = SETTINGS_FLAGS[name]
        elif variable in environment and name in Settings.model_fields:
            out[name] = f"env {variable}"
        elif variable in dotenv and name in Settings.model_fields:
            out[name] = f"{DOTENV.resolve()} ({variable})"
        else:
            out[name] = "default"
    out["vhost"] = "--vhost" if "vhost" in given else f"the url's path (url: {out['url']})"
    if out["management_url"] == "default":
        out["management_url"] = f"derived from the url (url: {out['url']})"
    ring_source = next(
        (out[k] for k in ("keyring_file", "keyring") if out[k] != "default"), "default"
    )
    out["keyring_keys"] = ring_source
    return out


def _dotenv_names() -> set[str]:
    """The variable names the .env file sets (upper-cased), none without one."""
    if not DOTENV.is_file():
        return set()
    from dotenv import dotenv_values

    return {name.upper() for name in dotenv_values(DOTENV)}

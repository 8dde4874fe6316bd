"""`rmqkit keys`: the key ring of field-level encryption (issue 16; docs/encryption.md).

generate, rotate, activate and show. Nothing here ever prints key material: only ids, creation
times and which key is current.
"""

from __future__ import annotations

from pathlib import Path

import typer

from rmqkit.cli.render import print_json, stderr, stdout
from rmqkit.crypto import ENV_FILE, ENV_INLINE, KeyRing, keyring_from_env, load_keyring_file
from rmqkit.crypto import activate as activate_key
from rmqkit.crypto import generate as generate_ring
from rmqkit.crypto import rotate as rotate_ring
from rmqkit.crypto.keyfile import FILE_MODE
from rmqkit.errors import ConfigError

app = typer.Typer(
    help="Key ring for field-level encryption: generate, rotate, activate, show (never the keys).",
    no_args_is_help=True,
)

_BACKUP = (
    "Back it up and restrict who reads it: losing it loses every field encrypted under it; "
    "anyone holding it can decrypt them."
)


def _say(text: str) -> None:
    stdout.print(text, markup=False, highlight=False)


def _describe(ring: KeyRing) -> str:
    lines = [f"key ring {ring.source}"]
    for key in ring.keys:
        mark = "current" if key.id == ring.current_id else "decrypt only"
        lines.append(f"  encryption  {key.id}  created {key.created}  {mark}")
    index = ring.index_key
    lines.append(f"  blind index {index.id}  created {index.created}  (never rotated)")
    return "\n".join(lines)


@app.command("generate")
def generate(
    out: Path = typer.Option(..., "--out", "-o", help="The key-ring file to create (mode 0600)."),
    force: bool = typer.Option(
        False, "--force", help="Replace an existing file (its keys are lost: only for a new ring)."
    ),
) -> None:
    """Create a key ring: one encryption key (current) and a separate blind-index key."""
    ring = generate_ring(out, force=force)
    _say(
        f"wrote {out} (mode {FILE_MODE:o}): encryption key {ring.current_id} (current), "
        f"blind-index key {ring.index_key.id}"
    )
    stderr.print(_BACKUP, markup=False, highlight=False)


@app.command("rotate")
def rotate(
    file: Path = typer.Argument(..., help="The key-ring file."),
    staged: bool = typer.Option(
        False,
        "--staged",
        help="Add the key without making it current: deploy the file to every consumer, then "
        "`rmqkit keys activate FILE KID` (no consumer meets a key id it lacks).",
    ),
) -> None:
    """Add a new encryption key (current unless --staged); old keys stay for decryption.

    The blind-index key is untouched, so nothing is re-encrypted and --match still finds
    messages from before the rotation.
    """
    ring, key = rotate_ring(file, activate=not staged)
    state = "staged (not current yet)" if staged else "now current"
    _say(f"added encryption key {key.id} to {file}: {state}; keys: {', '.join(ring.key_ids)}")


@app.command("activate")
def activate(
    file: Path = typer.Argument(..., help="The key-ring file."),
    kid: str = typer.Argument(..., help="The encryption key id to make current."),
) -> None:
    """Make KID the key new values are encrypted with."""
    ring = activate_key(file, kid)
    _say(f"{file}: encryption key {ring.current_id} is now current")


@app.command("show")
def show(
    file: Path | None = typer.Argument(
        None, help=f"The key-ring file (default: {ENV_FILE} or {ENV_INLINE})."
    ),
    json_out: bool = typer.Option(False, "--json", help="JSON on stdout."),
) -> None:
    """Key ids, creation times and which key is current — never the keys themselves."""
    ring = load_keyring_file(file) if file is not None else keyring_from_env()
    if ring is None:
        raise ConfigError(f"no key ring: give FILE, or set {ENV_FILE} or {ENV_INLINE}")
    if json_out:
        print_json(ring.summary())
    else:
        _say(_describe(ring))

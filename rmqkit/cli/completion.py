"""`rmqkit completion bash|zsh|fish`: the shell completion script, and the completion itself.

The shell calls ``rmqkit`` back with ``_RMQKIT_COMPLETE`` set (the script does); ``complete``
answers it from the command tree, listing the lazy commands by name without importing them.
Both instruction spellings are accepted: typer's (``complete_bash``, what the scripts send) and
click's (``bash_complete``).

Values complete too: ``--reason`` from the known reasons, queue names (a parking command's
QUEUE, ``--queue``, ``--origin``) and ``--vhost`` from the management API of the broker the
command line (``--url``, ``--management-url``, ``--vhost``) or the settings point at. A broker
that does not answer within ``LOOKUP_TIMEOUT_S`` (or refuses) completes nothing, silently: a
completion never prints an error into the user's command line.
"""

from __future__ import annotations

import asyncio
from enum import StrEnum
from typing import Any

import typer

from rmqkit.errors import UsageError

LOOKUP_TIMEOUT_S = 2.0  # a tab press must not hang on a broker that is down

COMPLETE_VAR = "_RMQKIT_COMPLETE"
_SHELLS = ("bash", "zsh", "fish")


class Shell(StrEnum):
    bash = "bash"
    zsh = "zsh"
    fish = "fish"


def completion(
    shell: Shell = typer.Argument(..., help="The shell: bash, zsh or fish."),
) -> None:
    """Print the shell completion script: put eval "$(rmqkit completion bash)" in ~/.bashrc
    (zsh: the same in ~/.zshrc; fish: save it as ~/.config/fish/completions/rmqkit.fish)."""
    from typer._completion_classes import completion_init

    from rmqkit.cli.clickcompat import get_completion_class
    from rmqkit.cli.main import app

    completion_init()  # registers typer's bash/zsh/fish classes
    found = get_completion_class(shell.value)
    if found is None:  # pragma: no cover - the choice above allows only registered shells
        raise UsageError(f"no completion for {shell.value}")
    script = found(typer.main.get_command(app), {}, "rmqkit", COMPLETE_VAR).source()
    print(script.strip())


def complete(root: Any, instruction: str) -> int:
    """Answer a completion request (``_RMQKIT_COMPLETE=INSTRUCTION``) for ``root``."""
    from typer._completion_classes import completion_init
    from typer.completion import shell_complete

    completion_init()
    first, _, second = instruction.partition("_")
    if first in _SHELLS:  # click's spelling, bash_complete: typer's is complete_bash
        instruction = f"{second}_{first}"
    return shell_complete(root, {}, "rmqkit", COMPLETE_VAR, instruction)


def complete_reason(incomplete: str) -> list[str]:
    """``--reason`` values: the reasons rmqkit parks messages for."""
    from rmqkit.parking.model import KNOWN_REASONS

    return sorted(r for r in KNOWN_REASONS if r.startswith(incomplete))


def complete_queue(ctx: typer.Context, incomplete: str) -> list[str]:
    """Queue names of the vhost the command line points at, starting with ``incomplete``."""
    names = _lookup(ctx, "queues")
    return sorted(n for n in names if n.startswith(incomplete))


def complete_vhost(ctx: typer.Context, incomplete: str) -> list[str]:
    """Virtual host names the user can see."""
    return sorted(n for n in _lookup(ctx, "vhosts") if n.startswith(incomplete))


def _lookup(ctx: typer.Context, what: str) -> list[str]:
    try:
        settings = completion_settings(ctx)
        return asyncio.run(asyncio.wait_for(_names(settings, what), LOOKUP_TIMEOUT_S))
    except Exception:  # completing: anything that goes wrong completes nothing
        return []


def completion_settings(ctx: typer.Context) -> Any:
    """Settings from what the command line being completed gives so far. The root's callback
    does not run while completing, so its options are read from its parsed parameters (and a
    ``--vhost`` repeated after the command from what its callback kept)."""
    from rmqkit.settings import load_settings

    root = ctx.find_root()
    params = dict(root.params or {})
    kept = root.obj if isinstance(root.obj, dict) else {}
    settings = load_settings(url=params.get("url"), management_url=params.get("management_url"))
    vhost = kept.get("vhost") or params.get("vhost")
    return settings if not vhost else settings.for_vhost(vhost)


async def _names(settings: Any, what: str) -> list[str]:
    from urllib.parse import quote

    from rmqkit.broker.management import management

    async with management(settings) as api:
        if what == "vhosts":
            rows = await api.request("GET", "/vhosts?columns=name")
        else:
            rows = await api.request("GET", f"/queues/{quote(api.vhost, safe='')}?columns=name")
    return [str(row["name"]) for row in rows or [] if isinstance(row, dict) and "name" in row]

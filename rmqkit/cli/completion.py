"""`rmqkit completion bash|zsh|fish`: the shell completion script, and the completion itself.

The shell calls ``rmqkit`` back with ``_RMQKIT_COMPLETE`` set (the script does); ``complete``
answers it from the command tree, listing the lazy commands by name without importing them.
Both instruction spellings are accepted: typer's (``complete_bash``, what the scripts send) and
click's (``bash_complete``).
"""

from __future__ import annotations

from enum import StrEnum
from typing import Any

import typer

from rmqkit.errors import UsageError

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

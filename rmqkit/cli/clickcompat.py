"""Click's exceptions and shell completion, wherever the installed typer keeps them.

typer 0.2x vendors click as ``typer._click``; older typer (0.16, the floor pyproject allows,
run by scripts/test-lowest) depends on the click package itself. rmqkit's CLI catches click's
usage errors (exit 64) and answers completion requests, so it needs both spellings.
"""

from __future__ import annotations

from typing import Any

try:
    from typer._click import exceptions as _exceptions
    from typer._click import shell_completion as _shell_completion
except ImportError:  # typer < 0.20: click is a package of its own
    from click import exceptions as _exceptions  # type: ignore[import-not-found,no-redef,unused-ignore]
    from click import shell_completion as _shell_completion  # type: ignore[import-not-found,no-redef,unused-ignore]

ClickException: Any = _exceptions.ClickException
NoArgsIsHelpError: Any = _exceptions.NoArgsIsHelpError
ClickUsageError: Any = _exceptions.UsageError
get_completion_class: Any = _shell_completion.get_completion_class

__all__ = ["ClickException", "ClickUsageError", "NoArgsIsHelpError", "get_completion_class"]

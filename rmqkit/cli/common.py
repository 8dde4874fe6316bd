"""Helpers every command uses: settings from the global options, running coroutines."""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Coroutine
from typing import Any, TypeVar

import typer

from rmqkit.durations import parse_duration_ms
from rmqkit.errors import Interrupted, UsageError
from rmqkit.idempotency import parse_window
from rmqkit.settings import Settings, load_settings

T = TypeVar("T")

# The global options that are settings (``--url`` is ``url``), as ``config`` names their source.
SETTINGS_FLAGS = {"url": "--url", "management_url": "--management-url"}


def settings_from(ctx: typer.Context) -> Settings:
    """Settings with the global flags applied over environment, .env and defaults; ``--vhost``
    (given before or after the command) points every URL at that vhost."""
    given: dict[str, Any] = dict(ctx.find_root().obj or {})
    vhost = given.get("vhost")
    # Only the settings flags: the root's obj also carries --non-interactive, and click's help
    # formatter files its markup mode there. A bad --url is a usage error (64).
    settings = load_settings(flags=True, **{k: given.get(k) for k in SETTINGS_FLAGS})
    return settings if vhost is None else settings.for_vhost(vhost)


def may_ask(ctx: typer.Context) -> bool:
    """Whether a command may ask the user: not with --non-interactive (or
    RMQKIT_NON_INTERACTIVE=1), nor when stdin is not a terminal (a script, a pipe, cron)."""
    return not (ctx.find_root().obj or {}).get("non_interactive") and sys.stdin.isatty()


def confirm(ctx: typer.Context, question: str, what: str) -> bool:
    """Ask ``question`` (on stderr) if the command may ask; else refuse with one line naming
    ``what`` it would have done (a usage error, exit 64), having done none of it."""
    if not may_ask(ctx):
        why = "stdin is not a terminal" if not sys.stdin.isatty() else "--non-interactive"
        raise UsageError(f"{what}: refusing without --yes ({why}); nothing was done")
    return typer.confirm(question, err=True)


def run_async(coro: Coroutine[Any, Any, T]) -> T:
    """Run one library coroutine; Ctrl-C becomes Interrupted (exit 130), not click's exit 1."""
    try:
        return asyncio.run(coro)
    except KeyboardInterrupt:
        raise Interrupted("interrupted") from None


def seconds(text: str, flag: str, *, days: bool = False) -> float:
    """A duration flag (``30s``, ``1h``; with ``days`` also ``7d``, as retention windows are
    spelled) in seconds; a bad one is a usage error (exit 64)."""
    try:
        return parse_window(text) if days else parse_duration_ms(text) / 1000
    except ValueError as exc:
        raise UsageError(f"{flag}: {exc}") from None


def seconds_option(text: str | None, flag: str, *, days: bool = False) -> float | None:
    """``seconds`` for a flag that may be absent (None stays None)."""
    return None if text is None else seconds(text, flag, days=days)


def topology_option(help_text: str) -> Any:
    """The ``--topology/-t FILE`` option; each command says what it takes from the file."""
    return typer.Option(None, "--topology", "-t", help=help_text)

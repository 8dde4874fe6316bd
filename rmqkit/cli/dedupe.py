"""`rmqkit dedupe`: init, status and prune of the idempotent-consumer store (issue 13)."""

from __future__ import annotations

import typer

from rmqkit.cli.render import print_json, stderr, stdout
from rmqkit.durations import age_text
from rmqkit.errors import UsageError
from rmqkit.idempotency import (
    DEFAULT_BATCH,
    dedupe_status,
    format_window,
    init_store,
    parse_window,
    prune,
)

app = typer.Typer(
    help="Idempotent-consumer store: create its table, show it, prune old message ids.",
    no_args_is_help=True,
)

_DSN_HELP = "The store: sqlite:///path.db or postgresql://user@host:5432/db."


def _window(text: str | None, flag: str) -> float | None:
    if text is None:
        return None
    try:
        return parse_window(text)
    except ValueError as exc:
        raise UsageError(f"{flag}: {exc}") from None


def _age(seconds: float | None) -> str:
    return "-" if seconds is None else f"{age_text(seconds)} ago"


def _show(json_out: bool, data: dict[str, object], text: str) -> None:
    """The one render step of every dedupe command: JSON for scripts, else a plain text block."""
    if json_out:
        print_json(data)
    else:
        stdout.print(text, markup=False, highlight=False)


@app.command("init")
def init(
    dsn: str = typer.Option(..., "--dsn", help=_DSN_HELP),
    window: str | None = typer.Option(
        None,
        "--window",
        help="Retention window of processed ids, e.g. 7d (kept if already set; 7d on a new "
        "store). Longer than the longest redelivery or replay you expect.",
    ),
    json_out: bool = typer.Option(False, "--json", help="JSON on stdout."),
) -> None:
    """Create rmqkit_processed and rmqkit_versions if missing (idempotent)."""
    result = init_store(dsn, window_s=_window(window, "--window"))
    _show(
        json_out,
        {"dsn": result.dsn, "window_s": result.window_s},
        f"dedupe store ready at {result.dsn} (window {format_window(result.window_s)}"
        f"{', changed' if result.window_changed else ''})",
    )


@app.command("status")
def status(
    dsn: str = typer.Option(..., "--dsn", help=_DSN_HELP),
    json_out: bool = typer.Option(False, "--json", help="JSON on stdout."),
) -> None:
    """Row count, oldest entry and the configured window."""
    result = dedupe_status(dsn)
    window = "-" if result.window_s is None else format_window(result.window_s)
    _show(
        json_out,
        result.as_dict(),
        f"store {result.dsn}\n"
        f"processed ids: {result.rows}\n"
        f"oldest: {_age(result.oldest_age_s)}\n"
        f"window: {window} ({result.older_than_window} older, pruned by the next prune)",
    )


@app.command("prune")
def prune_command(
    dsn: str = typer.Option(..., "--dsn", help=_DSN_HELP),
    older_than: str | None = typer.Option(
        None, "--older-than", help="Delete ids recorded longer ago than this (default: the window)."
    ),
    batch: int = typer.Option(
        DEFAULT_BATCH, "--batch", min=1, help="Rows per transaction (short locks)."
    ),
    json_out: bool = typer.Option(False, "--json", help="JSON on stdout."),
) -> None:
    """Delete processed ids older than the window, in small batches (consumers keep running)."""
    result = prune(dsn, older_than_s=_window(older_than, "--older-than"), batch=batch)
    if result.below_window and result.window_s is not None:
        stderr.print(
            f"warning: pruned ids younger than the window ({format_window(result.window_s)}): "
            "a duplicate of one of them would be applied again",
            markup=False,
            highlight=False,
        )
    _show(
        json_out,
        result.as_dict(),
        f"deleted {result.deleted} id(s) older than {format_window(result.older_than_s)} in "
        f"{result.batches} batch(es), {result.elapsed_s:.2f}s (longest batch "
        f"{result.longest_batch_s * 1000:.0f} ms)",
    )

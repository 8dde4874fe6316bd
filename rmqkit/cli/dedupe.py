"""`rmqkit dedupe`: init (and upgrade), status and prune of the idempotent-consumer store."""

from __future__ import annotations

import typer

from rmqkit.cli.common import settings_from
from rmqkit.cli.render import print_json, stderr, stdout
from rmqkit.durations import age_text
from rmqkit.errors import UsageError
from rmqkit.idempotency import (
    DEFAULT_BATCH,
    DedupeStatus,
    Upgrade,
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


def _upgrade_text(upgrade: Upgrade) -> str:
    lines = [f"upgraded from an older schema: {upgrade.ids} processed id(s) kept"]
    lines += [f"  scope {scope or '(empty)'}: {n} id(s)" for scope, n in upgrade.id_scopes.items()]
    if upgrade.versions_scope is not None:
        scope = upgrade.versions_scope or "(empty: no consumer reads it; see --legacy-scope)"
        lines.append(f"  ordering versions: {upgrade.versions} key(s), scope {scope}")
    return "\n".join(lines)


@app.command("init")
def init(
    ctx: typer.Context,
    dsn: str = typer.Option(..., "--dsn", help=_DSN_HELP),
    window: str | None = typer.Option(
        None,
        "--window",
        help="Retention window of processed ids, e.g. 7d (kept if already set; 7d on a new "
        "store). Longer than the longest redelivery or replay you expect.",
    ),
    legacy_scope: str | None = typer.Option(
        None,
        "--legacy-scope",
        help="Upgrading an older store: the scope to give all its ids and ordering versions "
        "(default: each id the scope of the queue that recorded it, in the --vhost / "
        "RMQKIT_URL vhost; the versions that of the only queue, if one).",
    ),
    json_out: bool = typer.Option(False, "--json", help="JSON on stdout."),
) -> None:
    """Create rmqkit_processed and rmqkit_versions if missing, or upgrade the tables of an
    older rmqkit (scopes); idempotent."""
    result = init_store(
        dsn,
        window_s=_window(window, "--window"),
        vhost=settings_from(ctx).vhost,
        legacy_scope=legacy_scope,
    )
    text = (
        f"dedupe store ready at {result.dsn} (window {format_window(result.window_s)}"
        f"{', changed' if result.window_changed else ''})"
    )
    upgraded = result.upgraded
    if upgraded is not None:
        text += "\n" + _upgrade_text(upgraded)
    data: dict[str, object] = {"dsn": result.dsn, "window_s": result.window_s}
    data["upgraded"] = (
        None
        if upgraded is None
        else {
            "ids": upgraded.ids,
            "id_scopes": upgraded.id_scopes,
            "versions": upgraded.versions,
            "versions_scope": upgraded.versions_scope,
        }
    )
    _show(json_out, data, text)


@app.command("status")
def status(
    dsn: str = typer.Option(..., "--dsn", help=_DSN_HELP),
    json_out: bool = typer.Option(False, "--json", help="JSON on stdout."),
) -> None:
    """Row count, oldest entry, the configured window, and the ids and ordering keys per
    scope (a consumer's scope is its vhost and queue unless given --dedupe-scope)."""
    result = dedupe_status(dsn)
    _show(json_out, result.as_dict(), _status_text(result))


def _status_text(result: DedupeStatus) -> str:
    window = "-" if result.window_s is None else format_window(result.window_s)
    lines = [
        f"store {result.dsn}",
        f"processed ids: {result.rows}",
        f"oldest: {_age(result.oldest_age_s)}",
        f"window: {window} ({result.older_than_window} older, pruned by the next prune)",
    ]
    if result.outdated:
        lines.append(
            f"schema: older rmqkit's ({', '.join(result.outdated)} without scopes) — run "
            "`rmqkit dedupe init` to upgrade; consumers refuse to start until then"
        )
        return "\n".join(lines)
    lines.append(f"scopes: {len(result.scopes)}")
    lines += [
        f"  {row.scope or '(empty)'}: {row.ids} id(s), {row.keys} ordering key(s)"
        for row in result.scopes
    ]
    return "\n".join(lines)


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

"""`rmqkit parking list | show | stats`: the commands that read a parking queue and change
nothing (every browsed message goes back, in order)."""

from __future__ import annotations

import json
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import typer
from rich.markup import escape
from rich.table import Table

from rmqkit.broker.codec import PROPERTIES
from rmqkit.cli.common import run_async, seconds_option, settings_from
from rmqkit.cli.completion import complete_queue
from rmqkit.cli.keyring_settings import require_keyring
from rmqkit.cli.parking_options import (
    DECRYPT_OPT,
    REDACT_OPT,
    TOPOLOGY_OPT,
    Selection,
    explain_no_match,
    filtered,
    progress_bar,
    sensitive_for,
    warn_browse,
)
from rmqkit.cli.render import stdout
from rmqkit.durations import age_text
from rmqkit.errors import DataError
from rmqkit.fileout import OutputError
from rmqkit.parking.delivered import DeliveryLimits, delivered, delivery_limits, needs_limits
from rmqkit.parking.model import ParkedMessage, body_preview, json_safe, redact_body
from rmqkit.parking.ops import find_parked, list_parked
from rmqkit.parking.thresholds import ParkingCheck, StatsLimits, check_parking


@filtered
def list_cmd(
    ctx: typer.Context,
    sel: Selection,
    limit: int | None = typer.Option(None, "--limit", min=1, help="Stop after N matches."),
    as_json: bool = typer.Option(False, "--json", help="NDJSON, one object per message."),
    redact: list[str] = REDACT_OPT,
) -> None:
    """List parked messages (non-destructive: the queue keeps every message)."""
    settings = settings_from(ctx)
    keys = sel.sensitive | {k.lower() for k in redact}
    now = datetime.now(UTC)  # ages as of the start of the browse
    rows: list[ParkedMessage] = []
    emitted = 0
    # `delivered` of a message the delivery limit parked is its work queue's limit + 1: NDJSON
    # streams, so it reads the vhost's limits first; the table and TSV only those it shows.
    limits = run_async(delivery_limits(settings, None)) if as_json else {}

    def emit(message: ParkedMessage) -> None:
        nonlocal emitted
        emitted += 1
        if as_json:
            summary = {
                **_summary(message, keys, limits),
                "body_preview": body_preview(message.body, keys),
            }
            _write(json.dumps(summary, default=str) + "\n")
        else:
            rows.append(message)

    progress, update = progress_bar("browsing")
    with progress:
        stats = run_async(
            list_parked(settings, sel.queue, sel.flt, emit, limit=limit, progress=update)
        )
    warn_browse(sel.queue, stats)
    explain_no_match(sel, emitted)
    if as_json:
        _write(None)
        return
    limits = run_async(delivery_limits(settings, needs_limits(rows)))
    if not stdout.is_terminal:  # piped: one tab-separated line per message, never wrapped
        _print_lines(rows, now, keys, limits)
    else:
        title = f"{sel.queue}: {len(rows)} of {stats.queue_count} message(s)"
        stdout.print(_list_table(title, rows, now, keys, limits))


def _summary(
    message: ParkedMessage, keys: frozenset[str], limits: DeliveryLimits
) -> dict[str, Any]:
    """The message's summary with ``delivered`` (None: unknown) after ``attempts``."""
    summary: dict[str, Any] = {}
    for name, value in message.summary(redact=keys).items():
        summary[name] = value
        if name == "attempts":
            summary["delivered"] = delivered(message, limits)
    return summary


def _count(value: int | None) -> str:
    return "-" if value is None else str(value)


def _write(text: str | None) -> None:
    """Write (None: flush) the NDJSON listing; stdout on a full disk is exit 74, not a bug."""
    try:
        if text is None:
            sys.stdout.flush()
        else:
            sys.stdout.write(text)
    except OSError as exc:
        raise OutputError(f"writing the listing failed: {exc.strerror or exc}") from None


def _print_lines(
    rows: list[ParkedMessage], now: datetime, keys: frozenset[str], limits: DeliveryLimits
) -> None:
    print(
        "message_id\treason\terror_type\terror_message\tattempts\tdelivered\torigin\tage\tsize"
        "\tbody"
    )
    for m in rows:
        text = (m.redacted_error(keys) or "").replace("\t", " ").replace("\n", " ")
        fields = (
            m.message_id or "-",
            m.reason or "-",
            m.error_type or "-",
            text,
            str(m.attempts),
            _count(delivered(m, limits)),
            m.origin_queue or "-",
            age_text(m.age_s(now)),
            str(m.size),
            body_preview(m.body, keys),
        )
        print("\t".join(fields))


def _list_table(
    title: str,
    rows: list[ParkedMessage],
    now: datetime,
    keys: frozenset[str],
    limits: DeliveryLimits,
) -> Table:
    table = Table(title=title, title_justify="left")
    columns = (
        "message_id",
        "reason",
        "error",
        "attempts",
        "delivered",
        "origin",
        "age",
        "size",
        "body",
    )
    for column in columns:
        table.add_column(column, overflow="fold")
    for m in rows:
        error = f"{m.error_type or '-'}: {m.redacted_error(keys) or ''}".strip(": ")
        table.add_row(
            m.message_id or "-",
            m.reason or "-",
            error[:80],
            str(m.attempts),
            _count(delivered(m, limits)),
            m.origin_queue or "-",
            age_text(m.age_s(now)),
            str(m.size),
            escape(body_preview(m.body, keys, width=40)),  # brackets are text, not markup
        )
    return table


def show_cmd(
    ctx: typer.Context,
    queue: str = typer.Argument(..., help="Parking queue.", autocompletion=complete_queue),
    message_id: str = typer.Argument(..., help="message_id of the parked message."),
    redact: list[str] = REDACT_OPT,
    topology: Path | None = TOPOLOGY_OPT,
    decrypt: bool = DECRYPT_OPT,
    as_json: bool = typer.Option(False, "--json", help="One JSON document (indented)."),
) -> None:
    """Print one parked message whole: properties, headers, body (non-destructive). Encrypted
    fields show as [encrypted kid=…] unless --decrypt (needs the key ring). With --topology,
    the fields it marks sensitive for the queue's work queue are masked too (not with
    --decrypt: that asks to see them)."""
    settings = settings_from(ctx)
    # The ring first: --decrypt without one is exit 78 before anything is read.
    ring = require_keyring(settings, "--decrypt") if decrypt else None
    declared = sensitive_for(topology, queue)  # checked either way: a wrong file is 64
    keys = frozenset(k.lower() for k in redact) | (frozenset() if decrypt else declared)
    message = run_async(find_parked(settings, queue, message_id))
    if message is None:
        raise DataError(f"no message with message_id {message_id!r} in {queue!r}")
    props = message.properties
    properties = {  # every basic property present but the headers (shown apart, redacted)
        prop.attr: json_safe(getattr(props, prop.attr))
        for prop in PROPERTIES
        if prop.name != "headers" and getattr(props, prop.attr, None) is not None
    }
    limits = run_async(delivery_limits(settings, needs_limits([message])))
    document = {
        **_summary(message, keys, limits),
        "properties": properties,
        "body": redact_body(message.body, keys, keyring=ring),
    }
    document["headers"] = message.redacted_headers(keys)
    print(json.dumps(document, indent=2, default=str, ensure_ascii=False))


@filtered
def stats_cmd(
    ctx: typer.Context,
    sel: Selection,
    max_count: int | None = typer.Option(
        None,
        "--max-count",
        min=0,  # a sign typo (-1) would page forever: a usage error instead
        help="Check: critical (2) above N, warning (1) above 80% of N.",
    ),
    max_age: str | None = typer.Option(
        None, "--max-age", help="Check: critical (2) if the oldest is older, warning (1) at 80%."
    ),
    as_json: bool = typer.Option(False, "--json", help="One JSON document (indented)."),
    tsv: bool = typer.Option(
        False,
        "--tsv",
        help="Tab-separated `by key count` lines (totals, then each count by reason, error "
        "type and origin) instead of the summary and tables.",
    ),
) -> None:
    """Counts by reason, error type and origin; oldest age. With --max-count/--max-age it is a
    monitoring check: exit 0 ok, 1 warning, 2 critical (Nagios plugin convention). Messages
    another consumer (a replay, an export) holds unacked cannot be read: they count toward
    --max-count, and while any consumer is on the queue the check is at least a warning."""
    settings = settings_from(ctx)
    limits = StatsLimits(max_count, seconds_option(max_age, "--max-age"), max_age)
    check = run_async(check_parking(settings, sel.queue, sel.flt, limits))
    verdict = check.verdict
    explain_no_match(sel, check.stats.matched)
    if as_json:
        document = {**check.stats.as_dict(), "status": verdict.status, "why": list(verdict.why)}
        print(json.dumps(document, indent=2))
    elif tsv:
        # A flag, not "when piped" as `list` does: monitoring checks and runbooks read the
        # summary line (`Q: N message(s)`) from piped output, and it stays as it was.
        _print_stats_lines(check)
    else:
        _print_stats(check)
    raise typer.Exit(verdict.status)


def _verdict_line(check: ParkingCheck) -> None:
    if check.limits.given:
        # A monitoring check: Nagios reads the FIRST line of a plugin's output as its status
        # (the rest is long text), so the verdict comes before the counts.
        why = check.verdict.why
        print(
            f"PARKING {check.verdict.label}: " + ("; ".join(why) if why else "within limits"),
            flush=True,
        )


def _print_stats_lines(check: ParkingCheck) -> None:
    """``by key count`` lines: the queue's totals first, then each count by reason, error
    type and origin (``awk -F'\t' '$1 == "reason"'`` picks one breakdown)."""
    result = check.stats
    _verdict_line(check)
    oldest = "-" if result.oldest_age_s is None else f"{result.oldest_age_s:.0f}"
    lines = [
        ("matched", result.queue, str(result.matched)),
        ("total", result.queue, str(result.total)),
        ("bytes", result.queue, str(result.bytes)),
        ("oldest_age_s", result.queue, oldest),
    ]
    if result.other_consumers:
        lines.append(("held_by_others", result.queue, str(result.held_by_others)))
    for by, counts in (
        ("reason", result.by_reason),
        ("error_type", result.by_error_type),
        ("origin", result.by_origin),
    ):
        lines += [(by, key, str(count)) for key, count in counts.most_common()]
    print("by\tkey\tcount")
    for line in lines:
        print("\t".join(" ".join(cell.split()) for cell in line))


def _print_stats(check: ParkingCheck) -> None:
    result = check.stats
    _verdict_line(check)
    held = (
        f"; {result.held_by_others} more held unacked by {result.other_consumers} other "
        "consumer(s), not inspected"
        if result.other_consumers
        else ""
    )
    stdout.print(
        f"[bold]{result.queue}[/bold]: {result.matched} message(s)"
        + (f" of {result.total}" if result.matched != result.total else "")
        + f", {result.bytes} bytes, oldest {age_text(result.oldest_age_s)}"
        + (f", parking {result.publish_rate:.2f}/s" if result.publish_rate else "")
        + held,
        highlight=False,
    )
    for title, counts in (
        ("reason", result.by_reason),
        ("error type", result.by_error_type),
        ("origin", result.by_origin),
    ):
        table = Table(title=f"by {title}", title_justify="left")
        table.add_column(title)
        table.add_column("count", justify="right")
        for key, count in counts.most_common():
            table.add_row(key, str(count))
        stdout.print(table)

"""`rmqkit parking groups`: parked messages grouped by how they failed (reads only)."""

from __future__ import annotations

import json
from datetime import UTC, datetime

import typer
from rich.markup import escape
from rich.table import Table

from rmqkit.cli.common import run_async, settings_from
from rmqkit.cli.parking_options import (
    REDACT_OPT,
    Selection,
    explain_no_match,
    filtered,
    progress_bar,
    warn_browse,
)
from rmqkit.cli.render import stdout
from rmqkit.durations import age_text
from rmqkit.parking.groups import FailureGroup, ParkingGroups, parking_groups


@filtered
def groups_cmd(
    ctx: typer.Context,
    sel: Selection,
    as_json: bool = typer.Option(False, "--json", help="One JSON document (indented)."),
    redact: list[str] = REDACT_OPT,
) -> None:
    """Parked messages grouped by how they failed: park reason, error type, the innermost frame
    of the application's code and the error message with values (numbers, ids, quoted text)
    left out. One row per group, the largest first: count, first and last parked, origin
    queues, how many failed again after a replay, a sample error. Act on one group with
    --group ID in list, stats, replay, purge and export (non-destructive: the queue keeps
    every message)."""
    settings = settings_from(ctx)
    keys = sel.sensitive | {k.lower() for k in redact}
    progress, update = progress_bar("browsing")
    with progress:
        result = run_async(
            parking_groups(settings, sel.queue, sel.flt, redact=keys, progress=update)
        )
    if result.browse is not None:
        warn_browse(sel.queue, result.browse)
    explain_no_match(sel, result.matched)
    if as_json:
        print(json.dumps(result.as_dict(), indent=2, ensure_ascii=False))
    elif stdout.is_terminal:
        stdout.print(_table(result))
    else:
        _print_lines(result)


def _when(moment: datetime | None, now: datetime) -> str:
    if moment is None:
        return "-"
    return f"{age_text((now - moment).total_seconds())} ago"


def _what(group: FailureGroup) -> str:
    """``exhausted TimeoutError in payments.py:charge``."""
    text = group.reason
    if group.error_type:
        text += f" {group.error_type}"
    if group.frame:
        text += f" in {group.frame}"
    return text


def _table(result: ParkingGroups) -> Table:
    now = datetime.now(UTC)
    table = Table(
        title=f"{result.queue}: {result.matched} message(s) in {len(result.groups)} group(s)",
        title_justify="left",
    )
    for column in ("group", "count", "failure", "first parked", "last parked", "origins"):
        table.add_column(column, overflow="fold")
    table.add_column("again after replay", justify="right")
    table.add_column("sample error", overflow="fold")
    for group in result.groups:
        table.add_row(
            group.id,
            str(group.count),
            escape(_what(group)),
            _when(group.first_parked, now),
            _when(group.last_parked, now),
            escape(", ".join(f"{q} ({n})" for q, n in group.origins.most_common())),
            str(group.failed_after_replay) if group.failed_after_replay else "",
            escape(group.sample or ""),
        )
    return table


def _print_lines(result: ParkingGroups) -> None:
    """Piped: a summary line, then one tab-separated line per group (never wrapped)."""
    print(f"{result.queue}: {result.matched} message(s) in {len(result.groups)} group(s)")
    for group in result.groups:
        fields = (
            group.id,
            str(group.count),
            _what(group),
            _iso(group.first_parked),
            _iso(group.last_parked),
            ",".join(group.origins),
            str(group.failed_after_replay),
            (group.sample or "").replace("\t", " ").replace("\n", " "),
        )
        print("\t".join(fields))


def _iso(moment: datetime | None) -> str:
    return "-" if moment is None else moment.isoformat().replace("+00:00", "Z")

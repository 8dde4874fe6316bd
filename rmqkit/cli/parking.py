"""`rmqkit parking list | show | stats | replay | purge | export | import`."""

from __future__ import annotations

import json
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import typer
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from rmqkit.cli.common import run_async, seconds_option, settings_from
from rmqkit.cli.render import stderr, stdout
from rmqkit.errors import DataError, ExitCode, PartialSuccess, UsageError
from rmqkit.parking.browse import BrowseStats
from rmqkit.parking.model import ParkedFilter, ParkedMessage, json_safe, redact_body, redact_value
from rmqkit.parking.ops import (
    find_parked,
    list_parked,
    parking_stats,
    purge_parked,
)
from rmqkit.parking.replay import replay_parked
from rmqkit.parking.transfer import export_parked, import_records, read_export
from rmqkit.topology import load_topology

app = typer.Typer(
    help="Inspect, replay, purge, export and import parked messages (never losing any).",
    no_args_is_help=True,
)

QUEUE_ARG = typer.Argument(None, help="Parking queue (or use --topology FILE --queue WORK).")
TOPOLOGY_OPT = typer.Option(None, "--topology", "-t", help="Topology file naming the queue.")
WORK_OPT = typer.Option(None, "--queue", "-q", help="Work queue whose parking queue to use.")
REASON_OPT = typer.Option([], "--reason", help="permanent, exhausted, undecodable, … (repeatable)")
ERROR_OPT = typer.Option(None, "--error-type", help="Error type glob, e.g. 'myapp.*Error'.")
ORIGIN_OPT = typer.Option(None, "--origin", help="Origin (work) queue.")
OLDER_OPT = typer.Option(None, "--older-than", help="Last failure older than, e.g. 1h.")
NEWER_OPT = typer.Option(None, "--newer-than", help="Last failure newer than, e.g. 10m.")
HEADER_OPT = typer.Option([], "--header", help="Header equals value: K=V (repeatable).")
ID_OPT = typer.Option([], "--id", help="message_id (repeatable).")
GREP_OPT = typer.Option(None, "--grep", help="Body contains this text.")
REDACT_OPT = typer.Option(
    [], "--redact", help="Mask this field in bodies and headers (repeatable; case-insensitive)."
)


def _queue(name: str | None, topology: Path | None, work: str | None) -> tuple[str, frozenset[str]]:
    """The parking queue name and the sensitive fields the topology declares for it."""
    if name and (topology or work):
        raise UsageError("give either a parking queue name or --topology FILE --queue WORK")
    if name:
        return name, frozenset()
    if topology is None or work is None:
        raise UsageError("name the parking queue, or give --topology FILE --queue WORK")
    spec = load_topology(topology)
    if work not in spec.model.queues:
        raise UsageError(f"{topology} has no work queue {work!r}")
    return spec.parking_name(work), frozenset(
        f.lower() for f in spec.model.queues[work].sensitive_fields
    )


def _filter(
    reason: list[str],
    error_type: str | None,
    origin: str | None,
    older_than: str | None,
    newer_than: str | None,
    header: list[str],
    ids: list[str],
    grep: str | None,
) -> ParkedFilter:
    pairs = []
    for item in header:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise UsageError(f"--header wants K=V, got {item!r}")
        pairs.append((key, value))
    return ParkedFilter(
        reasons=frozenset(reason),
        error_type=error_type,
        origin=origin,
        older_than_s=seconds_option(older_than, "--older-than"),
        newer_than_s=seconds_option(newer_than, "--newer-than"),
        headers=tuple(pairs),
        ids=frozenset(ids),
        grep=grep.encode() if grep else None,
    )


def _age(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds / size:.1f}{unit}"
    return f"{seconds:.0f}s"


def _warn_browse(name: str, stats: BrowseStats) -> None:
    if stats.other_consumers:
        stderr.print(
            f"warning: {name!r} had {stats.other_consumers} other consumer(s) when the browse "
            "started: the messages they hold unacked are not shown",
            highlight=False,
        )
    if stats.missed:
        stderr.print(
            f"warning: {stats.missed} of the {stats.queue_count} message(s) in {name!r} at the "
            "start were taken by another consumer during the browse and not shown",
            highlight=False,
        )
    if not stats.settled:
        stderr.print(
            f"warning: the broker had not yet put back every browsed message of {name!r}; "
            "a command run right now may see fewer",
            highlight=False,
        )


def _progress(label: str) -> tuple[Progress, Any]:
    progress = Progress(
        TextColumn(label),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=stderr,
        transient=True,
        disable=not stderr.is_terminal,
    )
    task = progress.add_task(label, total=None)

    def update(seen: int, total: int) -> None:
        progress.update(task, completed=seen, total=total)

    return progress, update


@app.command("list")
def list_cmd(
    ctx: typer.Context,
    queue: str | None = QUEUE_ARG,
    topology: Path | None = TOPOLOGY_OPT,
    work: str | None = WORK_OPT,
    reason: list[str] = REASON_OPT,
    error_type: str | None = ERROR_OPT,
    origin: str | None = ORIGIN_OPT,
    older_than: str | None = OLDER_OPT,
    newer_than: str | None = NEWER_OPT,
    header: list[str] = HEADER_OPT,
    ids: list[str] = ID_OPT,
    grep: str | None = GREP_OPT,
    limit: int | None = typer.Option(None, "--limit", min=1, help="Stop after N matches."),
    as_json: bool = typer.Option(False, "--json", help="NDJSON, one object per message."),
    redact: list[str] = REDACT_OPT,
) -> None:
    """List parked messages (non-destructive: the queue keeps every message)."""
    settings = settings_from(ctx)
    name, sensitive = _queue(queue, topology, work)
    keys = sensitive | {k.lower() for k in redact}
    flt = _filter(reason, error_type, origin, older_than, newer_than, header, ids, grep)
    now = datetime.now(UTC)
    rows: list[ParkedMessage] = []
    out = sys.stdout

    def emit(message: ParkedMessage) -> None:
        if as_json:
            out.write(json.dumps(message.summary(redact=keys), default=str) + "\n")
        else:
            rows.append(message)

    progress, update = _progress("browsing")
    with progress:
        stats = run_async(list_parked(settings, name, flt, emit, limit=limit, progress=update))
    _warn_browse(name, stats)
    if as_json:
        out.flush()
        return
    if not stdout.is_terminal:  # piped: one tab-separated line per message, never wrapped
        print("message_id\treason\terror_type\terror_message\tattempts\torigin\tage\tsize")
        for m in rows:
            text = (m.error_message or "").replace("\t", " ").replace("\n", " ")
            fields = (
                m.message_id or "-",
                m.reason or "-",
                m.error_type or "-",
                text,
                str(m.attempts),
                m.origin_queue or "-",
                _age(m.age_s(now)),
                str(m.size),
            )
            print("\t".join(fields))
        return
    table = Table(
        title=f"{name}: {len(rows)} of {stats.queue_count} message(s)", title_justify="left"
    )
    for column in ("message_id", "reason", "error", "attempts", "origin", "age", "size"):
        table.add_column(column, overflow="fold")
    for m in rows:
        error = f"{m.error_type or '-'}: {m.error_message or ''}".strip(": ")
        table.add_row(
            m.message_id or "-",
            m.reason or "-",
            error[:80],
            str(m.attempts),
            m.origin_queue or "-",
            _age(m.age_s(now)),
            str(m.size),
        )
    stdout.print(table)


@app.command("show")
def show_cmd(
    ctx: typer.Context,
    queue: str = typer.Argument(..., help="Parking queue."),
    message_id: str = typer.Argument(..., help="message_id of the parked message."),
    redact: list[str] = REDACT_OPT,
    as_json: bool = typer.Option(False, "--json"),
) -> None:
    """Print one parked message whole: properties, headers, body (non-destructive)."""
    settings = settings_from(ctx)
    keys = frozenset(k.lower() for k in redact)
    message = run_async(find_parked(settings, queue, message_id))
    if message is None:
        raise DataError(f"no message with message_id {message_id!r} in {queue!r}")
    props = message.properties
    properties = {
        name: json_safe(getattr(props, name))
        for name in (
            "message_id",
            "correlation_id",
            "content_type",
            "content_encoding",
            "delivery_mode",
            "priority",
            "timestamp",
            "expiration",
            "message_type",
            "app_id",
            "user_id",
            "reply_to",
            "cluster_id",
        )
        if getattr(props, name, None) is not None
    }
    document = {
        **message.summary(redact=keys),
        "properties": properties,
        "body": redact_body(message.body, keys),
    }
    document["headers"] = redact_value(json_safe(message.headers), keys)
    print(json.dumps(document, indent=2, default=str, ensure_ascii=False))


@app.command("stats")
def stats_cmd(
    ctx: typer.Context,
    queue: str | None = QUEUE_ARG,
    topology: Path | None = TOPOLOGY_OPT,
    work: str | None = WORK_OPT,
    reason: list[str] = REASON_OPT,
    error_type: str | None = ERROR_OPT,
    origin: str | None = ORIGIN_OPT,
    older_than: str | None = OLDER_OPT,
    newer_than: str | None = NEWER_OPT,
    header: list[str] = HEADER_OPT,
    ids: list[str] = ID_OPT,
    grep: str | None = GREP_OPT,
    max_count: int | None = typer.Option(
        None, "--max-count", help="Check: critical (2) above N, warning (1) above 80% of N."
    ),
    max_age: str | None = typer.Option(
        None, "--max-age", help="Check: critical (2) if the oldest is older, warning (1) at 80%."
    ),
    as_json: bool = typer.Option(False, "--json"),
) -> None:
    """Counts by reason, error type and origin; oldest age. With --max-count/--max-age it is a
    monitoring check: exit 0 ok, 1 warning, 2 critical (Nagios plugin convention)."""
    settings = settings_from(ctx)
    name, _ = _queue(queue, topology, work)
    flt = _filter(reason, error_type, origin, older_than, newer_than, header, ids, grep)
    result = run_async(parking_stats(settings, name, flt))
    age_limit = seconds_option(max_age, "--max-age")
    status = 0
    why: list[str] = []
    if max_count is not None:
        if result.matched > max_count:
            status, why = 2, [*why, f"{result.matched} parked > {max_count}"]
        elif result.matched > 0.8 * max_count:
            status, why = max(status, 1), [*why, f"{result.matched} parked > 80% of {max_count}"]
    if age_limit is not None and result.oldest_age_s is not None:
        if result.oldest_age_s > age_limit:
            status, why = 2, [*why, f"oldest {_age(result.oldest_age_s)} > {max_age}"]
        elif result.oldest_age_s > 0.8 * age_limit:
            status = max(status, 1)
            why = [*why, f"oldest {_age(result.oldest_age_s)} > 80% of {max_age}"]
    if as_json:
        print(json.dumps({**result.as_dict(), "status": status, "why": why}, indent=2))
    else:
        stdout.print(
            f"[bold]{name}[/bold]: {result.matched} message(s)"
            + (f" of {result.total}" if result.matched != result.total else "")
            + f", {result.bytes} bytes, oldest {_age(result.oldest_age_s)}"
            + (f", parking {result.publish_rate:.2f}/s" if result.publish_rate else ""),
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
        if max_count is not None or age_limit is not None:
            label = ("OK", "WARNING", "CRITICAL")[status]
            print(f"PARKING {label}: " + ("; ".join(why) if why else "within limits"))
    raise typer.Exit(status)


@app.command("replay")
def replay_cmd(
    ctx: typer.Context,
    queue: str | None = QUEUE_ARG,
    topology: Path | None = TOPOLOGY_OPT,
    work: str | None = WORK_OPT,
    reason: list[str] = REASON_OPT,
    error_type: str | None = ERROR_OPT,
    origin: str | None = ORIGIN_OPT,
    older_than: str | None = OLDER_OPT,
    newer_than: str | None = NEWER_OPT,
    header: list[str] = HEADER_OPT,
    ids: list[str] = ID_OPT,
    grep: str | None = GREP_OPT,
    to_exchange: str | None = typer.Option(None, "--to-exchange", help="Override the target."),
    routing_key: str | None = typer.Option(None, "--routing-key", help="Override the key."),
    rate: float | None = typer.Option(None, "--rate", min=0.01, help="Messages per second."),
    limit: int | None = typer.Option(None, "--limit", min=1),
    dry_run: bool = typer.Option(False, "--dry-run", help="Print the plan, change nothing."),
    as_json: bool = typer.Option(False, "--json"),
) -> None:
    """Send parked messages back to the queue they failed in, each acked only after the
    broker confirmed its copy. Attempts start afresh; the failure history is kept.
    Exit 3 if some could not be replayed (they stay parked). Safe to interrupt and rerun."""
    settings = settings_from(ctx)
    name, _ = _queue(queue, topology, work)
    flt = _filter(reason, error_type, origin, older_than, newer_than, header, ids, grep)
    progress, update = _progress("replaying")
    with progress:
        report = run_async(
            replay_parked(
                settings,
                name,
                flt,
                to_exchange=to_exchange,
                routing_key=routing_key,
                dry_run=dry_run,
                rate=rate,
                limit=limit,
                progress=update,
            )
        )
    if dry_run:
        for message_id, exchange, key in report.plan:
            print(
                f"would replay {message_id or '-'} → exchange {exchange or '(default)'!s} key {key}"
            )
    if as_json:
        print(json.dumps({**report.as_dict(), "dry_run": dry_run}))
    else:
        verb = "would replay" if dry_run else "replayed"
        count = len(report.plan) if dry_run else report.replayed
        stderr.print(
            f"{verb} {count} of {report.selected} selected; returned {report.returned}, "
            f"failed {report.failed}, skipped {report.skipped}",
            highlight=False,
        )
        for problem, n in report.problems.items():
            stderr.print(f"  {n} x {problem}", highlight=False)
    if not dry_run and report.partial:
        raise PartialSuccess(
            f"{report.selected - report.replayed} of {report.selected} message(s) could not be "
            "replayed and stay parked — see the problems above"
        )


@app.command("purge")
def purge_cmd(
    ctx: typer.Context,
    queue: str | None = QUEUE_ARG,
    topology: Path | None = TOPOLOGY_OPT,
    work: str | None = WORK_OPT,
    reason: list[str] = REASON_OPT,
    error_type: str | None = ERROR_OPT,
    origin: str | None = ORIGIN_OPT,
    older_than: str | None = OLDER_OPT,
    newer_than: str | None = NEWER_OPT,
    header: list[str] = HEADER_OPT,
    ids: list[str] = ID_OPT,
    grep: str | None = GREP_OPT,
    yes: bool = typer.Option(False, "--yes", "-y", help="Do not ask for confirmation."),
    dry_run: bool = typer.Option(False, "--dry-run", help="Count what would be purged."),
) -> None:
    """Delete parked messages: all, or those matching the filters. Asks first unless --yes."""
    settings = settings_from(ctx)
    name, _ = _queue(queue, topology, work)
    flt = _filter(reason, error_type, origin, older_than, newer_than, header, ids, grep)
    if dry_run or not yes:
        count = run_async(purge_parked(settings, name, flt, dry_run=True))
        if dry_run:
            print(f"would purge {count} message(s) from {name}")
            return
        if count == 0:
            print(f"nothing to purge in {name}")
            return
        if not sys.stdin.isatty():
            raise UsageError("purge needs --yes when not run from a terminal")
        if not typer.confirm(f"Purge {count} message(s) from {name}?", err=True):
            raise typer.Exit(ExitCode.OK)
    purged = run_async(purge_parked(settings, name, flt))
    print(f"purged {purged} message(s) from {name}")


@app.command("export")
def export_cmd(
    ctx: typer.Context,
    queue: str | None = QUEUE_ARG,
    topology: Path | None = TOPOLOGY_OPT,
    work: str | None = WORK_OPT,
    reason: list[str] = REASON_OPT,
    error_type: str | None = ERROR_OPT,
    origin: str | None = ORIGIN_OPT,
    older_than: str | None = OLDER_OPT,
    newer_than: str | None = NEWER_OPT,
    header: list[str] = HEADER_OPT,
    ids: list[str] = ID_OPT,
    grep: str | None = GREP_OPT,
    output: Path | None = typer.Option(None, "--output", "-o", help="Write to FILE, not stdout."),
    remove: bool = typer.Option(
        False,
        "--remove",
        help="Remove each exported message, once its line is on disk (needs --output).",
    ),
) -> None:
    """Write parked messages as NDJSON that round-trips exactly (docs/export-format.md).
    The queue keeps them unless --remove."""
    settings = settings_from(ctx)
    name, _ = _queue(queue, topology, work)
    flt = _filter(reason, error_type, origin, older_than, newer_than, header, ids, grep)
    if remove and output is None:
        raise UsageError("--remove needs --output FILE: messages are removed once on disk")
    progress, update = _progress("exporting")
    if output is None:
        with progress:
            report = run_async(export_parked(settings, name, flt, sys.stdout, progress=update))
    else:
        with output.open("w", encoding="utf-8") as handle, progress:
            report = run_async(
                export_parked(settings, name, flt, handle, remove=remove, progress=update)
            )
    stderr.print(
        f"exported {report.written} message(s) from {name}"
        + (f", removed {report.removed}" if remove else "; the queue keeps them"),
        highlight=False,
    )


@app.command("import")
def import_cmd(
    ctx: typer.Context,
    file: Path = typer.Argument(..., help="NDJSON written by `rmqkit parking export`."),
    queue: str = typer.Argument(..., help="Queue to publish into (default exchange)."),
) -> None:
    """Publish an export file into QUEUE with confirms. The whole file is checked first
    (a bad line: exit 65, nothing published); exit 3 if some were not confirmed."""
    settings = settings_from(ctx)
    records = read_export(file)
    progress, update = _progress("importing")
    with progress:
        report = run_async(import_records(settings, records, queue, progress=update))
    stderr.print(
        f"imported {report.published} of {report.records} message(s) into {queue}"
        + (f"; returned {report.returned}, nacked {report.nacked}" if report.partial else ""),
        highlight=False,
    )
    if report.partial:
        raise PartialSuccess(
            f"{report.records - report.published} message(s) were not confirmed — "
            "run the import again for them (duplicates are identifiable by message_id)"
        )

"""`rmqkit parking list | show | stats | replay | purge | export | import`."""

from __future__ import annotations

import dataclasses
import json
import sys
from datetime import UTC, datetime
from pathlib import Path

import typer
from rich.table import Table

from rmqkit.broker.typed_properties import PROPERTIES
from rmqkit.cli.common import run_async, settings_from
from rmqkit.cli.parking_options import (
    ERROR_OPT,
    GREP_OPT,
    HEADER_OPT,
    ID_OPT,
    NEWER_OPT,
    OLDER_OPT,
    ORIGIN_OPT,
    QUEUE_ARG,
    REASON_OPT,
    REDACT_OPT,
    TOPOLOGY_OPT,
    WORK_OPT,
    filtered,
    read_ids,
    stats_verdict,
    warn_browse,
)
from rmqkit.cli.parking_options import age_text as _age
from rmqkit.cli.parking_options import parked_filter as _filter
from rmqkit.cli.parking_options import parking_queue as _queue
from rmqkit.cli.parking_options import progress_bar as _progress
from rmqkit.cli.render import stderr, stdout
from rmqkit.errors import DataError, ExitCode, PartialSuccess, UsageError
from rmqkit.fileout import OutputError, SafeOutput, check_output, output_mode
from rmqkit.parking.journal import ImportJournal
from rmqkit.parking.model import ParkedFilter, ParkedMessage, json_safe, redact_body, redact_value
from rmqkit.parking.ops import (
    find_parked,
    list_parked,
    parking_stats,
    purge_parked,
)
from rmqkit.parking.replay import replay_parked
from rmqkit.parking.transfer import export_parked, import_records, read_export

app = typer.Typer(
    help="Inspect, replay, purge, export and import parked messages (never losing any).",
    no_args_is_help=True,
)


@app.command("list")
@filtered
def list_cmd(
    ctx: typer.Context,
    flt: ParkedFilter,
    queue: str | None = QUEUE_ARG,
    topology: Path | None = TOPOLOGY_OPT,
    work: str | None = WORK_OPT,
    limit: int | None = typer.Option(None, "--limit", min=1, help="Stop after N matches."),
    as_json: bool = typer.Option(False, "--json", help="NDJSON, one object per message."),
    redact: list[str] = REDACT_OPT,
) -> None:
    """List parked messages (non-destructive: the queue keeps every message)."""
    settings = settings_from(ctx)
    name, sensitive = _queue(queue, topology, work)
    keys = sensitive | {k.lower() for k in redact}
    now = datetime.now(UTC)
    rows: list[ParkedMessage] = []
    out = sys.stdout

    def emit(message: ParkedMessage) -> None:
        if as_json:
            try:
                out.write(json.dumps(message.summary(redact=keys), default=str) + "\n")
            except OSError as exc:  # stdout redirected to a full disk: exit 74, not a bug
                raise OutputError(f"writing the listing failed: {exc.strerror or exc}") from None
        else:
            rows.append(message)

    progress, update = _progress("browsing")
    with progress:
        stats = run_async(list_parked(settings, name, flt, emit, limit=limit, progress=update))
    warn_browse(name, stats)
    if as_json:
        try:
            out.flush()
        except OSError as exc:
            raise OutputError(f"writing the listing failed: {exc.strerror or exc}") from None
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
    properties = {  # every basic property present but the headers (shown apart, redacted)
        prop.attr: json_safe(getattr(props, prop.attr))
        for prop in PROPERTIES
        if prop.name != "headers" and getattr(props, prop.attr, None) is not None
    }
    document = {
        **message.summary(redact=keys),
        "properties": properties,
        "body": redact_body(message.body, keys),
    }
    document["headers"] = redact_value(json_safe(message.headers), keys)
    print(json.dumps(document, indent=2, default=str, ensure_ascii=False))


@app.command("stats")
@filtered
def stats_cmd(
    ctx: typer.Context,
    flt: ParkedFilter,
    queue: str | None = QUEUE_ARG,
    topology: Path | None = TOPOLOGY_OPT,
    work: str | None = WORK_OPT,
    max_count: int | None = typer.Option(
        None, "--max-count", help="Check: critical (2) above N, warning (1) above 80% of N."
    ),
    max_age: str | None = typer.Option(
        None, "--max-age", help="Check: critical (2) if the oldest is older, warning (1) at 80%."
    ),
    as_json: bool = typer.Option(False, "--json"),
) -> None:
    """Counts by reason, error type and origin; oldest age. With --max-count/--max-age it is a
    monitoring check: exit 0 ok, 1 warning, 2 critical (Nagios plugin convention). Messages
    another consumer (a replay, an export) holds unacked cannot be read: they count toward
    --max-count, and while any consumer is on the queue the check is at least a warning."""
    settings = settings_from(ctx)
    name, _ = _queue(queue, topology, work)
    result = run_async(parking_stats(settings, name, flt))
    status, why = stats_verdict(result, max_count, max_age)
    if as_json:
        print(json.dumps({**result.as_dict(), "status": status, "why": why}, indent=2))
        raise typer.Exit(status)
    held = (
        f"; {result.held_by_others} more held unacked by {result.other_consumers} other "
        "consumer(s), not inspected"
        if result.other_consumers
        else ""
    )
    stdout.print(
        f"[bold]{name}[/bold]: {result.matched} message(s)"
        + (f" of {result.total}" if result.matched != result.total else "")
        + f", {result.bytes} bytes, oldest {_age(result.oldest_age_s)}"
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
    if max_count is not None or max_age is not None:
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
    to_exchange: str | None = typer.Option(
        None,
        "--to-exchange",
        help="Send to this exchange instead, routed with each message's original routing key "
        "(a message with none stays parked) unless --routing-key is given.",
    ),
    routing_key: str | None = typer.Option(
        None,
        "--routing-key",
        help="Route with this key (on the default exchange, a key is a queue name).",
    ),
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
@filtered
def purge_cmd(
    ctx: typer.Context,
    flt: ParkedFilter,
    queue: str | None = QUEUE_ARG,
    topology: Path | None = TOPOLOGY_OPT,
    work: str | None = WORK_OPT,
    ids_from: Path | None = typer.Option(
        None,
        "--ids-from",
        help="Only these message_ids: a `list --json` output or one id a line ('-': stdin).",
    ),
    limit: int | None = typer.Option(None, "--limit", min=1, help="Purge at most N."),
    yes: bool = typer.Option(False, "--yes", "-y", help="Do not ask for confirmation."),
    dry_run: bool = typer.Option(False, "--dry-run", help="Count what would be purged."),
) -> None:
    """Delete parked messages: all, or those matching the filters. Asks first unless --yes,
    and then deletes only the messages it counted: ones parked while it asked stay."""
    settings = settings_from(ctx)
    name, _ = _queue(queue, topology, work)
    if ids_from is not None:
        flt = dataclasses.replace(flt, ids=flt.ids | read_ids(ids_from))
    if dry_run or not yes:
        counted = run_async(purge_parked(settings, name, flt, dry_run=True, limit=limit))
        if dry_run:
            print(f"would purge {counted.count} message(s) from {name}")
            return
        if counted.count == 0:
            print(f"nothing to purge in {name}")
            return
        if not sys.stdin.isatty():
            raise UsageError("purge needs --yes when not run from a terminal")
        if not typer.confirm(f"Purge {counted.count} message(s) from {name}?", err=True):
            raise typer.Exit(ExitCode.OK)
        purged = run_async(purge_parked(settings, name, flt, only=counted.identities))
        gone = counted.count - purged.count
        print(
            f"purged {purged.count} message(s) from {name}"
            + (f" ({gone} of those counted were no longer there)" if gone else "")
        )
        return
    purged = run_async(purge_parked(settings, name, flt, limit=limit))
    print(f"purged {purged.count} message(s) from {name}")


@app.command("export")
@filtered
def export_cmd(
    ctx: typer.Context,
    flt: ParkedFilter,
    queue: str | None = QUEUE_ARG,
    topology: Path | None = TOPOLOGY_OPT,
    work: str | None = WORK_OPT,
    output: Path | None = typer.Option(None, "--output", "-o", help="Write to FILE, not stdout."),
    force: bool = typer.Option(False, "--force", help="Replace FILE if it exists."),
    append: bool = typer.Option(False, "--append", help="Add to the end of FILE."),
    remove: bool = typer.Option(
        False,
        "--remove",
        help="Remove each exported message, once its line is on disk (needs --output).",
    ),
) -> None:
    """Write parked messages as NDJSON that round-trips exactly (docs/export-format.md).
    The queue keeps them unless --remove. An existing FILE is refused unless --force or
    --append; FILE appears only when complete (with --remove: before the first removal).
    A write error (disk full): exit 74, the file holds exactly the removed messages."""
    settings = settings_from(ctx)
    name, _ = _queue(queue, topology, work)
    mode = output_mode(force=force, append=append)
    if output is None and (remove or force or append):
        raise UsageError("--remove, --force and --append need --output FILE")
    progress, update = _progress("exporting")
    if output is None:
        with progress:
            report = run_async(export_parked(settings, name, flt, sys.stdout, progress=update))
    else:
        check_output(output, mode)  # before touching the queue
        with SafeOutput(output, mode) as sink, progress:
            report = run_async(
                export_parked(settings, name, flt, sink, remove=remove, progress=update)
            )
    stderr.print(
        f"exported {report.written} message(s) from {name}"
        + (f" to {output}" if output is not None else "")
        + (f", removed {report.removed}" if remove else "; the queue keeps them"),
        highlight=False,
    )


@app.command("import")
def import_cmd(
    ctx: typer.Context,
    file: Path = typer.Argument(..., help="NDJSON written by `rmqkit parking export`."),
    queue: str = typer.Argument(..., help="Queue to publish into (default exchange)."),
    resume: bool = typer.Option(
        False, "--resume", help="Skip the records an earlier import confirmed (its journal)."
    ),
    again: bool = typer.Option(
        False, "--again", help="Publish every record, even ones imported before (duplicates)."
    ),
) -> None:
    """Publish an export file into QUEUE with confirms. The whole file is checked first,
    property values included (a bad line: exit 65 naming it, nothing published); exit 3 if
    some were not confirmed. Each confirmed record goes into a journal beside FILE, so an
    import that stopped is continued with --resume, without duplicates."""
    settings = settings_from(ctx)
    if resume and again:
        raise UsageError("give --resume or --again, not both")
    records = read_export(file)
    journal = ImportJournal(file, settings.vhost, queue)
    progress, update = _progress("importing")
    with progress:
        report = run_async(
            import_records(
                settings,
                records,
                queue,
                journal=journal,
                resume=resume,
                again=again,
                source=str(file),
                progress=update,
            )
        )
    stderr.print(
        f"imported {report.published} of {report.records} message(s) into {queue}"
        + (f" ({report.skipped} imported before, skipped)" if report.skipped else "")
        + (f"; returned {report.returned}, nacked {report.nacked}" if report.partial else ""),
        highlight=False,
    )
    for problem, n in report.problems.items():
        stderr.print(f"  {n} x {problem}", highlight=False)
    if report.partial:
        missing = report.records - report.published - report.skipped
        raise PartialSuccess(
            f"{missing} message(s) were not confirmed — fix the cause and run the same import "
            f"with --resume (the journal {journal.path} says what is in {queue} already)"
        )

"""`rmqkit outbox`: init, relay and status of the transactional outbox; list, retry, discard
and retarget its pending rows (rmqkit.outbox.operator)."""

from __future__ import annotations

import json

import typer

from rmqkit.cli.common import run_async, seconds, seconds_option, settings_from
from rmqkit.errors import UsageError
from rmqkit.outbox import RelayOptions, init, outbox_status, run_relay
from rmqkit.outbox import operator as ops
from rmqkit.outbox.relay import parse_retention

app = typer.Typer(
    help="Transactional outbox: create its table, relay pending rows to RabbitMQ, show its state; "
    "list, retry, discard or retarget pending rows.",
    no_args_is_help=True,
)

DSN_HELP = "Database: sqlite:///app.db, sqlite:////abs/app.db or postgresql://user@host:5432/db."


def _dsn_option() -> str:
    return typer.Option(..., "--dsn", envvar="RMQKIT_OUTBOX_DSN", help=DSN_HELP)  # type: ignore[no-any-return]


@app.command("init")
def init_cmd(dsn: str = _dsn_option()) -> None:
    """Create the table rmqkit_outbox and its indexes (and on PostgreSQL its NOTIFY trigger);
    safe to run again."""
    init(dsn)
    typer.echo("outbox table rmqkit_outbox ready")


@app.command("relay")
def relay_cmd(
    ctx: typer.Context,
    dsn: str = _dsn_option(),
    batch: int = typer.Option(200, "--batch", min=1, max=10000, help="Rows claimed per batch."),
    poll: str = typer.Option("500ms", "--poll", help="Polling interval (fallback to NOTIFY)."),
    once: bool = typer.Option(
        False, "--once", help="Publish what is pending and exit: 0 all, 3 some left, 69 down."
    ),
    retention: str = typer.Option(
        "7d", "--retention", help="Delete published rows older than this (7d, 12h; off)."
    ),
    metrics_port: int | None = typer.Option(
        None, "--metrics-port", help="Serve Prometheus metrics on this port."
    ),
    lease: str = typer.Option(
        "30s",
        "--lease",
        help="SQLite: how long the relay lease outlives a relay that died (kill -9) before "
        "another relay may take over.",
    ),
    order: str = typer.Option(
        "strict",
        "--order",
        help="strict: one unconfirmed row per aggregate, so a failed row holds back the rest of "
        "its aggregate; pipelined: a batch's rows of one aggregate in one round trip (faster for "
        "a hot aggregate; rows behind a failed one may go out ahead of its retry).",
    ),
    notify: bool = typer.Option(
        True,
        "--notify/--no-notify",
        help="PostgreSQL: wake on LISTEN/NOTIFY (off: poll only, e.g. behind PgBouncer).",
    ),
    grace: str = typer.Option(
        "10s",
        "--grace",
        help="How long SIGTERM waits for the batch in flight (a broker that blocks publishing); "
        "then the relay exits, the rows not confirmed by then left pending.",
    ),
    topology: str | None = typer.Option(
        None,
        "--topology",
        help="Topology file: each row goes to its work queue's lane and gets the queue's "
        "default delay (rows with delay= are delayed with or without it).",
    ),
    failing_summary: str = typer.Option(
        "60s",
        "--failing-summary",
        help="While rows are failing, log how many and why this often (off: never). Each "
        "failing row is logged once either way, and again only if its error changes.",
    ),
) -> None:
    """Publish pending outbox rows with confirms, then mark them published (runs until SIGTERM,
    which lets the batch in flight finish within --grace). Exit codes: 0 ok, 3 rows left
    pending (--once), 69 broker or database unreachable (at start: restart it from your
    supervisor; once running, lost connections are retried), 78 bad DSN or no table.

    A row written with delay= goes through the delay ladder (declared on first use), the time it
    spent in the table deducted; --topology adds lanes and work queues' default delays."""
    if order not in ("strict", "pipelined"):
        raise UsageError(f"--order: {order!r} is not strict or pipelined")
    try:
        retention_s = parse_retention(retention)
    except ValueError as exc:
        raise UsageError(f"--retention: {exc}") from None
    options = RelayOptions(
        dsn=dsn,
        batch=batch,
        poll_s=seconds(poll, "--poll"),
        once=once,
        retention_s=retention_s,
        metrics_port=metrics_port,
        lease_s=seconds(lease, "--lease"),
        pipelined=order == "pipelined",
        listen=notify,
        topology=topology,
        grace_s=seconds(grace, "--grace"),
        failing_summary_s=(
            None if failing_summary == "off" else seconds(failing_summary, "--failing-summary")
        ),
    )
    report = run_async(run_relay(settings_from(ctx), options))
    left = f"; left pending {report.left_pending}" if once else ""
    typer.echo(
        f"published {report.published}, returned {report.returned}, nacked {report.nacked}, "
        f"failed {report.failed}{left}"
    )
    for message_id, error in list(report.errors.items())[:10]:
        typer.echo(f"  {message_id}: {error}")
    raise typer.Exit(report.exit_code)


@app.command("status")
def status_cmd(
    dsn: str = _dsn_option(),
    as_json: bool = typer.Option(False, "--json", help="One JSON document."),
    max_pending: int | None = typer.Option(
        None, "--max-pending", help="Check: critical (2) above N, warning (1) above 80%."
    ),
    max_age: str | None = typer.Option(
        None, "--max-age", help="Check: critical (2) if the oldest pending row is older."
    ),
) -> None:
    """Pending rows, oldest pending age, published in the last hour, failing rows. A monitoring
    check: exit 0 ok, 1 warning (failing rows, 80% of a limit), 2 critical (a limit exceeded)."""
    result = outbox_status(
        dsn, max_pending=max_pending, max_age_s=seconds_option(max_age, "--max-age")
    )
    if as_json:
        typer.echo(json.dumps(result.as_dict(), indent=2))
    else:
        age = result.oldest_pending_age_s
        typer.echo(f"pending              {result.pending}")
        typer.echo(f"oldest pending age   {'-' if age is None else f'{age:.1f}s'}")
        typer.echo(f"published last hour  {result.published_last_hour}")
        typer.echo(f"failing              {result.failing}")
        for row in result.failing_rows:
            typer.echo(
                f"  id {row.id} {row.message_id} -> {row.exchange!r}/{row.routing_key!r} "
                f"attempts {row.attempts}, retry in {row.retry_in_s:.0f}s: {row.last_error}"
            )
        for reason in result.reasons:
            typer.echo(f"check: {reason}")
    raise typer.Exit(result.status)


WAIT_HELP = (
    "How long to wait for a relay that is publishing one of the rows (then nothing is changed, "
    "exit 69)."
)
ROW_IDS_HELP = "Row ids (`rmqkit outbox list --failing` shows them)."


def _ids_argument() -> list[int]:
    return typer.Argument(..., metavar="ROW_ID...", help=ROW_IDS_HELP)  # type: ignore[no-any-return]


def _wait_option() -> str:
    return typer.Option("30s", "--wait", help=WAIT_HELP)  # type: ignore[no-any-return]


def _done(verb: str, rows: list[ops.OutboxRow], extra: str = "") -> None:
    for row in rows:
        typer.echo(
            f"{verb} row {row.id} ({row.message_id}, {row.exchange!r}/{row.routing_key!r}){extra}"
        )


@app.command("list")
def list_cmd(
    dsn: str = _dsn_option(),
    failing: bool = typer.Option(False, "--failing", help="Only rows whose last publish failed."),
    limit: int = typer.Option(100, "--limit", min=1, help="Show at most this many rows."),
    as_json: bool = typer.Option(False, "--json", help="One JSON document."),
) -> None:
    """Pending rows in id order: id, message_id, exchange, routing key, aggregate, attempts,
    age, when it is due, last error. Exit 0; 69 database unreachable; 78 bad DSN or no table."""
    listing = ops.list_rows(dsn, failing=failing, limit=limit)
    if as_json:
        document = {"total": listing.total, "rows": [r.as_dict() for r in listing.rows]}
        typer.echo(json.dumps(document, indent=2))
        return
    what = "failing" if failing else "pending"
    shown = "" if len(listing.rows) == listing.total else f" (first {len(listing.rows)})"
    typer.echo(f"{listing.total} {what} row(s){shown}")
    for row in listing.rows:
        due = "due now" if row.due_in_s <= 0 else f"due in {row.due_in_s:.0f}s"
        aggregate = "" if row.aggregate is None else f" aggregate {row.aggregate!r}"
        error = "" if row.last_error is None else f": {row.last_error}"
        typer.echo(
            f"  id {row.id} {row.message_id} -> {row.exchange!r}/{row.routing_key!r}{aggregate} "
            f"attempts {row.attempts}, age {row.age_s:.0f}s, {due}{error}"
        )


@app.command("retry")
def retry_cmd(
    row_ids: list[int] = _ids_argument(),
    dsn: str = _dsn_option(),
    wait: str = _wait_option(),
) -> None:
    """Make the rows due now with their back-off reset (a relay publishes them on its next
    batch). Exit 0; 65 an id that is not in the table or already published (nothing changed);
    69 a relay kept a row busy past --wait, or the database is unreachable; 78 bad DSN."""
    _done("retrying", ops.retry(dsn, row_ids, wait_s=seconds(wait, "--wait")))


@app.command("retarget")
def retarget_cmd(
    row_ids: list[int] = _ids_argument(),
    dsn: str = _dsn_option(),
    exchange: str | None = typer.Option(None, "--exchange", help="The rows' new exchange."),
    routing_key: str | None = typer.Option(
        None, "--routing-key", help="The rows' new routing key."
    ),
    wait: str = _wait_option(),
) -> None:
    """Change the rows' exchange and/or routing key and make them due now. Exit 0; 64 neither
    --exchange nor --routing-key; 65 an id that is not in the table or already published
    (nothing changed); 69 a relay kept a row busy past --wait; 78 bad DSN."""
    rows = ops.retarget(
        dsn, row_ids, exchange=exchange, routing_key=routing_key, wait_s=seconds(wait, "--wait")
    )
    new_exchange = "" if exchange is None else f" exchange {exchange!r}"
    new_key = "" if routing_key is None else f" routing key {routing_key!r}"
    _done("retargeted", rows, f" to{new_exchange}{new_key}")


@app.command("discard")
def discard_cmd(
    row_ids: list[int] = _ids_argument(),
    dsn: str = _dsn_option(),
    reason: str | None = typer.Option(None, "--reason", help="Recorded with the discarded rows."),
    wait: str = _wait_option(),
) -> None:
    """Remove pending rows so they are never published; each is kept, as it was, in
    rmqkit_outbox_discarded with when, by whom and --reason. Exit 0; 65 an id that is not in the
    table or already published (nothing changed); 69 a relay kept a row busy past --wait; 78
    bad DSN."""
    rows = ops.discard(dsn, row_ids, reason=reason, wait_s=seconds(wait, "--wait"))
    _done("discarded", rows, " (kept in rmqkit_outbox_discarded)")

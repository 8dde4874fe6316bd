"""`rmqkit publish EXCHANGE ROUTING_KEY`: bodies from stdin (or --body), confirmed."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterable, Iterator
from dataclasses import replace
from pathlib import Path

import typer

from rmqkit.cli.common import run_async, seconds, seconds_option, settings_from
from rmqkit.cli.render import stderr
from rmqkit.durations import format_duration_ms, parse_delay_ms
from rmqkit.errors import PublishStopped, UsageError
from rmqkit.publishing.ids import IdSource
from rmqkit.publishing.inputs import (
    OutgoingMessage,
    messages_from_bodies,
    messages_from_lines,
    messages_from_ndjson,
)
from rmqkit.publishing.report import PublishReport
from rmqkit.publishing.stream import PublishEdge, publish_input

ID_FROM_OPT = typer.Option(
    None,
    "--id-from",
    metavar="FIELD",
    help="Take each message_id from this field (dotted path): of the NDJSON record "
    "(e.g. body.order_id), or of each line/--body parsed as JSON (e.g. order_id). Recommended "
    "for business events: the same event published again, from any file or line, then has the "
    "same id and an idempotent consumer drops it.",
)


def publish(
    ctx: typer.Context,
    exchange: str = typer.Argument(..., help="Exchange ('' for the default exchange)."),
    routing_key: str = typer.Argument(..., help="Routing key (NDJSON lines may override it)."),
    body: list[str] = typer.Option(
        [], "--body", help="Publish this body (repeatable) instead of reading stdin."
    ),
    ndjson: bool = typer.Option(
        False,
        "--ndjson",
        help="stdin holds objects: {body|body_b64, headers, properties, routing_key, message_id}.",
    ),
    header: list[str] = typer.Option([], "--header", help="K=V header on every message."),
    message_id: str | None = typer.Option(
        None, "--message-id", help="message_id for a single --body (default: derived, see below)."
    ),
    id_from: str | None = ID_FROM_OPT,
    random_ids: bool = typer.Option(
        False,
        "--random-ids",
        help="A random message_id per message and run: publishing the same input twice then "
        "makes new messages, not recognisable duplicates.",
    ),
    content_type: str | None = typer.Option(
        None,
        "--content-type",
        help="The content_type property of every message (e.g. application/json); none if unset.",
    ),
    window: int = typer.Option(
        1000, "--window", min=1, max=65535, help="Unconfirmed messages in flight."
    ),
    retry_busy: bool = typer.Option(
        False, "--retry-busy", help="Retry messages the broker refused (a full queue) with backoff."
    ),
    timeout: str | None = typer.Option(
        None,
        "--timeout",
        help="Give up (exit 69) when the broker has confirmed nothing for this long, e.g. 30s: "
        "a memory or disk alarm blocks publishing, or a queue has no leader. The message says "
        "which messages were confirmed. Default: wait.",
    ),
    blocked_every: str = typer.Option(
        "10s",
        "--blocked-every",
        help="While the broker blocks publishing (memory or disk alarm), repeat the notice on "
        "stderr this often (it is printed at once when the block begins).",
    ),
    topology: Path | None = typer.Option(
        None,
        "--topology",
        help="Topology file: each message goes to its work queue's lane, gets the queue's "
        "default delay, and its sensitive fields are encrypted where the queue says "
        "encrypt = true (key ring from RMQKIT_KEYRING_FILE / RMQKIT_KEYRING).",
    ),
    delay: str | None = typer.Option(
        None,
        "--delay",
        help="Deliver each message this long from now (90s, 5m, 2h; 0s: no delay, even where "
        "the topology gives the queue a default) through the delay ladder (docs/delay.md).",
    ),
    as_json: bool = typer.Option(False, "--json", help="Print the summary as JSON."),
    skip: int = typer.Option(
        0,
        "--skip",
        min=0,
        metavar="N",
        help="Skip the first N lines of stdin, as an interrupted publish says to resume; the "
        "lines after them keep their numbers, so their derived message_ids are a full run's.",
    ),
) -> None:
    """Publish persistent messages with publisher confirms and `mandatory`, each with a stable
    message_id. Exit 65 if some were unroutable, or larger than the broker's max_message_size
    (refused for good; every other message is still sent); exit 69 if the broker refused some
    because a bounded queue is full ("busy" — retry later, or use --retry-busy).

    When a memory or disk alarm makes the broker block publishing, the publish waits (nothing is
    lost) and says so on stderr at once, with the broker's reason, and every --blocked-every;
    with --timeout it gives up (exit 69) naming the messages the broker confirmed.

    A message without an explicit id (--message-id, an NDJSON record's message_id) or --id-from
    gets one derived from the exchange, routing key, its position (line number, or --body index)
    and body. That protects against a rerun of the same input only: after a lost connection,
    publishing the same file again gives the same ids, so its duplicates can be recognised. The
    same event published again from another file, at another line or with another routing key
    gets another id and is not recognised as a duplicate: give business events their own id
    with --id-from (or --message-id).

    --delay / --topology: the message is published to its lane queue (default exchange) or,
    delayed, to the delay ladder's entry, which is declared first; every message is prepared
    (encrypted, routed) before the first is published, so a delay beyond the ladder's maximum, a
    body that is not JSON where fields must be encrypted (65) or a missing key ring (78) publish
    nothing. So does a message_id that is the value of a field the topology encrypts (65), and,
    with --body, --ndjson or --id-from, an id or header AMQP cannot carry (65)."""
    settings = settings_from(ctx)
    delay_ms = _delay_option(delay)
    timeout_s = seconds_option(timeout, "--timeout")
    notice_every_s = seconds(blocked_every, "--blocked-every")
    headers: dict[str, object] = {}
    for item in header:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise UsageError(f"--header wants K=V, got {item!r}")
        headers[key] = value
    if message_id is not None and len(body) != 1:
        raise UsageError("--message-id goes with exactly one --body")
    if sum((random_ids, id_from is not None, message_id is not None)) > 1:
        raise UsageError("give at most one of --message-id, --id-from and --random-ids")
    if not body and sys.stdin.isatty():
        raise UsageError("give --body or pipe messages on stdin (one per line)")
    if skip and body:
        raise UsageError("--skip skips lines of stdin; it does not go with --body")
    ids = IdSource(exchange, routing_key, field=id_from, random=random_ids, in_record=ndjson)
    edge = PublishEdge.load(settings, topology, delay_ms)  # 65/78 here, before input is read
    messages: Iterable[OutgoingMessage]
    if body:
        messages = _bodies(body, headers or None, content_type, ids, message_id)
    elif ndjson:
        lines = _skipping(sys.stdin.buffer, skip)
        messages = messages_from_ndjson(lines, headers=headers or None, ids=ids)
    else:
        lines = _skipping(sys.stdin.buffer, skip)
        messages = messages_from_lines(
            lines, headers=headers or None, content_type=content_type, ids=ids
        )
    try:
        report = run_async(
            publish_input(
                settings,
                exchange,
                routing_key,
                messages,
                edge=edge,
                ids=ids,
                all_first=bool(body) or ndjson,  # stdin lines stream; a file of records does not
                window=window,
                retry_busy=retry_busy,
                notice=_notice,
                notice_every_s=notice_every_s,
                timeout_s=timeout_s,
            )
        )
    except PublishStopped as stopped:  # Ctrl-C: the counts, then the line saying how to resume
        if isinstance(stopped.report, PublishReport):
            _render(stopped.report, as_json)
        raise
    _render(report, as_json)
    error = report.failure()
    if error is not None:
        raise error


def _skipping(lines: Iterable[bytes], skip: int) -> Iterator[bytes]:
    """``lines`` with the first ``skip`` given as empty ones: not published, still counted, so
    every later line keeps its number (its position, from which its message_id is derived)."""
    for number, line in enumerate(lines, start=1):
        yield b"\n" if number <= skip else line


def _bodies(
    bodies: list[str],
    headers: dict[str, object] | None,
    content_type: str | None,
    ids: IdSource,
    message_id: str | None,
) -> Iterator[OutgoingMessage]:
    """The --body messages; the one --body's --message-id replaces its derived id."""
    for message in messages_from_bodies(
        [text.encode() for text in bodies], headers=headers, content_type=content_type, ids=ids
    ):
        if message_id is not None:
            message = replace(message, message_id=message_id, derived_at=None)
        yield message


def _render(report: PublishReport, as_json: bool) -> None:
    """The summary: JSON on stdout, or a line on stderr (and, with --topology/--delay, one
    more: how many went to which lane, how many were delayed and by how much — their confirm
    means "in the delay ladder", not "delivered")."""
    if as_json:
        print(json.dumps(report.as_dict()))
        return
    stderr.print(
        f"published {report.published}, confirmed {report.confirmed}, returned "
        f"{report.returned}, nacked {report.nacked}"
        + (f", too large {report.too_large}" if report.too_large else "")
        + (f" (after {report.retried} busy retries)" if report.retried else ""),
        highlight=False,
    )
    if report.lanes is None:
        return
    parts = [f"{n} to lane {lane}" for lane, n in sorted(report.lanes.items())]
    if report.delays_ms:
        low, high = min(report.delays_ms), max(report.delays_ms)
        span = format_duration_ms(low) + ("" if low == high else f"-{format_duration_ms(high)}")
        parts.append(f"{len(report.delays_ms)} delayed by {span} (in the delay ladder until then)")
    if parts:
        stderr.print("; ".join(parts), highlight=False)


def _notice(line: str) -> None:
    """A line about the publish while it runs (a block by the broker): stderr, at once."""
    stderr.print(f"rmqkit publish: {line}", highlight=False, soft_wrap=True)


def _delay_option(text: str | None) -> int | None:
    """--delay in ms (0 for any zero: 0s, 0m, 0.0s); a bad spelling is a usage error (64)."""
    if text is None:
        return None
    try:
        return parse_delay_ms(text)
    except ValueError as exc:
        raise UsageError(f"--delay: {exc}") from None

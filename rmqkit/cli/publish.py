"""`rmqkit publish EXCHANGE ROUTING_KEY`: bodies from stdin (or --body), confirmed."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterable
from dataclasses import replace

import typer

from rmqkit.cli.common import run_async, seconds, seconds_option, settings_from
from rmqkit.cli.render import stderr
from rmqkit.errors import BrokerUnavailable, DataError, UsageError
from rmqkit.publish import (
    IdSource,
    OutgoingMessage,
    messages_from_bodies,
    messages_from_lines,
    messages_from_ndjson,
    publish_messages,
)

ID_FROM_OPT = typer.Option(
    None,
    "--id-from",
    metavar="FIELD",
    help="Take each message_id from this field (dotted path): of the NDJSON record "
    "(e.g. body.order_id), or of each line/--body parsed as JSON (e.g. order_id).",
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
    content_type: str | None = typer.Option(None, "--content-type"),
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
    as_json: bool = typer.Option(False, "--json", help="Print the summary as JSON."),
) -> None:
    """Publish persistent messages with publisher confirms and `mandatory`, each with a stable
    message_id. Exit 65 if some were unroutable; exit 69 if the broker refused some because a
    bounded queue is full ("busy" — retry later, or use --retry-busy).

    When a memory or disk alarm makes the broker block publishing, the publish waits (nothing is
    lost) and says so on stderr at once, with the broker's reason, and every --blocked-every;
    with --timeout it gives up (exit 69) naming the messages the broker confirmed.

    A message without an explicit id (--message-id, an NDJSON record's message_id) or --id-from
    gets one derived from the exchange, routing key, its position (line number, or --body index)
    and body: the same input published again gets the same ids, so after a lost connection a
    rerun's duplicates can be recognised."""
    settings = settings_from(ctx)
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
    ids = IdSource(exchange, routing_key, field=id_from, random=random_ids)
    messages: Iterable[OutgoingMessage]
    if body:
        messages = list(
            messages_from_bodies(
                [text.encode() for text in body],
                headers=headers or None,
                content_type=content_type,
                ids=ids,
            )
        )
        if message_id is not None:
            messages = [replace(messages[0], message_id=message_id)]
    elif sys.stdin.isatty():
        raise UsageError("give --body or pipe messages on stdin (one per line)")
    elif ndjson:
        messages = list(messages_from_ndjson(sys.stdin.buffer, headers=headers or None, ids=ids))
    else:
        messages = messages_from_lines(
            sys.stdin.buffer, headers=headers or None, content_type=content_type, ids=ids
        )
        if id_from is not None:  # every line's id is checked before anything is published
            messages = list(messages)
    report = run_async(
        publish_messages(
            settings,
            exchange,
            routing_key,
            messages,
            window=window,
            retry_busy=retry_busy,
            repeatable_ids=ids.repeatable,
            notice=_notice,
            notice_every_s=notice_every_s,
            timeout_s=timeout_s,
        )
    )
    if as_json:
        print(json.dumps(report.as_dict()))
    else:
        stderr.print(
            f"published {report.published}, confirmed {report.confirmed}, returned "
            f"{report.returned}, nacked {report.nacked}"
            + (f" (after {report.retried} busy retries)" if report.retried else ""),
            highlight=False,
        )
    if report.returned:
        raise DataError(
            f"{report.returned} message(s) were unroutable (no queue bound for them) and were "
            f"returned, e.g. message_id {report.returned_ids[0]} — check the routing key and "
            "bindings (`rmqkit plan`)"
        )
    if report.nacked:
        raise BrokerUnavailable(
            f"broker busy: {report.nacked} message(s) refused because a bounded queue is full "
            "(overflow reject-publish) — retry later, or use --retry-busy; every other message "
            "is confirmed"
        )


def _notice(line: str) -> None:
    """A line about the publish while it runs (a block by the broker): stderr, at once."""
    stderr.print(f"rmqkit publish: {line}", highlight=False, soft_wrap=True)

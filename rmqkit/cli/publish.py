"""`rmqkit publish EXCHANGE ROUTING_KEY`: bodies from stdin (or --body), confirmed."""

from __future__ import annotations

import json
import sys

import typer

from rmqkit.cli.common import run_async, settings_from
from rmqkit.cli.render import stderr
from rmqkit.errors import BrokerUnavailable, DataError, UsageError
from rmqkit.publish import (
    OutgoingMessage,
    messages_from_lines,
    messages_from_ndjson,
    new_message_id,
    publish_messages,
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
        None, "--message-id", help="message_id for a single --body (default: generated)."
    ),
    content_type: str | None = typer.Option(None, "--content-type"),
    window: int = typer.Option(
        1000, "--window", min=1, max=65535, help="Unconfirmed messages in flight."
    ),
    retry_busy: bool = typer.Option(
        False, "--retry-busy", help="Retry messages the broker refused (a full queue) with backoff."
    ),
    as_json: bool = typer.Option(False, "--json", help="Print the summary as JSON."),
) -> None:
    """Publish persistent messages with publisher confirms and `mandatory`, each with a stable
    message_id. Exit 65 if some were unroutable; exit 69 if the broker refused some because a
    bounded queue is full ("busy" — retry later, or use --retry-busy)."""
    settings = settings_from(ctx)
    headers: dict[str, object] = {}
    for item in header:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise UsageError(f"--header wants K=V, got {item!r}")
        headers[key] = value
    if message_id is not None and len(body) != 1:
        raise UsageError("--message-id goes with exactly one --body")
    if body:
        messages: object = [
            OutgoingMessage(
                text.encode(),
                message_id or new_message_id(),
                headers or None,
                content_type=content_type,
            )
            for text in body
        ]
    elif sys.stdin.isatty():
        raise UsageError("give --body or pipe messages on stdin (one per line)")
    elif ndjson:
        messages = list(messages_from_ndjson(sys.stdin.buffer, headers=headers or None))
    else:
        messages = messages_from_lines(
            sys.stdin.buffer, headers=headers or None, content_type=content_type
        )
    report = run_async(
        publish_messages(
            settings,
            exchange,
            routing_key,
            messages,  # type: ignore[arg-type]
            window=window,
            retry_busy=retry_busy,
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

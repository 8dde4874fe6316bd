"""`rmqkit publish EXCHANGE ROUTING_KEY`: bodies from stdin (or --body), confirmed."""

from __future__ import annotations

import json
import sys
from collections import Counter
from collections.abc import Iterable
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

import typer

from rmqkit.cli.common import run_async, seconds, seconds_option, settings_from
from rmqkit.cli.render import stderr
from rmqkit.durations import format_duration_ms, parse_delay_ms
from rmqkit.errors import BrokerUnavailable, DataError, UsageError
from rmqkit.publishing.edge import at_edge
from rmqkit.publishing.engine import publish_messages
from rmqkit.publishing.ids import IdSource, derived_message_id
from rmqkit.publishing.inputs import (
    OutgoingMessage,
    messages_from_bodies,
    messages_from_lines,
    messages_from_ndjson,
)
from rmqkit.settings import Settings

if TYPE_CHECKING:
    from rmqkit.broker.session import Session
    from rmqkit.outbox.edge import Edge, Encryptor, Routed

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
    rerun's duplicates can be recognised.

    --delay / --topology: the message is published to its lane queue (default exchange) or,
    delayed, to the delay ladder's entry, which is declared first; every message is prepared
    (encrypted, routed) before the first is published, so a delay beyond the ladder's maximum, a
    body that is not JSON where fields must be encrypted (65) or a missing key ring (78) publish
    nothing."""
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
    ids = IdSource(exchange, routing_key, field=id_from, random=random_ids)
    edge = _edge(settings, topology, delay_ms)
    if id_from is not None and edge is not None and edge[1] is not None:
        _refuse_sensitive_id(id_from, ndjson, edge[1], exchange, routing_key)
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
            messages = [replace(messages[0], message_id=message_id, derived_at=None)]
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
    prepare = None
    if edge is not None:
        messages, routed = _at_edge(messages, exchange, routing_key, *edge, delay_ms)

        async def prepare(session: Session) -> None:
            failed = await edge[0].declare(session, routed)
            if failed:  # nothing is published: a delayed message would wait for its exit
                (exchange_, key_), error = next(iter(failed.items()))
                where = f"exchange {exchange_!r}" if exchange_ else f"queue {key_!r}"
                raise DataError(f"delayed messages for {where}: {error}")

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
            prepare=prepare,
        )
    )
    if as_json:
        summary = report.as_dict()
        if edge is not None:  # only with --topology/--delay: the plain summary keeps its keys
            summary |= _edge_counts(routed)
        print(json.dumps(summary))
    else:
        stderr.print(
            f"published {report.published}, confirmed {report.confirmed}, returned "
            f"{report.returned}, nacked {report.nacked}"
            + (f" (after {report.retried} busy retries)" if report.retried else ""),
            highlight=False,
        )
        if edge is not None:
            _edge_summary(routed)
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


def _delay_option(text: str | None) -> int | None:
    """--delay in ms (0 for any zero: 0s, 0m, 0.0s); a bad spelling is a usage error (64)."""
    if text is None:
        return None
    try:
        return parse_delay_ms(text)
    except ValueError as exc:
        raise UsageError(f"--delay: {exc}") from None


def _edge(
    settings: Settings, topology: Path | None, delay_ms: int | None
) -> tuple[Edge, Encryptor | None] | None:
    """The Edge (lanes, delays) and the Encryptor of --topology / --delay; None without them.
    A delay beyond the ladder's maximum: DelayRangeError (65) here, before anything is read."""
    if topology is None and delay_ms is None:
        return None
    from rmqkit.cli.keyring_settings import keyring_of
    from rmqkit.outbox.edge import Edge, Encryptor
    from rmqkit.topology import load_topology

    spec = load_topology(topology) if topology is not None else None
    edge = Edge(spec)
    if delay_ms:
        edge.check_delay(delay_ms, "--delay: ")
    encryptor = None
    if spec is not None and any(q.encrypt for q in spec.model.queues.values()):
        encryptor = Encryptor(keyring=keyring_of(settings), topology=spec)
    return edge, encryptor


def _at_edge(
    messages: Iterable[OutgoingMessage],
    exchange: str,
    routing_key: str,
    edge: Edge,
    encryptor: Encryptor | None,
    delay_ms: int | None,
) -> tuple[list[OutgoingMessage], list[Routed]]:
    """Every message encrypted and routed (lane, delay ladder), before anything is published.

    A derived message_id of a message with sensitive fields is keyed (``derived_message_id``
    with the key ring's index key) over the body as given: a rerun gets the same ids, and no
    one reading an id can test guesses of an encrypted value against it. Errors name the
    message by where it came from (line or --body index), not by such an id."""
    out: list[OutgoingMessage] = []
    routed: list[Routed] = []
    for number, message in enumerate(messages, start=1):
        key = message.routing_key if message.routing_key is not None else routing_key
        message_id = message.message_id
        try:
            body, where = at_edge(
                edge,
                encryptor,
                exchange,
                key,
                message.body,
                message.headers,
                delay_ms=delay_ms,
                expiration=message.expiration,
            )
            # a derived id of a body with sensitive fields (encrypted: a new object) is keyed
            if (
                encryptor is not None
                and message.derived_at is not None
                and body is not message.body
            ):
                assert encryptor.keyring is not None  # encrypt refuses without one
                message_id = derived_message_id(
                    exchange,
                    key,
                    message.derived_at,
                    message.body,
                    keyed=encryptor.keyring.index_digest,
                )
        except DataError as exc:
            raise DataError(f"{_named(message, number)}: {exc}") from None
        routed.append(where)
        out.append(
            replace(
                message,
                body=body,
                message_id=message_id,
                exchange=where.exchange,
                routing_key=where.routing_key,
                headers=where.headers,
            )
        )
    return out, routed


def _named(message: OutgoingMessage, number: int) -> str:
    """How an error names a message: where it came from, and its message_id unless derived
    from the body (a derived id of a body with sensitive fields is not shown before it is
    keyed)."""
    where = f"message {number} ({message.where})" if message.where else f"message {number}"
    if message.derived_at is not None:
        return where
    return f"{where} (message_id {message.message_id})"


def _refuse_sensitive_id(
    id_from: str, ndjson: bool, encryptor: Encryptor, exchange: str, routing_key: str
) -> None:
    """UsageError (64) for --id-from naming a field the topology encrypts: the message_id
    would carry its value in plaintext (in every log line, parking list and export)."""
    if ndjson and not id_from.startswith("body."):
        return  # a field of the NDJSON record itself, not of the body
    field = id_from.removeprefix("body.") if ndjson else id_from
    paths, _ = encryptor.fields_for(exchange, routing_key)
    for path in paths:
        if field == path or field.startswith((path + ".", path + "[")):
            raise UsageError(
                f"--id-from {id_from}: {path} is a sensitive field the topology encrypts; as "
                "the message_id its value would travel in plaintext — take the id from another "
                "field (nothing was published)"
            )


def _edge_counts(routed: list[Routed]) -> dict[str, object]:
    """``--json`` with --topology/--delay: messages per lane queue, and how many were delayed."""
    return {
        "lanes": dict(sorted(Counter(r.lane for r in routed if r.lane).items())),
        "delayed": sum(1 for r in routed if r.applied_ms),
    }


def _edge_summary(routed: list[Routed]) -> None:
    """One stderr line: how many went to which lane, how many were delayed and by how much
    (their confirm means "in the delay ladder", not "delivered")."""
    parts = [
        f"{n} to lane {lane}"
        for lane, n in sorted(Counter(r.lane for r in routed if r.lane).items())
    ]
    delayed = [r for r in routed if r.applied_ms]
    if delayed:
        low = min(r.applied_ms for r in delayed)
        high = max(r.applied_ms for r in delayed)
        span = format_duration_ms(low) + ("" if low == high else f"-{format_duration_ms(high)}")
        parts.append(f"{len(delayed)} delayed by {span} (in the delay ladder until then)")
    if parts:
        stderr.print("; ".join(parts), highlight=False)

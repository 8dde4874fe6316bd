"""Publishing with publisher confirms in a pipelined window, ``mandatory``, persistent, and a
stable ``message_id`` per message (given, or generated once before the first attempt)."""

from __future__ import annotations

import asyncio
import base64
import json
import random
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import aiormq
from pamqp import commands as spec

from rmqkit.broker.amqp import amqp_errors_mapped, connect, map_channel_error
from rmqkit.broker.confirms import ConfirmedPublisher, Outcome
from rmqkit.errors import DataError, RmqkitError
from rmqkit.settings import Settings

DEFAULT_WINDOW = 1000
Progress = Callable[[int], None]


@dataclass(frozen=True, slots=True)
class OutgoingMessage:
    """One message to publish."""

    body: bytes
    message_id: str
    headers: dict[str, Any] | None = None
    routing_key: str | None = None  # None: the publish call's routing key
    content_type: str | None = None
    correlation_id: str | None = None
    message_type: str | None = None
    expiration: str | None = None
    priority: int | None = None
    app_id: str | None = None


def new_message_id() -> str:
    return uuid.uuid4().hex


def messages_from_lines(
    lines: Iterable[bytes],
    *,
    headers: dict[str, Any] | None = None,
    content_type: str | None = None,
) -> Iterable[OutgoingMessage]:
    """Each line (newline removed) is one body; empty lines are skipped."""
    for line in lines:
        body = line.rstrip(b"\r\n")
        if body:
            yield OutgoingMessage(body, new_message_id(), headers, content_type=content_type)


_NDJSON_KEYS = {"body", "body_b64", "headers", "properties", "routing_key", "message_id"}
_PROPERTY_KEYS = {
    "message_id",
    "content_type",
    "correlation_id",
    "type",
    "expiration",
    "priority",
    "app_id",
}


def messages_from_ndjson(
    lines: Iterable[bytes], *, source: str = "<stdin>", headers: dict[str, Any] | None = None
) -> Iterable[OutgoingMessage]:
    """Objects ``{"body": "...", "headers": {...}, "properties": {...}}`` one per line
    (``body_b64`` for binary bodies). Raises DataError naming the line."""
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            item = json.loads(line)
        except ValueError as exc:
            raise DataError(f"{source}:{number}: not JSON: {exc}") from None
        if not isinstance(item, dict) or not _NDJSON_KEYS.issuperset(item):
            unknown = sorted(set(item) - _NDJSON_KEYS) if isinstance(item, dict) else []
            raise DataError(
                f"{source}:{number}: expected an object with body/body_b64, headers, properties,"
                f" routing_key{'; unknown: ' + ', '.join(unknown) if unknown else ''}"
            )
        props = item.get("properties") or {}
        if not isinstance(props, dict) or not _PROPERTY_KEYS.issuperset(props):
            raise DataError(f"{source}:{number}: properties may hold {sorted(_PROPERTY_KEYS)}")
        if "body_b64" in item:
            try:
                body = base64.b64decode(item["body_b64"], validate=True)
            except (ValueError, TypeError) as exc:
                raise DataError(f"{source}:{number}: body_b64: {exc}") from None
        elif isinstance(item.get("body"), str):
            body = item["body"].encode()
        elif "body" in item:
            body = json.dumps(item["body"]).encode()  # a JSON value as the body
        else:
            raise DataError(f"{source}:{number}: no body (body or body_b64)")
        merged = {**(headers or {}), **(item.get("headers") or {})}
        yield OutgoingMessage(
            body,
            str(item.get("message_id") or props.get("message_id") or new_message_id()),
            merged or None,
            routing_key=item.get("routing_key"),
            content_type=props.get("content_type"),
            correlation_id=props.get("correlation_id"),
            message_type=props.get("type"),
            expiration=None if props.get("expiration") is None else str(props["expiration"]),
            priority=props.get("priority"),
            app_id=props.get("app_id"),
        )


@dataclass
class PublishReport:
    """Counts of one publish run."""

    published: int = 0  # sent at least once
    confirmed: int = 0
    returned: int = 0  # unroutable (mandatory): no queue took them
    nacked: int = 0  # refused by the broker, e.g. a full queue with overflow reject-publish
    retried: int = 0  # busy retries made (--retry-busy)
    returned_ids: list[str] = field(default_factory=list)
    nacked_ids: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return {
            "published": self.published,
            "confirmed": self.confirmed,
            "returned": self.returned,
            "nacked": self.nacked,
            "retried": self.retried,
        }


async def publish_messages(
    settings: Settings,
    exchange: str,
    routing_key: str,
    messages: Iterable[OutgoingMessage],
    *,
    window: int = DEFAULT_WINDOW,
    retry_busy: bool = False,
    busy_retries: int = 8,
    progress: Progress | None = None,
) -> PublishReport:
    """Publish ``messages`` persistent, ``mandatory``, with confirms, ``window`` in flight.

    A nack (the broker refused: typically a bounded queue with ``overflow=reject-publish``)
    is *busy*: retried with backoff and jitter when ``retry_busy``, else counted. A returned
    message (unroutable) is counted, never retried.
    """
    report = PublishReport()
    conn = await connect(settings, name=f"rmqkit publish {exchange or '(default)'}")
    try:
        raw: aiormq.abc.AbstractConnection = conn.transport.connection  # type: ignore[union-attr]
        channel = await raw.channel(publisher_confirms=True)
        if exchange:
            with amqp_errors_mapped(f"checking exchange {exchange!r}"):
                await channel.exchange_declare(exchange, passive=True)
        publisher = ConfirmedPublisher(channel, window=window)
        slots = asyncio.Semaphore(window)
        done = 0

        failures: list[BaseException] = []

        async def send(message: OutgoingMessage) -> None:
            nonlocal done
            try:
                await _send_one(
                    publisher, exchange, routing_key, message, report, retry_busy, busy_retries
                )
            except Exception as exc:  # the connection is gone: stop feeding, report once
                failures.append(exc)
            finally:
                slots.release()
                done += 1
                if progress is not None and done % 1000 == 0:
                    progress(done)

        tasks: set[asyncio.Task[None]] = set()
        for message in messages:
            await slots.acquire()
            if failures:
                break
            task = asyncio.ensure_future(send(message))
            tasks.add(task)
            task.add_done_callback(tasks.discard)
            report.published += 1
        if tasks:
            await asyncio.gather(*tasks)
        await publisher.close()
        if progress is not None:
            progress(done)
        if failures:
            error = failures[0]
            if isinstance(error, RmqkitError):
                error.args = (
                    f"{error} — {report.confirmed} message(s) were confirmed before "
                    "this; the others are unknown: publish them again (duplicates "
                    "carry the same message_id)",
                )
            raise error
        await channel.close()
    finally:
        await conn.close()
    return report


async def _send_one(
    publisher: ConfirmedPublisher,
    exchange: str,
    routing_key: str,
    message: OutgoingMessage,
    report: PublishReport,
    retry_busy: bool,
    busy_retries: int,
) -> None:
    properties = spec.Basic.Properties(
        delivery_mode=2,
        message_id=message.message_id,
        headers=message.headers,
        content_type=message.content_type,
        correlation_id=message.correlation_id,
        message_type=message.message_type,
        expiration=message.expiration,
        priority=message.priority,
        app_id=message.app_id,
    )
    key = message.routing_key if message.routing_key is not None else routing_key
    attempt = 0
    while True:
        try:
            settled = await publisher.publish(
                message.body, exchange=exchange, routing_key=key, properties=properties
            )
            outcome = await settled
        except Exception as exc:
            mapped = map_channel_error(exc, f"publishing to exchange {exchange!r}")
            if mapped is None:
                raise
            raise mapped from exc
        if outcome is Outcome.CONFIRMED:
            report.confirmed += 1
            return
        if outcome is Outcome.RETURNED:
            report.returned += 1
            report.returned_ids.append(message.message_id)
            return
        if not retry_busy or attempt >= busy_retries:
            report.nacked += 1
            report.nacked_ids.append(message.message_id)
            return
        attempt += 1
        report.retried += 1
        ceiling = min(10.0, 0.1 * 2**attempt)
        await asyncio.sleep(random.uniform(ceiling / 2, ceiling))

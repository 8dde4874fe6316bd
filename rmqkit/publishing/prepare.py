"""One message of ``rmqkit.Publisher`` made ready to send: its body as bytes (a pydantic model
by alias), its sensitive fields encrypted, its lane and delay chosen, its properties built and
checked to encode — all before anything of the call is published."""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from rmqkit.broker.codec import Properties
from rmqkit.durations import parse_delay_ms
from rmqkit.errors import DataError, UsageError
from rmqkit.publishing.edge import SensitiveIdError, at_edge
from rmqkit.publishing.routing import Edge, Encryptor, PublishRoute

Delay = timedelta | str | int | float | None  # int/float: seconds; str: "90s", "5m"
JSON = "application/json"
TEXT = "text/plain; charset=utf-8"


@dataclass(frozen=True, slots=True)
class PublishMessage:
    """A message for ``Publisher.publish_many``: the same arguments ``publish`` takes."""

    body: Any
    message_id: str | None = None
    headers: dict[str, Any] | None = None
    routing_key: str | None = None  # None: the call's routing key
    delay: Delay = None
    content_type: str | None = None
    correlation_id: str | None = None
    expiration: str | None = None
    priority: int | None = None
    message_type: str | None = None


@dataclass(frozen=True, slots=True)
class Prepared:
    """A message ready for the wire: where it goes, its bytes and properties."""

    message_id: str
    exchange: str  # as asked
    routing_key: str  # as asked
    routed: PublishRoute
    body: bytes
    properties: Properties


def delay_ms_of(delay: Delay) -> int | None:
    """``delay`` in whole ms (None: the work queue's default, if any; 0: no delay)."""
    if delay is None:
        return None
    if isinstance(delay, timedelta):
        seconds = delay.total_seconds()
    elif isinstance(delay, str):
        try:
            return parse_delay_ms(delay)
        except ValueError as exc:
            raise UsageError(f"delay: {exc}") from None
    elif isinstance(delay, bool) or not isinstance(delay, int | float):
        raise UsageError(f"delay: wants a timedelta, seconds or '90s', got {type(delay).__name__}")
    else:
        seconds = float(delay)
    if seconds < 0:
        raise UsageError("delay: must not be negative")
    return round(seconds * 1000)


def body_bytes(body: Any) -> tuple[bytes, str | None, type | None]:
    """The bytes of ``body``, the content type it implies, and its model class (a pydantic
    model: its ``rmqkit.Sensitive`` marks are encrypted). bytes stay as they are, str is UTF-8,
    a model is its JSON by alias (what ``model_validate_json`` reads), else JSON."""
    if isinstance(body, bytes | bytearray | memoryview):
        return bytes(body), None, None
    if isinstance(body, str):
        return body.encode(), TEXT, None
    dump = getattr(body, "model_dump_json", None)
    if callable(dump):  # a pydantic model, checked without importing pydantic
        return str(dump(by_alias=True)).encode(), JSON, type(body)
    try:
        text = json.dumps(body, separators=(",", ":"), ensure_ascii=False)
    except (TypeError, ValueError) as exc:
        raise DataError(f"the body is not bytes, str, a pydantic model or JSON: {exc}") from None
    return text.encode(), JSON, None


def prepare(
    edge: Edge,
    encryptor: Encryptor,
    exchange: str,
    routing_key: str,
    message: PublishMessage,
    number: int,
) -> Prepared:
    """``message`` (the ``number``-th of the call, for errors) ready to send. DataError (65)
    for a body that cannot be encrypted or routed, or headers AMQP cannot carry; KeyRingError
    (78) for sensitive fields without a key ring."""
    key = message.routing_key if message.routing_key is not None else routing_key
    message_id = message.message_id if message.message_id is not None else uuid.uuid4().hex
    if not isinstance(message_id, str):
        raise DataError(f"message {number}: {ID_RULE}")
    check_message_id(message_id, f"message {number}")
    body, implied, model = body_bytes(message.body)
    try:
        body, routed = at_edge(
            edge,
            encryptor,
            exchange,
            key,
            body,
            message.headers,
            delay_ms=delay_ms_of(message.delay),
            expiration=message.expiration,
            model=model,
            message_id=message.message_id,  # one it made up (None) cannot be a field's value
        )
    except SensitiveIdError as exc:  # the id is the sensitive value: never shown
        raise SensitiveIdError(f"message {number}: {exc}") from None
    except DataError as exc:
        raise DataError(f"message {number} (message_id {message_id}): {exc}") from None
    properties = Properties(
        delivery_mode=2,
        message_id=message_id,
        timestamp=datetime.now(UTC),  # first publish: copies keep it (the message's age)
        headers=routed.headers,
        content_type=message.content_type or implied,
        correlation_id=message.correlation_id,
        message_type=message.message_type,
        expiration=message.expiration,
        priority=message.priority,
    )
    if routed.headers:
        check_encodes(properties, f"message {number} (message_id {message_id})")
    return Prepared(message_id, exchange, key, routed, body, properties)


ID_RULE = "message_id must be a non-empty str of <= 255 bytes"


def check_message_id(message_id: str, label: str) -> None:
    """DataError (65) for an id AMQP cannot carry (empty, or over a short string's 255 bytes):
    it would otherwise fail in the middle of a batch, after earlier messages went out. The id
    itself is not quoted (it may be anything)."""
    if not message_id or len(message_id.encode()) > 255:
        raise DataError(f"{label}: {ID_RULE} (nothing was published)")


def check_encodes(properties: Properties, label: str) -> None:
    """DataError (65) unless the properties encode: a header value AMQP has no type for (a
    set, an object, an integer wider than 64 bits) would otherwise fail in the middle of a
    batch, after earlier messages went out. ``label`` names the message."""
    try:
        properties.marshal()  # what the content header frame will hold
    except Exception as exc:  # pamqp raises TypeError, ValueError, struct.error, ...
        raise DataError(
            f"{label}: a header AMQP cannot carry "
            f"({type(exc).__name__}: {exc}) — use str, bytes, int, float, bool, None, "
            "datetime, Decimal, or lists/dicts of them; nothing was published"
        ) from None

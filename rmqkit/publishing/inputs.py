"""The messages `rmqkit publish` reads: lines, ``--body`` values, NDJSON records, each an
``OutgoingMessage`` with its message_id (``rmqkit.publishing.ids``) and where it came from."""

from __future__ import annotations

import base64
import json
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from rmqkit.errors import DataError
from rmqkit.publishing.ids import IdSource


@dataclass(frozen=True, slots=True)
class OutgoingMessage:
    """One message to publish."""

    body: bytes
    message_id: str
    headers: dict[str, Any] | None = None
    routing_key: str | None = None  # None: the publish call's routing key
    exchange: str | None = None  # None: the publish call's exchange (a lane or delay sets it)
    content_type: str | None = None
    correlation_id: str | None = None
    message_type: str | None = None
    expiration: str | None = None
    priority: int | None = None
    app_id: str | None = None
    # Where the message came from (``<stdin>:3``, ``--body 2``), for messages about it, and its
    # position there (the line number or --body index) when its message_id was derived from
    # it (``derived_message_id``): None for an id given or taken from a field.
    where: str = ""
    derived_at: int | None = None


def messages_from_lines(
    lines: Iterable[bytes],
    *,
    headers: dict[str, Any] | None = None,
    content_type: str | None = None,
    ids: IdSource | None = None,
    source: str = "<stdin>",
) -> Iterable[OutgoingMessage]:
    """Each line (newline removed) is one body; empty lines are skipped (but counted: a
    message's position is its line number). Raises DataError naming the line if ``ids.field``
    cannot be read from it."""
    ids = ids or IdSource()
    for number, line in enumerate(lines, start=1):
        body = line.rstrip(b"\r\n")
        if body:
            try:
                message_id = ids.message_id(number, body, None)
            except ValueError as exc:
                raise DataError(f"{source}:{number}: {exc}") from None
            yield OutgoingMessage(
                body,
                message_id,
                headers,
                content_type=content_type,
                where=f"{source}:{number}",
                derived_at=number if ids.derives else None,
            )


def messages_from_bodies(
    bodies: Iterable[bytes],
    *,
    headers: dict[str, Any] | None = None,
    content_type: str | None = None,
    ids: IdSource | None = None,
) -> Iterable[OutgoingMessage]:
    """One message per body (``--body``); a body's position is its 1-based index."""
    ids = ids or IdSource()
    for number, body in enumerate(bodies, start=1):
        try:
            message_id = ids.message_id(number, body, None)
        except ValueError as exc:
            raise DataError(f"--body {number}: {exc}") from None
        yield OutgoingMessage(
            body,
            message_id,
            headers,
            content_type=content_type,
            where=f"--body {number}",
            derived_at=number if ids.derives else None,
        )


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
    lines: Iterable[bytes],
    *,
    source: str = "<stdin>",
    headers: dict[str, Any] | None = None,
    ids: IdSource | None = None,
) -> Iterable[OutgoingMessage]:
    """Objects ``{"body": "...", "headers": {...}, "properties": {...}}`` one per line
    (``body_b64`` for binary bodies). Raises DataError naming the line.

    The message_id: the record's ``message_id`` (or ``properties.message_id``), else ``ids``
    (``--id-from`` field, or derived from the line number and content)."""
    ids = ids or IdSource()
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
        given = item.get("message_id") or props.get("message_id")
        routing_key = item.get("routing_key")
        derived_at = None
        if given:
            message_id = str(given)
        else:
            derived_at = number if ids.derives else None
            try:
                message_id = ids.message_id(number, body, routing_key, item)
            except ValueError as exc:
                raise DataError(f"{source}:{number}: {exc}") from None
        yield OutgoingMessage(
            body,
            message_id,
            merged or None,
            routing_key=routing_key,
            content_type=props.get("content_type"),
            correlation_id=props.get("correlation_id"),
            message_type=props.get("type"),
            expiration=None if props.get("expiration") is None else str(props["expiration"]),
            priority=props.get("priority"),
            app_id=props.get("app_id"),
            where=f"{source}:{number}",
            derived_at=derived_at,
        )

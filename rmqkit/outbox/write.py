"""Writing an outbox row through the caller's own connection, inside the caller's transaction.

``add`` never commits, never begins a transaction and never opens a connection: the row is one
INSERT on the connection handed in, so it commits or rolls back with the business rows written
beside it. On a psycopg connection in autocommit mode that INSERT commits at once: run it inside
``with conn.transaction():`` (docs/outbox.md shows the handler pattern).
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Mapping
from typing import Any, Final

from rmqkit.outbox.schema import TABLE
from rmqkit.store import AsyncSQLiteConnection, dialect_of

COLUMNS: Final = (
    "message_id",
    "exchange",
    "routing_key",
    "body",
    "headers",
    "content_type",
    "aggregate",
)
JSON: Final = "application/json"
TEXT: Final = "text/plain; charset=utf-8"


def encode_body(body: object) -> tuple[bytes, str | None]:
    """``body`` as bytes and the content type it implies (None for bytes: the caller's call).

    bytes stay as they are; str is UTF-8 text; a pydantic model is its JSON; anything else must
    be JSON-serialisable (``TypeError`` otherwise, before anything is written).
    """
    if isinstance(body, bytes | bytearray | memoryview):
        return bytes(body), None
    if isinstance(body, str):
        return body.encode(), TEXT
    dump = getattr(body, "model_dump_json", None)
    if callable(dump):  # a pydantic model, without importing pydantic for the check
        return str(dump()).encode(), JSON
    return json.dumps(body, separators=(",", ":"), ensure_ascii=False).encode(), JSON


def row_values(
    *,
    exchange: str,
    routing_key: str,
    body: object,
    message_id: str | None,
    headers: Mapping[str, Any] | None,
    aggregate: str | None,
    content_type: str | None,
) -> tuple[str, tuple[Any, ...]]:
    """The message_id and the values of ``COLUMNS`` for one row."""
    data, implied = encode_body(body)
    mid = message_id or str(uuid.uuid4())
    encoded_headers = None
    if headers:
        encoded_headers = json.dumps(dict(headers), separators=(",", ":"), ensure_ascii=False)
    return mid, (
        mid,
        exchange,
        routing_key,
        data,
        encoded_headers,
        content_type or implied,
        aggregate,
    )


def _insert_sql(placeholder: str) -> str:
    marks = ", ".join([placeholder] * len(COLUMNS))
    return f"INSERT INTO {TABLE} ({', '.join(COLUMNS)}) VALUES ({marks})"


def add(
    conn: Any,
    *,
    exchange: str,
    routing_key: str,
    body: object,
    message_id: str | None = None,
    headers: Mapping[str, Any] | None = None,
    aggregate: str | None = None,
    content_type: str | None = None,
) -> str:
    """Write one outbox row on ``conn`` (``sqlite3.Connection`` or ``psycopg.Connection``).

    Returns the message_id (a new UUID when not given): the AMQP message_id of every publish of
    this row. ``aggregate`` names the entity whose events must arrive in insertion order.
    ``headers`` must be JSON-serialisable. Never commits.
    """
    mid, values = row_values(
        exchange=exchange,
        routing_key=routing_key,
        body=body,
        message_id=message_id,
        headers=headers,
        aggregate=aggregate,
        content_type=content_type,
    )
    if isinstance(conn, AsyncSQLiteConnection) or type(conn).__name__ == "AsyncConnection":
        raise TypeError("an asyncio connection: use `await rmqkit.outbox.add_async(conn, ...)`")
    conn.execute(_insert_sql(dialect_of(conn).placeholder), values)
    return mid


async def add_async(
    conn: Any,
    *,
    exchange: str,
    routing_key: str,
    body: object,
    message_id: str | None = None,
    headers: Mapping[str, Any] | None = None,
    aggregate: str | None = None,
    content_type: str | None = None,
) -> str:
    """``add`` on a ``psycopg.AsyncConnection`` (or rmqkit's ``AsyncSQLiteConnection``)."""
    mid, values = row_values(
        exchange=exchange,
        routing_key=routing_key,
        body=body,
        message_id=message_id,
        headers=headers,
        aggregate=aggregate,
        content_type=content_type,
    )
    dialect = dialect_of(conn)
    await conn.execute(_insert_sql(dialect.placeholder), values)
    return mid


def add_sqlalchemy(
    session: Any,
    *,
    exchange: str,
    routing_key: str,
    body: object,
    message_id: str | None = None,
    headers: Mapping[str, Any] | None = None,
    aggregate: str | None = None,
    content_type: str | None = None,
) -> str:
    """``add`` through a SQLAlchemy ``Session`` or ``Connection``, in its current transaction.

    The INSERT goes through ``session.execute`` (SQLAlchemy binds the values for whatever
    database the session is on), so it is flushed and committed with the session's own work.
    """
    from sqlalchemy import text

    mid, values = row_values(
        exchange=exchange,
        routing_key=routing_key,
        body=body,
        message_id=message_id,
        headers=headers,
        aggregate=aggregate,
        content_type=content_type,
    )
    binds = ", ".join(f":{column}" for column in COLUMNS)
    statement = text(f"INSERT INTO {TABLE} ({', '.join(COLUMNS)}) VALUES ({binds})")
    session.execute(statement, dict(zip(COLUMNS, values, strict=True)))
    return mid

"""Writing an outbox row through the caller's own connection, inside the caller's transaction.

``add`` never commits, never begins a transaction and never opens a connection: the row is one
INSERT on the connection handed in, so it commits or rolls back with the business rows written
beside it. On a psycopg connection in autocommit mode that INSERT commits at once: run it inside
``with conn.transaction():`` (docs/outbox.md shows the handler pattern).
"""

from __future__ import annotations

import json
import re
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
SHORTSTR_MAX: Final = 255  # AMQP 0-9-1 short strings: exchange, routing key, message_id ...
FIELD_NAME_MAX: Final = 128  # AMQP table field names (pamqp silently truncates longer ones)
INT64: Final = 2**63
# The exchange names rmqkit's AMQP client (pamqp) accepts in a declare: the relay checks that
# an exchange exists with a passive declare, which refuses any other name before it is sent.
EXCHANGE_NAME: Final = re.compile(r"[a-zA-Z0-9\-_.:@#,/+ ]*")


def wire_problem(
    exchange: str, routing_key: str, message_id: str, content_type: str | None
) -> str | None:
    """Why a row with these names cannot be published on the AMQP wire; None if it can.

    The broker would never take such a row, so the relay would retry it forever: ``add``
    refuses it, and the relay leaves a row written some other way pending with this error
    instead of failing the rest of its batch.
    """
    named = {"exchange": exchange, "routing key": routing_key, "message_id": message_id}
    named["content_type"] = content_type or ""
    for what, value in named.items():
        size = len(value.encode())
        if size > SHORTSTR_MAX:
            return f"{what} is {size} bytes; AMQP allows at most {SHORTSTR_MAX}"
    if not EXCHANGE_NAME.fullmatch(exchange):
        return (
            f"exchange {exchange!r}: rmqkit supports exchange names of letters, digits and "
            "-_.:@#,/+ and space only (its AMQP client refuses others)"
        )
    return None


def headers_problem(value: object, path: str = "headers") -> str | None:
    """Why ``value`` (decoded JSON headers) cannot be an AMQP table; None if it can."""
    if isinstance(value, dict):
        for key, item in value.items():
            if len(str(key).encode()) > FIELD_NAME_MAX:
                return f"{path}: a key of {len(str(key).encode())} bytes (AMQP: {FIELD_NAME_MAX})"
            if (problem := headers_problem(item, f"{path}.{key}")) is not None:
                return problem
    elif isinstance(value, list):
        for n, item in enumerate(value):
            if (problem := headers_problem(item, f"{path}[{n}]")) is not None:
                return problem
    elif isinstance(value, int) and not isinstance(value, bool) and not -INT64 <= value < INT64:
        return f"{path}: the integer {value} does not fit AMQP's 64 bits"
    return None


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
    problem = wire_problem(exchange, routing_key, mid, content_type or implied)
    encoded_headers = None
    if headers:
        encoded_headers = json.dumps(dict(headers), separators=(",", ":"), ensure_ascii=False)
        problem = problem or headers_problem(json.loads(encoded_headers))
    if problem is not None:  # refused here rather than retried by the relay forever
        raise ValueError(f"outbox row cannot be published: {problem}")
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
    ``headers`` must be JSON-serialisable. Never commits. ``ValueError`` (nothing written) for a
    row AMQP cannot carry: an exchange, routing key, message_id or content type over 255 bytes
    of UTF-8, a header name over 128 bytes, a header integer beyond 64 bits.
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

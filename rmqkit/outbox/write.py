"""Writing an outbox row through the caller's own connection, inside the caller's transaction.

``add`` never commits, never begins a transaction and never opens a connection: the row is one
INSERT on the connection handed in, so it commits or rolls back with the business rows written
beside it. On a psycopg connection in autocommit mode that INSERT commits at once: run it inside
``with conn.transaction():`` (docs/outbox.md shows the handler pattern).
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterable, Mapping
from datetime import timedelta
from typing import TYPE_CHECKING, Any, Final

from rmqkit.broker.codec import headers_problem, wire_problem
from rmqkit.crypto.model import sensitive_fields
from rmqkit.delay import DelayRangeError, Ladder
from rmqkit.durations import parse_delay_ms
from rmqkit.errors import ConfigError, DataError
from rmqkit.outbox.schema import AGGREGATE_WRITE_LOCK_SPACE, TABLE
from rmqkit.store import AsyncSQLiteConnection, dialect_of
from rmqkit.tracing import TRACEPARENT, context_headers

if TYPE_CHECKING:
    from rmqkit.publishing.routing import Encryptor

Delay = timedelta | str | None

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

    bytes stay as they are; str is UTF-8 text; a pydantic model is its JSON, keyed by its
    aliases where it has them (what ``model_validate_json`` reads, so a consumer whose handler
    takes the same model reads it back); anything else must be JSON-serialisable (``TypeError``
    otherwise, before anything is written).
    """
    if isinstance(body, bytes | bytearray | memoryview):
        return bytes(body), None
    if isinstance(body, str):
        try:
            return body.encode(), TEXT
        except UnicodeEncodeError as exc:
            raise DataError(
                f"body: text with a lone surrogate at index {exc.start} cannot be UTF-8; "
                "pass bytes, or text cut on a character boundary"
            ) from None
    dump = getattr(body, "model_dump_json", None)
    if callable(dump):  # a pydantic model, without importing pydantic for the check
        return str(dump(by_alias=True)).encode(), JSON
    text = json.dumps(body, separators=(",", ":"), ensure_ascii=False)
    try:
        return text.encode(), JSON
    except UnicodeEncodeError:
        # A string cut inside a surrogate pair (what JavaScript produces) is valid JSON only
        # escaped: carried as "\ud83d", as a JavaScript producer would send it.
        return json.dumps(body, separators=(",", ":")).encode(), JSON


def marked_model(body: object) -> type | None:
    """The class of ``body`` if it is a pydantic model that marks fields ``rmqkit.Sensitive``
    (rmqkit.crypto.model), else None."""
    if not callable(getattr(body, "model_dump_json", None)):
        return None  # not a pydantic model (checked without importing pydantic)
    model = type(body)
    return model if sensitive_fields(model)[0] else None


def delay_ms_of(delay: Delay) -> int | None:
    """``add(delay=...)``: a ``timedelta`` or a duration (``"90s"``) in whole ms; ``"0s"`` or
    ``timedelta(0)`` is 0 (no delay, even where the work queue has a default one), None is
    "the queue's default, if any". Beyond the default ladder's maximum (29 h):
    DelayRangeError (65), nothing written."""
    if delay is None:
        return None
    if isinstance(delay, timedelta):
        ms = delay / timedelta(milliseconds=1)
        if ms != int(ms):
            raise DelayRangeError(f"delay {delay} is not whole milliseconds")
        ms = int(ms)
    elif isinstance(delay, str):
        try:
            ms = parse_delay_ms(delay)  # any zero ("0s", "0m", "0.0s"): no delay
        except ValueError as exc:
            raise DelayRangeError(f"delay: {exc}") from None
    else:
        raise TypeError(f"delay must be a timedelta or a duration like '90s', not {delay!r}")
    Ladder().units(ms)  # the relay's ladder: refused here rather than failed there forever
    return ms


def row_values(
    *,
    exchange: str,
    routing_key: str,
    body: object,
    message_id: str | None,
    headers: Mapping[str, Any] | None,
    aggregate: str | None,
    content_type: str | None,
    delay: Delay = None,
    encryptor: Encryptor | None = None,
) -> tuple[str, dict[str, Any]]:
    """The message_id and the row's values by column (``COLUMNS``, plus ``delay_ms`` when a
    delay is given: a table created before that column keeps working without delays)."""
    model = marked_model(body)
    if model is not None and encryptor is None:
        # Personal data is never written in plaintext, not even into the caller's own table.
        raise ConfigError(
            f"the body is a {model.__qualname__}, which marks "
            f"{', '.join(sensitive_fields(model)[0])} rmqkit.Sensitive: pass "
            "encryptor=rmqkit.outbox.Encryptor.from_env(...) to add; nothing written"
        )
    data, implied = encode_body(body)
    delay_ms = delay_ms_of(delay)
    if encryptor is not None:  # before the row is written: the table holds ciphertext
        data = encryptor.encrypt(exchange, routing_key, data, headers, model=model)
    mid = message_id or str(uuid.uuid4())
    problem = wire_problem(exchange, routing_key, mid, content_type or implied)
    traced = context_headers()  # the caller's span: the relay carries it to the consumer
    if traced and not (headers and TRACEPARENT in headers):
        headers = {**(headers or {}), **traced}
    encoded_headers = None
    if headers:
        encoded_headers = json.dumps(dict(headers), separators=(",", ":"), ensure_ascii=False)
        problem = problem or headers_problem(json.loads(encoded_headers))
    if problem is not None:  # refused here rather than retried by the relay forever
        raise ValueError(f"outbox row cannot be published: {problem}")
    values: dict[str, Any] = dict(
        zip(
            COLUMNS,
            (mid, exchange, routing_key, data, encoded_headers, content_type or implied, aggregate),
            strict=True,
        )
    )
    if delay_ms is not None:
        values["delay_ms"] = delay_ms
    return mid, values


# PostgreSQL, for a row with an aggregate: before the INSERT takes its id from the sequence
# (schema.AGGREGATE_WRITE_LOCK_SPACE). Shared: writers never wait for each other, only, for a
# few ms, for a relay that is reading the aggregate's rows.
WRITE_LOCK_SQL: Final = (
    f"SELECT pg_advisory_xact_lock_shared({AGGREGATE_WRITE_LOCK_SPACE}, hashtext(%s))"
)


def _insert_sql(placeholder: str, columns: Iterable[str]) -> str:
    names = list(columns)
    marks = ", ".join([placeholder] * len(names))
    return f"INSERT INTO {TABLE} ({', '.join(names)}) VALUES ({marks})"


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
    delay: Delay = None,
    encryptor: Encryptor | None = None,
) -> str:
    """Write one outbox row on ``conn`` (``sqlite3.Connection`` or ``psycopg.Connection``).

    Returns the message_id (a new UUID when not given): the AMQP message_id of every publish of
    this row. ``aggregate`` names the entity whose events must arrive in insertion order.
    ``headers`` must be JSON-serialisable. Never commits. ``ValueError`` (nothing written) for a
    row AMQP cannot carry: an exchange, routing key, message_id or content type over 255 bytes
    of UTF-8, a header name over 128 bytes, a header integer beyond 64 bits.

    ``delay``: ``timedelta`` or ``"90s"``, stored in the row (column ``delay_ms``); the relay
    publishes the row through the delay ladder, counting the time the row waited in the table
    (docs/outbox.md "Delays"). ``"0s"`` overrides a work queue's default delay (``relay
    --topology``). Beyond the ladder's maximum: DelayRangeError (65), nothing written.
    ``encryptor`` (``rmqkit.outbox.Encryptor``): the body's sensitive fields are encrypted before
    the row is written, so the table never holds them in plaintext; KeyRingError (78) without a
    key ring, DataError (65) for a body that is not JSON. A pydantic model ``body`` whose
    class marks fields ``rmqkit.Sensitive`` has them encrypted too (beside the encryptor's
    own); without an ``encryptor`` such a body is a ConfigError (78), nothing written.
    """
    mid, values = row_values(
        exchange=exchange,
        routing_key=routing_key,
        body=body,
        message_id=message_id,
        headers=headers,
        aggregate=aggregate,
        content_type=content_type,
        delay=delay,
        encryptor=encryptor,
    )
    if isinstance(conn, AsyncSQLiteConnection) or type(conn).__name__ == "AsyncConnection":
        raise TypeError("an asyncio connection: use `await rmqkit.outbox.add_async(conn, ...)`")
    dialect = dialect_of(conn)
    if aggregate is not None and dialect.name == "postgresql":
        conn.execute(WRITE_LOCK_SQL, (aggregate,))
    conn.execute(_insert_sql(dialect.placeholder, values), tuple(values.values()))
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
    delay: Delay = None,
    encryptor: Encryptor | None = None,
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
        delay=delay,
        encryptor=encryptor,
    )
    dialect = dialect_of(conn)
    if aggregate is not None and dialect.name == "postgresql":
        await conn.execute(WRITE_LOCK_SQL, (aggregate,))
    await conn.execute(_insert_sql(dialect.placeholder, values), tuple(values.values()))
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
    delay: Delay = None,
    encryptor: Encryptor | None = None,
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
        delay=delay,
        encryptor=encryptor,
    )
    if aggregate is not None and _sqlalchemy_dialect(session) == "postgresql":
        session.execute(text(WRITE_LOCK_SQL.replace("%s", ":aggregate")), {"aggregate": aggregate})
    binds = ", ".join(f":{column}" for column in values)
    statement = text(f"INSERT INTO {TABLE} ({', '.join(values)}) VALUES ({binds})")
    session.execute(statement, values)
    return mid


def _sqlalchemy_dialect(session: Any) -> str | None:
    """The dialect name of a SQLAlchemy Session or Connection (None if it cannot tell)."""
    bind = session.get_bind() if hasattr(session, "get_bind") else getattr(session, "engine", None)
    dialect = getattr(bind, "dialect", None)
    return getattr(dialect, "name", None)

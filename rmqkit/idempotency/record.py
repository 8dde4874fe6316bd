"""Recording a message id inside the caller's transaction, and the ``rmqkit.Transaction`` type.

``record(tx, message_id, scope=...)`` inserts the id into ``rmqkit_processed`` with
``INSERT … ON CONFLICT (scope, message_id) DO NOTHING`` and returns whether the row is new.
Because it runs in the caller's open transaction, the id and the caller's own writes commit or
roll back together (seed 003: the effect belongs in the same transaction). On PostgreSQL two
transactions inserting the same id serialize on the unique index: the second waits until the
first commits and then finds the conflict (False: a duplicate, not an error) — or, if the first
rolled back, inserts it (True). On SQLite the write lock serializes them the same way.

An id is a duplicate only within its **scope**: the consumers of two queues that receive copies
of the same message (a fanout to two services) record it in scopes of their own and both apply
it; consumers meant to apply a message once between them share one scope.
"""

from __future__ import annotations

from typing import Any, Protocol

from rmqkit.idempotency.schema import PROCESSED_TABLE
from rmqkit.store import AsyncConnection, Dialect, SyncConnection, dialect_of


class Transaction(Protocol):
    """The open database transaction a handler writes its own rows on.

    Annotate a handler's second parameter with it, and ``rmqkit consume --dedupe DSN`` passes
    the connection of the transaction that also records the message id: commit happens after the
    handler returns, rollback if it raises. It is the driver's own connection — a
    ``sqlite3.Connection`` or ``psycopg.Connection`` for a plain ``def`` handler, a
    ``psycopg.AsyncConnection`` or rmqkit's async SQLite connection (``await tx.execute(...)``)
    for an ``async def`` one. SQL placeholders are the driver's: ``?`` on SQLite, ``%s`` on
    PostgreSQL. Never commit, roll back or close it in the handler.
    """

    def execute(self, query: Any, params: Any = ..., /) -> Any:
        """Run one statement in the transaction (a coroutine on the asyncio connections)."""
        ...


def insert_sql(dialect: Dialect) -> str:
    """The statement ``record`` runs (parameters: scope, message_id, queue)."""
    return dialect.q(
        f"INSERT INTO {PROCESSED_TABLE} (scope, message_id, queue, processed_at) "
        f"VALUES (?, ?, ?, {dialect.now}) ON CONFLICT (scope, message_id) DO NOTHING"
    )


def insert_many(dialect: Dialect, ids: list[str], scope: str, queue: str) -> tuple[str, list[Any]]:
    """One statement recording ``ids`` in ``scope`` at once, in the order given (the order
    their row locks are taken in); it returns the ids that were new. On PostgreSQL the ids are
    one array parameter, so the statement text is the same for every batch size (prepared
    once)."""
    if dialect.name == "postgresql":
        sql = (
            f"INSERT INTO {PROCESSED_TABLE} (scope, message_id, queue, processed_at) "
            f"SELECT %s, m, %s, {dialect.now} FROM unnest(%s::text[]) WITH ORDINALITY AS t(m, i) "
            "ORDER BY i ON CONFLICT (scope, message_id) DO NOTHING RETURNING message_id"
        )
        return sql, [scope, queue, ids]
    rows = ", ".join([f"(?, ?, ?, {dialect.now})"] * len(ids))
    sql = (
        f"INSERT INTO {PROCESSED_TABLE} (scope, message_id, queue, processed_at) VALUES {rows} "
        "ON CONFLICT (scope, message_id) DO NOTHING RETURNING message_id"
    )
    return sql, [value for message_id in ids for value in (scope, message_id, queue)]


def forget_sql(dialect: Dialect) -> str:
    """Remove one id of one scope again inside the transaction (its handler failed);
    parameters: scope, message_id."""
    return dialect.q(f"DELETE FROM {PROCESSED_TABLE} WHERE scope = ? AND message_id = ?")


def recorded_sql(dialect: Dialect) -> str:
    """Whether one id is recorded in one scope; parameters: scope, message_id."""
    return dialect.q(f"SELECT 1 FROM {PROCESSED_TABLE} WHERE scope = ? AND message_id = ?")


def _checked(message_id: str, scope: str) -> tuple[str, str]:
    if not isinstance(message_id, str) or not message_id:
        raise ValueError("record: the message_id must be a non-empty string")
    if not isinstance(scope, str):
        raise ValueError("record: the scope must be a string")
    return scope, message_id


def record(tx: SyncConnection, message_id: str, *, scope: str = "", queue: str = "") -> bool:
    """Insert ``message_id`` into ``rmqkit_processed`` in the open transaction ``tx``; True if
    it is new in ``scope`` (apply the message), False if it was already recorded there (a
    duplicate: skip it).

    ``tx``: a ``sqlite3.Connection`` or ``psycopg.Connection`` inside a transaction the caller
    commits together with its own writes. ``scope``: whose ids these are (one per consumer, or
    one shared by consumers that must apply a message once between them); ``queue`` is kept
    with the row for the operator. Never commits.
    """
    params = (*_checked(message_id, scope), queue)
    cursor: Any = tx.execute(insert_sql(dialect_of(tx)), params)
    return bool(cursor.rowcount == 1)


async def record_async(
    tx: AsyncConnection, message_id: str, *, scope: str = "", queue: str = ""
) -> bool:
    """``record`` on an asyncio connection (psycopg ``AsyncConnection`` or rmqkit's async
    SQLite connection)."""
    params = (*_checked(message_id, scope), queue)
    cursor: Any = await tx.execute(insert_sql(dialect_of(tx)), params)
    return bool(cursor.rowcount == 1)


__all__ = [
    "Transaction",
    "forget_sql",
    "insert_many",
    "insert_sql",
    "record",
    "record_async",
    "recorded_sql",
]

"""The store layer: database connections for the outbox and the idempotency store.

A DSN picks the backend (``rmqkit.store.dsn``): ``sqlite:///relative.db``,
``sqlite:////abs/path.db`` (standard library ``sqlite3``) or ``postgresql://user@host:5432/db``
(psycopg 3, ``pip install 'rmqkit[postgres]'``). Errors: a malformed or unsupported DSN is
``ConfigError`` (exit 78, DSN masked); psycopg not installed is ``ConfigError`` naming
``rmqkit[postgres]``; a database that cannot be reached or opened is ``DatabaseUnavailable``
(exit 69). Passwords are never in a message (``Dsn.masked``, ``mask_dsn``).

Using it (sync)::

    from rmqkit.store import Store

    store = Store("postgresql://app@db:5432/app")      # or "sqlite:///app.db"
    with store.transaction() as conn:                 # a new connection, one transaction
        conn.execute(store.dialect.q("INSERT INTO t (a) VALUES (?)"), (1,))
    # committed here; rolled back if the block raised; the connection is closed

    with store.connect() as conn:                     # keep one connection for many transactions
        with transaction(conn):
            ...

Using it (asyncio)::

    async with store.transaction_async() as conn:
        await conn.execute(store.dialect.q("SELECT 1"))

``conn`` is the driver's own connection object, the one a handler writes its business rows
on: a ``sqlite3.Connection`` or a ``psycopg.Connection`` (sync); an ``AsyncSQLiteConnection``
(``rmqkit.store.asqlite``: ``sqlite3`` on a worker thread, with ``execute``/``fetchall``
coroutines like psycopg's) or a ``psycopg.AsyncConnection`` (async). Write SQL once with ``?``
placeholders and pass it through ``Dialect.q``; ``Dialect`` also has ``now`` (Unix seconds as
SQL), ``insert_ignore``, ``upsert``, ``skip_locked``, and column types. ``dialect_of(conn)``
tells the dialect of a connection the caller hands in.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Iterator

from rmqkit.store.asqlite import AsyncSQLiteConnection, AsyncSQLiteCursor
from rmqkit.store.connect import (
    AsyncConnection,
    SyncConnection,
    as_dsn,
    connect,
    connect_async,
    dialect_of,
    map_db_error,
    open_connection,
    open_connection_async,
    psycopg_module,
    transaction,
    transaction_async,
)
from rmqkit.store.dialect import POSTGRESQL, SQLITE, Dialect, dialect_for
from rmqkit.store.dsn import Dsn, mask_dsn, parse_dsn


class Store:
    """A DSN with its dialect, and transactions on it (see the module docstring)."""

    def __init__(self, dsn: str | Dsn) -> None:
        self.dsn = as_dsn(dsn)
        self.dialect = dialect_for(self.dsn.backend)

    def __repr__(self) -> str:
        return f"Store({self.dsn.masked!r})"

    def connect(self) -> contextlib.AbstractContextManager[SyncConnection]:
        """A connection for the block (closed after it)."""
        return connect(self.dsn)

    def connect_async(self) -> contextlib.AbstractAsyncContextManager[AsyncConnection]:
        """An asyncio connection for the block (closed after it)."""
        return connect_async(self.dsn)

    @contextlib.contextmanager
    def transaction(self) -> Iterator[SyncConnection]:
        """A new connection and one transaction on it: committed at the end, else rolled back."""
        with self.connect() as connection, transaction(connection):
            yield connection

    @contextlib.asynccontextmanager
    async def transaction_async(self) -> AsyncIterator[AsyncConnection]:
        """``transaction`` for asyncio."""
        async with self.connect_async() as connection, transaction_async(connection):
            yield connection


__all__ = [
    "POSTGRESQL",
    "SQLITE",
    "AsyncConnection",
    "AsyncSQLiteConnection",
    "AsyncSQLiteCursor",
    "Dialect",
    "Dsn",
    "Store",
    "SyncConnection",
    "as_dsn",
    "connect",
    "connect_async",
    "dialect_for",
    "dialect_of",
    "map_db_error",
    "mask_dsn",
    "open_connection",
    "open_connection_async",
    "parse_dsn",
    "psycopg_module",
    "transaction",
    "transaction_async",
]

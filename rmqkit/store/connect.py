"""Opening connections and transactions on a DSN, sync and async, with rmqkit's error mapping.

SQLite connections are made with ``isolation_level=None`` (the driver never opens a
transaction behind the caller's back), WAL journaling (readers do not block the writer) and a
30-second busy timeout; ``transaction`` starts them with ``BEGIN IMMEDIATE`` so that two writers
queue on the lock instead of failing when a read transaction upgrades. PostgreSQL connections
are psycopg 3 connections in autocommit mode, and ``transaction`` is psycopg's own
``Connection.transaction()``. A database that cannot be reached or opened is
``DatabaseUnavailable`` (exit 69); psycopg missing is a ``ConfigError`` (exit 78).
"""

from __future__ import annotations

import contextlib
import sqlite3
from collections.abc import AsyncIterator, Iterator
from typing import TYPE_CHECKING, Any, Final, TypeAlias

from rmqkit.errors import ConfigError, DatabaseUnavailable, RmqkitError
from rmqkit.store.asqlite import AsyncSQLiteConnection
from rmqkit.store.dialect import POSTGRESQL, SQLITE, Dialect
from rmqkit.store.dsn import Dsn, parse_dsn

if TYPE_CHECKING:
    import psycopg

SyncConnection: TypeAlias = "sqlite3.Connection | psycopg.Connection[Any]"
AsyncConnection: TypeAlias = "AsyncSQLiteConnection | psycopg.AsyncConnection[Any]"

CONNECT_TIMEOUT_S: Final = 5  # libpq connect_timeout unless the DSN sets one
SQLITE_BUSY_TIMEOUT_S: Final = 30.0


def as_dsn(dsn: str | Dsn) -> Dsn:
    """``dsn`` parsed (``ConfigError`` if malformed), or as given if already parsed."""
    return dsn if isinstance(dsn, Dsn) else parse_dsn(dsn)


def psycopg_module() -> Any:
    """The psycopg module, or ``ConfigError`` (exit 78) telling how to install it."""
    try:
        import psycopg
    except ImportError:
        raise ConfigError(
            "the PostgreSQL backend needs psycopg 3 — install rmqkit[postgres] "
            "(pip install 'rmqkit[postgres]')"
        ) from None
    return psycopg


def dialect_of(connection: object) -> Dialect:
    """The dialect of a connection rmqkit accepts (sqlite3, psycopg sync/async, async SQLite)."""
    if isinstance(connection, sqlite3.Connection | AsyncSQLiteConnection):
        return SQLITE
    module = type(connection).__module__
    if module.startswith("psycopg"):
        return POSTGRESQL
    raise TypeError(
        f"not a database connection rmqkit knows: {type(connection).__name__} "
        "(expected sqlite3.Connection, psycopg.Connection or psycopg.AsyncConnection)"
    )


def map_db_error(exc: BaseException, dsn: Dsn) -> RmqkitError | None:
    """The rmqkit error for a database failure that means "unreachable"; None for any other."""
    reason = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
    if isinstance(exc, sqlite3.OperationalError):
        if any(s in reason for s in ("unable to open", "disk I/O", "locked", "readonly")):
            return DatabaseUnavailable(
                f"cannot use SQLite database {dsn.masked} ({reason}) — does its directory "
                "exist and is it writable?"
            )
        return None
    pg = _psycopg_or_none()
    if pg is not None and isinstance(exc, pg.OperationalError | pg.InterfaceError):
        reason = reason.replace(dsn.raw, dsn.masked)
        return DatabaseUnavailable(
            f"cannot reach database at {dsn.masked} ({reason}) — is PostgreSQL running "
            "and does the database exist?"
        )
    if isinstance(exc, OSError):
        return DatabaseUnavailable(f"cannot reach database at {dsn.masked} ({reason})")
    return None


def _psycopg_or_none() -> Any:
    try:
        import psycopg
    except ImportError:
        return None
    return psycopg


def _sqlite_factory(dsn: Dsn) -> sqlite3.Connection:
    connection = sqlite3.connect(dsn.target, timeout=SQLITE_BUSY_TIMEOUT_S, isolation_level=None)
    try:
        connection.execute("PRAGMA journal_mode=WAL")
        connection.execute("PRAGMA synchronous=NORMAL")  # durable with WAL, far fewer fsyncs
    except BaseException:
        connection.close()
        raise
    return connection


def _pg_kwargs(dsn: Dsn) -> dict[str, Any]:
    kwargs: dict[str, Any] = {"autocommit": True}
    if "connect_timeout" not in dsn.target:
        kwargs["connect_timeout"] = CONNECT_TIMEOUT_S
    return kwargs


def open_connection(dsn: str | Dsn) -> SyncConnection:
    """A new connection (the caller closes it); see the module docstring for its settings."""
    parsed = as_dsn(dsn)
    try:
        if parsed.backend == "sqlite":
            return _sqlite_factory(parsed)
        pg = psycopg_module()
        connection: psycopg.Connection[Any] = pg.connect(parsed.target, **_pg_kwargs(parsed))
        return connection
    except RmqkitError:
        raise
    except Exception as exc:
        raise (map_db_error(exc, parsed) or exc) from None


async def open_connection_async(dsn: str | Dsn) -> AsyncConnection:
    """A new asyncio connection (the caller closes it with ``await conn.close()``)."""
    parsed = as_dsn(dsn)
    try:
        if parsed.backend == "sqlite":
            return await AsyncSQLiteConnection.open(lambda: _sqlite_factory(parsed))
        pg = psycopg_module()
        connection: psycopg.AsyncConnection[Any] = await pg.AsyncConnection.connect(
            parsed.target, **_pg_kwargs(parsed)
        )
        return connection
    except RmqkitError:
        raise
    except Exception as exc:
        raise (map_db_error(exc, parsed) or exc) from None


@contextlib.contextmanager
def transaction(connection: SyncConnection) -> Iterator[SyncConnection]:
    """Run the block in one transaction: commit at the end, roll back if it raises."""
    if isinstance(connection, sqlite3.Connection):
        connection.execute("BEGIN IMMEDIATE")
        try:
            yield connection
        except BaseException:
            connection.rollback()
            raise
        connection.commit()
        return
    with connection.transaction():
        yield connection


@contextlib.asynccontextmanager
async def transaction_async(connection: AsyncConnection) -> AsyncIterator[AsyncConnection]:
    """``transaction`` for an asyncio connection."""
    if isinstance(connection, AsyncSQLiteConnection):
        await connection.execute("BEGIN IMMEDIATE")
        try:
            yield connection
        except BaseException:
            await connection.rollback()
            raise
        await connection.commit()
        return
    async with connection.transaction():
        yield connection


@contextlib.contextmanager
def connect(dsn: str | Dsn) -> Iterator[SyncConnection]:
    """A connection for the block, closed after it; database failures mapped to rmqkit errors."""
    parsed = as_dsn(dsn)
    connection = open_connection(parsed)
    try:
        yield connection
    except RmqkitError:
        raise
    except Exception as exc:
        mapped = map_db_error(exc, parsed)
        if mapped is None:
            raise
        raise mapped from exc
    finally:
        connection.close()


@contextlib.asynccontextmanager
async def connect_async(dsn: str | Dsn) -> AsyncIterator[AsyncConnection]:
    """``connect`` for asyncio."""
    parsed = as_dsn(dsn)
    connection = await open_connection_async(parsed)
    try:
        yield connection
    except RmqkitError:
        raise
    except Exception as exc:
        mapped = map_db_error(exc, parsed)
        if mapped is None:
            raise
        raise mapped from exc
    finally:
        await connection.close()

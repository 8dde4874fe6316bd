"""The database connection of one dedupe worker, behind one async interface whatever the driver.

An ``async def`` handler gets the asyncio connection rmqkit.store opens (psycopg
``AsyncConnection``, or rmqkit's thread-backed async SQLite connection); a plain ``def`` handler,
which runs in a thread, gets a sync connection (``psycopg.Connection`` or ``sqlite3.Connection``)
whose calls the worker makes on a thread of its own, so the event loop never waits on the database.
"""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from rmqkit.store import Dsn, map_db_error, open_connection, open_connection_async
from rmqkit.store.connect import SQLITE_BUSY_TIMEOUT_S


class WorkerConnection:
    """One worker's connection behind one async interface, whatever the driver."""

    def __init__(self, handle: Any, executor: ThreadPoolExecutor | None) -> None:
        self.handle = handle  # what the handler receives
        self._executor = executor  # sync drivers: their calls run on this worker's thread

    async def _call(self, fn: Callable[[], Any]) -> Any:
        assert self._executor is not None
        return await asyncio.get_running_loop().run_in_executor(self._executor, fn)

    async def execute(self, sql: str, params: Any = None) -> int:
        if self._executor is None:
            cursor = await (
                self.handle.execute(sql) if params is None else self.handle.execute(sql, params)
            )
            return int(cursor.rowcount)
        handle = self.handle
        return int(
            await self._call(
                lambda: (
                    (
                        handle.execute(sql) if params is None else handle.execute(sql, params)
                    ).rowcount
                )
            )
        )

    async def fetch(self, sql: str, params: Any) -> list[Any]:
        if self._executor is None:
            cursor = await self.handle.execute(sql, params)
            return list(await cursor.fetchall())
        handle = self.handle
        return list(await self._call(lambda: handle.execute(sql, params).fetchall()))

    async def close(self) -> None:
        with contextlib.suppress(Exception):
            if self._executor is None:
                await self.handle.close()
            else:
                await self._call(self.handle.close)
        if self._executor is not None:
            self._executor.shutdown(wait=False)

    def in_transaction(self) -> bool:
        """Whether the transaction is still open and usable: a handler that swallowed an SQL
        error leaves a PostgreSQL transaction aborted (its COMMIT would quietly roll back every
        message of the batch), one that ran COMMIT/ROLLBACK itself ended it."""
        info = getattr(self.handle, "info", None)
        status = getattr(info, "transaction_status", None)
        if status is not None:  # psycopg: IDLE, ACTIVE, INTRANS, INERROR, UNKNOWN
            return bool(status.name == "INTRANS")
        connection = getattr(self.handle, "sync", self.handle)  # rmqkit's async SQLite wraps one
        return bool(getattr(connection, "in_transaction", True))

    def ended(self) -> bool:
        """Whether no transaction is open any more (ended by COMMIT/ROLLBACK, not aborted)."""
        info = getattr(self.handle, "info", None)
        status = getattr(info, "transaction_status", None)
        if status is not None:
            return bool(status.name == "IDLE")
        connection = getattr(self.handle, "sync", self.handle)
        return not bool(getattr(connection, "in_transaction", True))

    async def abandon(self) -> None:
        """Close a connection a timed-out handler may still be using (its thread cannot be
        stopped): interrupt what runs on it, then close it, which rolls its transaction back
        and releases its locks; the handler, if it goes on, gets an error on its next call."""
        if self._executor is not None:
            with contextlib.suppress(Exception):
                if isinstance(self.handle, sqlite3.Connection):
                    self.handle.interrupt()
                else:
                    self.handle.cancel()
        await self.close()


def _sqlite_for_threads(path: str) -> sqlite3.Connection:
    # As rmqkit.store opens SQLite, but usable from the handler threads too (one at a time: a
    # worker runs its transaction's statements in sequence).
    connection = sqlite3.connect(
        path, timeout=SQLITE_BUSY_TIMEOUT_S, isolation_level=None, check_same_thread=False
    )
    connection.execute("PRAGMA journal_mode=WAL")
    connection.execute("PRAGMA synchronous=NORMAL")
    return connection


async def open_worker_connection(dsn: Dsn, *, sync: bool) -> WorkerConnection:
    """A new connection for a worker: sync (for thread handlers) or asyncio; database failures
    mapped to rmqkit errors (DatabaseUnavailable)."""
    try:
        if not sync:
            return WorkerConnection(await open_connection_async(dsn), None)
        executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="rmqkit-dedupe")
        opener: Callable[[], Any]
        if dsn.backend == "sqlite":
            opener = lambda: _sqlite_for_threads(dsn.target)  # noqa: E731
        else:
            opener = lambda: open_connection(dsn)  # noqa: E731
        try:
            handle = await asyncio.get_running_loop().run_in_executor(executor, opener)
        except BaseException:
            executor.shutdown(wait=False)
            raise
        return WorkerConnection(handle, executor)
    except Exception as exc:
        raise (map_db_error(exc, dsn) or exc) from None


__all__ = ["WorkerConnection", "open_worker_connection"]

"""An asyncio face for one ``sqlite3`` connection: every call runs on the connection's own thread.

SQLite has no asynchronous driver in the standard library. Each ``AsyncSQLiteConnection`` owns
one worker thread (a single-thread executor) and one ``sqlite3.Connection`` made on it, so the
event loop never blocks on the file and the connection is only ever used from one thread.
Results are fetched inside the thread: ``execute`` returns a cursor that already holds its rows,
with the same ``fetchone``/``fetchall`` coroutines as psycopg's ``AsyncCursor``.
"""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

T = TypeVar("T")


class AsyncSQLiteCursor:
    """The result of one statement: its rows (already fetched), ``rowcount`` and ``lastrowid``."""

    def __init__(self, rows: list[Any], rowcount: int, lastrowid: int | None) -> None:
        self._rows = rows
        self.rowcount = rowcount
        self.lastrowid = lastrowid

    async def fetchone(self) -> Any:
        """The next row, or None."""
        return self._rows.pop(0) if self._rows else None

    async def fetchall(self) -> list[Any]:
        """The remaining rows."""
        rows, self._rows = self._rows, []
        return rows


class AsyncSQLiteConnection:
    """One SQLite connection driven from asyncio (see the module docstring).

    ``sync`` is the underlying ``sqlite3.Connection``; use it only through ``run``.
    """

    def __init__(self, executor: ThreadPoolExecutor, connection: sqlite3.Connection) -> None:
        self._executor = executor
        self.sync = connection

    @classmethod
    async def open(cls, factory: Callable[[], sqlite3.Connection]) -> AsyncSQLiteConnection:
        """Make the connection with ``factory`` on a new worker thread."""
        executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="rmqkit-sqlite")
        try:
            connection = await asyncio.get_running_loop().run_in_executor(executor, factory)
        except BaseException:
            executor.shutdown(wait=False)
            raise
        return cls(executor, connection)

    async def run(self, call: Callable[[sqlite3.Connection], T]) -> T:
        """Run ``call(connection)`` on the connection's thread."""
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._executor, call, self.sync)

    async def execute(self, sql: str, params: Sequence[Any] = ()) -> AsyncSQLiteCursor:
        """Execute one statement and fetch its rows."""

        def call(connection: sqlite3.Connection) -> AsyncSQLiteCursor:
            cursor = connection.execute(sql, params)
            rows = cursor.fetchall()
            return AsyncSQLiteCursor(rows, cursor.rowcount, cursor.lastrowid)

        return await self.run(call)

    async def executemany(self, sql: str, rows: Iterable[Sequence[Any]]) -> int:
        """Execute one statement for each parameter row; the total row count."""
        batch = list(rows)
        return await self.run(lambda connection: connection.executemany(sql, batch).rowcount)

    async def commit(self) -> None:
        """Commit the open transaction, if any."""
        await self.run(lambda connection: connection.commit())

    async def rollback(self) -> None:
        """Roll back the open transaction, if any."""
        await self.run(lambda connection: connection.rollback())

    async def close(self) -> None:
        """Close the connection and stop its thread."""
        try:
            await self.run(lambda connection: connection.close())
        finally:
            self._executor.shutdown(wait=False)

"""Handlers run with their message id recorded in the same transaction, several per commit.

``DedupeLanes`` is what ``rmqkit consume --dedupe`` runs each delivery through. Deliveries
queue up; each of ``connections`` lanes (one database connection each) takes what is queued
(up to ``batch``) and handles it in **one** transaction:

1. ``BEGIN`` (SQLite: ``BEGIN IMMEDIATE``, the write lock up front);
2. record every id of the batch with one ``INSERT … ON CONFLICT DO NOTHING RETURNING``, ids
   sorted so that two lanes (or two consumers) lock them in the same order and cannot deadlock
   on them; an id that is not returned was already recorded — committed by someone else, or
   in flight in another transaction, which this insert waited for — and is a **duplicate**: its
   handler is not called. With the ordering guard, the batch's keys are locked the same way;
3. the handlers: a handler that takes the transaction (or with the guard on) runs alone inside
   a SAVEPOINT, so that its failure rolls back its own writes (and the guard's version) only;
   handlers that do not take it run concurrently. A failed one's id is deleted again;
4. ``COMMIT``; only then are the results handed back, and the consumer acks.

A commit is one disk flush for the whole batch: that is the speed-up over one transaction per
message. If the transaction breaks (a deadlock in the handlers' own writes, a lost connection)
every message of the batch is run again, each in a transaction of its own; if that fails too
the error is the message's outcome (a transient failure: retried through the wait queues). A
handler that timed out while holding the transaction (a sync handler's thread cannot be stopped)
abandons the connection: it is closed once the thread lets go, never reused.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import sqlite3
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from enum import Enum, StrEnum
from typing import Any, Generic, TypeVar

from rmqkit.errors import ConfigError
from rmqkit.guard import apply_sql, lock_keys_sql
from rmqkit.idempotency.record import forget_sql, insert_many
from rmqkit.idempotency.schema import PROCESSED_TABLE
from rmqkit.store import (
    Dsn,
    as_dsn,
    dialect_for,
    map_db_error,
    open_connection,
    open_connection_async,
)
from rmqkit.store.connect import SQLITE_BUSY_TIMEOUT_S

log = logging.getLogger("rmqkit.consumer")
R = TypeVar("R")
_SAVEPOINT = "rmqkit_message"
_REOPEN_PAUSE_S = 0.5  # a database that refuses connections is not asked again at once


class HandlerEnd(Enum):
    """How a handler call ended, as far as its transaction is concerned."""

    OK = "ok"  # commit its writes
    FAILED = "failed"  # roll back its writes and its id
    ABANDONED = "abandoned"  # still running (timed out): the connection may be in use


class Verdict(StrEnum):
    """What happened to one message."""

    APPLIED = "applied"
    DUPLICATE = "duplicate"  # id already recorded: handler not called
    STALE = "stale"  # not newer than its key's applied version: handler not called
    ROLLED_BACK = "rolled_back"  # the handler failed: its writes and id rolled back


@dataclass(frozen=True)
class OrderKey:
    """The ordering guard's key and version of one message."""

    key: str
    version: int


@dataclass(frozen=True)
class LaneOptions:
    """``connections`` lanes, at most ``batch`` messages per transaction."""

    dsn: str
    queue: str
    connections: int = 4
    batch: int = 100
    pass_transaction: bool = False  # the handler takes an rmqkit.Transaction
    sync_connection: bool = False  # it runs in a thread: give it a sync connection
    ordered: bool = False  # messages carry an OrderKey (the guard runs)


@dataclass(eq=False)
class _Job(Generic[R]):
    message_id: str
    order: OrderKey | None
    call: Callable[[Any], Awaitable[R]]
    future: asyncio.Future[tuple[Verdict, R | None]] = field(repr=False)

    def resolve(self, verdict: Verdict, outcome: R | None) -> None:
        if not self.future.done():
            self.future.set_result((verdict, outcome))

    def fail(self, exc: BaseException) -> None:
        if not self.future.done():
            self.future.set_exception(exc)


class _Abandoned(Exception):
    def __init__(self, job: _Job[Any], outcome: Any) -> None:
        super().__init__("handler abandoned its transaction")
        self.job, self.outcome = job, outcome


class _Conn:
    """One lane's connection behind one async interface, whatever the driver."""

    def __init__(self, handle: Any, executor: ThreadPoolExecutor | None) -> None:
        self.handle = handle  # what the handler receives
        self._executor = executor  # sync drivers: their calls run on this lane's thread

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
    # lane runs its transaction's statements in sequence).
    connection = sqlite3.connect(
        path, timeout=SQLITE_BUSY_TIMEOUT_S, isolation_level=None, check_same_thread=False
    )
    connection.execute("PRAGMA journal_mode=WAL")
    connection.execute("PRAGMA synchronous=NORMAL")
    return connection


class DedupeLanes(Generic[R]):
    """Run handler calls with their ids recorded in the same transaction (module docstring).

    ``judge(outcome)`` says whether a call's outcome commits, rolls back, or abandoned the
    connection. Use from one event loop; ``start`` before ``run``, ``close`` at the end.
    """

    def __init__(self, options: LaneOptions, judge: Callable[[R], HandlerEnd]) -> None:
        self.options = options
        self._dsn: Dsn = as_dsn(options.dsn)
        self._dialect = dialect_for(self._dsn.backend)
        self._judge = judge
        self._savepoints = options.pass_transaction or options.ordered
        self._begin = "BEGIN IMMEDIATE" if self._dialect.name == "sqlite" else "BEGIN"
        self._queue: asyncio.Queue[_Job[R]] = asyncio.Queue()
        self._lanes: list[asyncio.Task[None]] = []

    async def start(self) -> None:
        """Check the store answers and was initialised; start the lanes."""
        conn = await self._open()
        try:
            rows = await conn.fetch(
                self._dialect.q(f"SELECT count(*) FROM {PROCESSED_TABLE} WHERE message_id = ?"),
                ("",),
            )
        except Exception as exc:
            raise ConfigError(
                f"the dedupe store {self._dsn.masked} is not ready ({_first_line(exc)}) — run "
                f"`rmqkit dedupe init --dsn {self._dsn.masked}` first"
            ) from None
        finally:
            await conn.close()
        del rows
        for index in range(max(1, self.options.connections)):
            self._lanes.append(asyncio.create_task(self._lane(), name=f"rmqkit-dedupe-{index}"))

    async def close(self) -> None:
        """Stop the lanes (call once no message is in flight)."""
        for lane in self._lanes:
            lane.cancel()
        for lane in self._lanes:
            with contextlib.suppress(BaseException):
                await lane

    async def run(
        self, message_id: str, call: Callable[[Any], Awaitable[R]], order: OrderKey | None = None
    ) -> tuple[Verdict, R | None]:
        """Handle one message: ``call(tx)`` runs its handler (``tx`` is the transaction's
        connection when the handler takes one, else None) unless it is a duplicate or stale.
        Returns the verdict and the call's outcome (None when not called); raises the store's
        error when the transaction could not be completed."""
        future: asyncio.Future[tuple[Verdict, R | None]] = (
            asyncio.get_running_loop().create_future()
        )
        self._queue.put_nowait(_Job(message_id, order, call, future))
        return await future

    # --- lanes ----------------------------------------------------------------------------
    async def _open(self) -> _Conn:
        try:
            if not self.options.sync_connection:
                return _Conn(await open_connection_async(self._dsn), None)
            executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="rmqkit-dedupe")
            loop = asyncio.get_running_loop()
            if self._dsn.backend == "sqlite":
                opener: Callable[[], Any] = lambda: _sqlite_for_threads(self._dsn.target)  # noqa: E731
            else:
                opener = lambda: open_connection(self._dsn)  # noqa: E731
            try:
                handle = await loop.run_in_executor(executor, opener)
            except BaseException:
                executor.shutdown(wait=False)
                raise
            return _Conn(handle, executor)
        except Exception as exc:
            raise (map_db_error(exc, self._dsn) or exc) from None

    async def _lane(self) -> None:
        conn: _Conn | None = None
        try:
            while True:
                jobs = [await self._queue.get()]
                while len(jobs) < self.options.batch and not self._queue.empty():
                    jobs.append(self._queue.get_nowait())
                conn = await self._process(conn, jobs, fallback=len(jobs) > 1)
        finally:
            if conn is not None:
                await asyncio.shield(conn.close())

    async def _process(
        self, conn: _Conn | None, jobs: list[_Job[R]], *, fallback: bool
    ) -> _Conn | None:
        if conn is None:
            try:
                conn = await self._open()
            except Exception as exc:
                log.warning("dedupe store unavailable: %s", exc)
                await asyncio.sleep(_REOPEN_PAUSE_S)
                for job in jobs:
                    job.fail(exc)
                return None
        try:
            results = await self._transaction(conn, jobs)
        except _Abandoned as abandoned:
            await conn.abandon()
            abandoned.job.resolve(Verdict.ROLLED_BACK, abandoned.outcome)
            rest = [job for job in jobs if job is not abandoned.job]
            return await self._one_by_one(None, rest)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            conn = await self._reset(conn)
            if not fallback:
                for job in jobs:
                    job.fail(map_db_error(exc, self._dsn) or exc)
                return conn
            log.info(
                "batch of %d rolled back (%s); running each alone", len(jobs), _first_line(exc)
            )
            return await self._one_by_one(conn, jobs)
        for job, (verdict, outcome) in zip(jobs, results, strict=True):
            job.resolve(verdict, outcome)
        return conn

    async def _one_by_one(self, conn: _Conn | None, jobs: list[_Job[R]]) -> _Conn | None:
        for job in jobs:
            conn = await self._process(conn, [job], fallback=False)
        return conn

    async def _reset(self, conn: _Conn) -> _Conn | None:
        try:
            await conn.execute("ROLLBACK")
        except Exception:
            await conn.close()
            return None
        return conn

    async def _transaction(
        self, conn: _Conn, jobs: list[_Job[R]]
    ) -> list[tuple[Verdict, R | None]]:
        dialect, queue = self._dialect, self.options.queue
        await conn.execute(self._begin)
        sql, params = insert_many(dialect, sorted({job.message_id for job in jobs}), queue)
        new = {row[0] for row in await conn.fetch(sql, params)}
        keys = sorted({job.order.key for job in jobs if job.order is not None})
        if keys:
            for statement in lock_keys_sql(dialect):
                if statement.startswith("SELECT"):
                    await conn.fetch(statement, [keys])
                else:
                    await conn.execute(statement, [keys])
        results: list[tuple[Verdict, R | None]] = [(Verdict.DUPLICATE, None)] * len(jobs)
        pending: list[int] = []
        for index, job in enumerate(jobs):
            if job.message_id in new:
                new.discard(job.message_id)  # a second copy in the same batch is a duplicate
                pending.append(index)
        if self._savepoints:
            # One savepoint per message. The previous one is released together with the next
            # SAVEPOINT (one round trip on PostgreSQL); COMMIT releases the last one.
            opened = False
            for index in pending:
                results[index] = await self._in_savepoint(conn, jobs[index], opened)
                opened = True
        elif len(pending) == 1:
            index = pending[0]
            results[index] = await self._settle(conn, jobs[index], await jobs[index].call(None))
        else:
            outcomes = await asyncio.gather(*(jobs[i].call(None) for i in pending))
            for index, outcome in zip(pending, outcomes, strict=True):
                results[index] = await self._settle(conn, jobs[index], outcome)
        if not conn.in_transaction():
            raise RuntimeError(
                "the transaction was aborted or ended inside a handler (an SQL error it caught, "
                "or its own COMMIT/ROLLBACK): nothing of it is committed"
            )
        await conn.execute("COMMIT")
        return results

    async def _settle(self, conn: _Conn, job: _Job[R], outcome: R) -> tuple[Verdict, R | None]:
        if self._judge(outcome) is HandlerEnd.OK:
            return Verdict.APPLIED, outcome
        await conn.execute(forget_sql(self._dialect), (job.message_id,))
        return Verdict.ROLLED_BACK, outcome

    async def _in_savepoint(
        self, conn: _Conn, job: _Job[R], previous_open: bool
    ) -> tuple[Verdict, R | None]:
        if not previous_open:
            await conn.execute(f"SAVEPOINT {_SAVEPOINT}")
        elif self._dialect.name == "postgresql":  # two statements, one round trip
            await conn.execute(f"RELEASE SAVEPOINT {_SAVEPOINT}; SAVEPOINT {_SAVEPOINT}")
        else:  # sqlite3 runs one statement per call
            await conn.execute(f"RELEASE SAVEPOINT {_SAVEPOINT}")
            await conn.execute(f"SAVEPOINT {_SAVEPOINT}")
        if job.order is not None:
            applied = await conn.execute(
                apply_sql(self._dialect), (job.order.key, job.order.version)
            )
            if applied != 1:
                return Verdict.STALE, None
        outcome = await job.call(conn.handle if self.options.pass_transaction else None)
        end = self._judge(outcome)
        if end is HandlerEnd.OK:
            return Verdict.APPLIED, outcome
        if end is HandlerEnd.ABANDONED and self.options.pass_transaction:
            raise _Abandoned(job, outcome)
        # Back to the start of this message: its writes and the guard's version are undone;
        # the id was recorded before the savepoint, so it is deleted explicitly.
        await conn.execute(f"ROLLBACK TO SAVEPOINT {_SAVEPOINT}")
        await conn.execute(forget_sql(self._dialect), (job.message_id,))
        return Verdict.ROLLED_BACK, outcome


def _first_line(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0]


__all__ = ["DedupeLanes", "HandlerEnd", "LaneOptions", "OrderKey", "Verdict"]

"""Handlers run with their message id recorded in the same transaction, several per commit.

``DedupeWorkers`` is what ``rmqkit consume --dedupe`` runs each delivery through. Deliveries
queue up; each of ``connections`` workers (one database connection each) takes what is queued
(up to ``batch``) and handles it in **one** transaction:

1. ``BEGIN`` (SQLite: ``BEGIN IMMEDIATE``, the write lock up front);
2. record every id of the batch in the workers' scope (``WorkerOptions.scope``: the same id in
   another scope is another consumer's) with one ``INSERT … ON CONFLICT DO NOTHING RETURNING``, ids
   sorted so that two workers (or two consumers) lock them in the same order and cannot deadlock
   on them; an id that is not returned was already recorded — committed by someone else, or
   in flight in another transaction, which this insert waited for — and is a **duplicate**: its
   handler is not called. With the ordering guard, the batch's keys are locked the same way;
3. the handlers: a handler that takes the transaction (or with the guard on) runs alone inside
   a SAVEPOINT, so that its failure rolls back its own writes (and the guard's version) only;
   handlers that do not take it run concurrently, each in its delivery's own task, while the
   transaction waits for all of them. A failed one's id is deleted again;
4. ``COMMIT``; only then are the results handed back, and the consumer acks.

A commit is one disk flush for the whole batch: that is the speed-up over one transaction per
message. If the transaction breaks (a deadlock in the handlers' own writes, a lost connection)
every message of the batch is run again, each in a transaction of its own; if that fails too
the error is the message's outcome (a transient failure: retried through the wait queues). For
handlers that do not take the transaction (their own effects are outside it) a failed commit is
that outcome at once. A
handler that timed out while holding the transaction (a sync handler's thread cannot be stopped)
abandons the connection: it is interrupted and closed (its transaction rolls back), never reused.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from typing import Any, Generic, TypeVar

from rmqkit.errors import ConfigError
from rmqkit.guard import VERSIONS_TABLE, apply_sql, lock_keys_sql
from rmqkit.idempotency.connections import WorkerConnection, open_worker_connection
from rmqkit.idempotency.record import forget_sql, insert_many, recorded_sql
from rmqkit.idempotency.work import (
    Abandoned,
    Batch,
    Claim,
    DedupeVerdict,
    HandlerEnd,
    Job,
    OrderKey,
    WorkerOptions,
)
from rmqkit.store import Dsn, as_dsn, dialect_for, map_db_error

log = logging.getLogger("rmqkit.consumer")
R = TypeVar("R")
_SAVEPOINT = "rmqkit_message"
_REOPEN_PAUSE_S = 0.5  # a database that refuses connections is not asked again at once


class DedupeWorkers(Generic[R]):
    """Run handler calls with their ids recorded in the same transaction (module docstring).

    ``judge(outcome)`` says whether a call's outcome commits, rolls back, or abandoned the
    connection. Use from one event loop; ``start`` before ``run``, ``close`` at the end.
    """

    def __init__(self, options: WorkerOptions, judge: Callable[[R], HandlerEnd]) -> None:
        self.options = options
        self._dsn: Dsn = as_dsn(options.dsn)
        self._dialect = dialect_for(self._dsn.backend)
        self._judge = judge
        # Whose ids and versions: the same id or key in another scope is another consumer's.
        self._scope = options.effective_scope
        self._savepoints = options.pass_transaction or options.ordered
        self._begin = "BEGIN IMMEDIATE" if self._dialect.name == "sqlite" else "BEGIN"
        self._queue: asyncio.Queue[Any] = asyncio.Queue()  # Job, or Claim without savepoints
        self._workers: list[asyncio.Task[None]] = []
        self.transactions = 0  # committed (for the logs and the benchmark: messages per commit)

    async def start(self) -> None:
        """Check the store answers and was initialised; start the workers."""
        conn = await self._open()
        try:
            # The statements the workers run need the scoped schema: an older store fails here.
            await conn.fetch(recorded_sql(self._dialect), (self._scope, ""))
            if self.options.ordered:
                await conn.fetch(
                    self._dialect.q(f"SELECT 1 FROM {VERSIONS_TABLE} WHERE scope = ? AND key = ?"),
                    (self._scope, b""),
                )
        except Exception as exc:
            # Unreachable or cut off (a failover, a terminated backend, SQLite locked) is not
            # "never initialised": DatabaseUnavailable (69, a worker is restarted), not 78
            # (fatal: the supervisor would stop every worker).
            unavailable = map_db_error(exc, self._dsn)
            if unavailable is not None:
                raise unavailable from None
            raise ConfigError(
                f"the dedupe store {self._dsn.masked} is not ready ({_first_line(exc)}) — run "
                f"`rmqkit dedupe init --dsn {self._dsn.masked}` first"
            ) from None
        finally:
            await conn.close()
        for index in range(max(1, self.options.connections)):
            self._workers.append(asyncio.create_task(self._work(), name=f"rmqkit-dedupe-{index}"))

    async def close(self) -> None:
        """Stop the workers (call once no message is in flight)."""
        for worker in self._workers:
            worker.cancel()
        for worker in self._workers:
            with contextlib.suppress(BaseException):
                await worker

    async def run(
        self, message_id: str, call: Callable[[Any], Awaitable[R]], order: OrderKey | None = None
    ) -> tuple[DedupeVerdict, R | None]:
        """Handle one message: ``call(tx)`` runs its handler (``tx`` is the transaction's
        connection when the handler takes one, else None) unless it is a duplicate or stale.
        Returns the verdict and the call's outcome (None when not called); raises the store's
        error when the transaction could not be completed."""
        loop = asyncio.get_running_loop()
        if not self._savepoints:
            return await self._run_claimed(loop, message_id, call)
        future: asyncio.Future[tuple[DedupeVerdict, R | None]] = loop.create_future()
        self._queue.put_nowait(Job(message_id, order, call, future))
        return await future

    async def _run_claimed(
        self,
        loop: asyncio.AbstractEventLoop,
        message_id: str,
        call: Callable[[Any], Awaitable[R]],
    ) -> tuple[DedupeVerdict, R | None]:
        """Without savepoints the handler runs here, in the delivery's own task (no task per
        message): a worker records the id and keeps the transaction open until every handler of
        its batch has reported, then commits; the verdict comes after the commit."""
        claim: asyncio.Future[tuple[Batch, bool]] = loop.create_future()
        self._queue.put_nowait(Claim(message_id, claim))
        batch, new = await claim
        if not new:
            return DedupeVerdict.DUPLICATE, None
        ok = False
        try:
            outcome = await call(None)
            ok = self._judge(outcome) is HandlerEnd.OK
        finally:
            batch.report(message_id, ok)
        await batch.committed.wait()
        if batch.error is not None:
            raise batch.error
        return (DedupeVerdict.APPLIED if ok else DedupeVerdict.ROLLED_BACK), outcome

    # --- workers --------------------------------------------------------------------------
    async def _open(self) -> WorkerConnection:
        return await open_worker_connection(self._dsn, sync=self.options.sync_connection)

    async def _work(self) -> None:
        conn: WorkerConnection | None = None
        try:
            while True:
                jobs = [await self._queue.get()]
                while len(jobs) < self.options.batch and not self._queue.empty():
                    jobs.append(self._queue.get_nowait())
                if self._savepoints:
                    conn = await self._process(conn, jobs, fallback=len(jobs) > 1)
                else:
                    conn = await self._claims(conn, jobs)
        finally:
            if conn is not None:
                await asyncio.shield(conn.close())

    async def _process(
        self, conn: WorkerConnection | None, jobs: list[Job[R]], *, fallback: bool
    ) -> WorkerConnection | None:
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
        except Abandoned as abandoned:
            await conn.abandon()
            abandoned.job.resolve(DedupeVerdict.ROLLED_BACK, abandoned.outcome)
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

    async def _claims(
        self, conn: WorkerConnection | None, claims: list[Claim]
    ) -> WorkerConnection | None:
        batch = Batch()
        try:
            if conn is None:
                conn = await self._open()
            await conn.execute(self._begin)
            ids = sorted({claim.message_id for claim in claims})
            sql, params = insert_many(self._dialect, ids, self._scope, self.options.queue)
            new = {row[0] for row in await conn.fetch(sql, params)}
        except Exception as exc:
            error = map_db_error(exc, self._dsn) or exc
            log.warning("dedupe store failed: %s", _first_line(error))
            for claim in claims:
                if not claim.future.done():
                    claim.future.set_exception(error)
            if conn is None:
                await asyncio.sleep(_REOPEN_PAUSE_S)
                return None
            return await self._reset(conn)
        for claim in claims:
            fresh = claim.message_id in new
            new.discard(claim.message_id)  # a second copy in the same batch is a duplicate
            if claim.future.done():  # its delivery was cancelled (shutdown): not handled
                if fresh:
                    batch.failed.append(claim.message_id)
                continue
            batch.pending += int(fresh)
            claim.future.set_result((batch, fresh))
        try:
            await batch.all_reported()
            for message_id in batch.failed:
                await conn.execute(forget_sql(self._dialect), (self._scope, message_id))
            await conn.execute("COMMIT")
        except Exception as exc:
            batch.end(map_db_error(exc, self._dsn) or exc)
            return await self._reset(conn)
        self.transactions += 1
        batch.end()
        return conn

    async def _one_by_one(
        self, conn: WorkerConnection | None, jobs: list[Job[R]]
    ) -> WorkerConnection | None:
        for job in jobs:
            conn = await self._process(conn, [job], fallback=False)
        return conn

    async def _reset(self, conn: WorkerConnection) -> WorkerConnection | None:
        try:
            await conn.execute("ROLLBACK")
        except Exception:
            await conn.close()
            return None
        return conn

    async def _transaction(
        self, conn: WorkerConnection, jobs: list[Job[R]]
    ) -> list[tuple[DedupeVerdict, R | None]]:
        dialect, scope, queue = self._dialect, self._scope, self.options.queue
        await conn.execute(self._begin)
        sql, params = insert_many(dialect, sorted({job.message_id for job in jobs}), scope, queue)
        new = {row[0] for row in await conn.fetch(sql, params)}
        keys = sorted({job.order.key for job in jobs if job.order is not None})
        if keys:
            for statement in lock_keys_sql(dialect):
                if statement.startswith("SELECT"):
                    await conn.fetch(statement, [scope, keys])
                else:
                    await conn.execute(statement, [scope, keys])
        results: list[tuple[DedupeVerdict, R | None]] = [(DedupeVerdict.DUPLICATE, None)] * len(
            jobs
        )
        pending: list[int] = []
        for index, job in enumerate(jobs):
            if job.message_id in new:
                new.discard(job.message_id)  # a second copy in the same batch is a duplicate
                pending.append(index)
        if self._savepoints:
            # One savepoint per message. The previous one is released together with the next
            # SAVEPOINT (one round trip on PostgreSQL); COMMIT releases the last one.
            opened = False
            for position, index in enumerate(pending):
                results[index] = await self._in_savepoint(conn, jobs[index], opened)
                opened = True
                if not conn.in_transaction():
                    await self._ended_by_handler(conn, jobs, pending[position:])
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
        self.transactions += 1
        return results

    async def _ended_by_handler(
        self, conn: WorkerConnection, jobs: list[Job[R]], pending: list[int]
    ) -> None:
        """The handler of ``jobs[pending[0]]`` ended the transaction itself (or left it
        aborted). A COMMIT there also committed the ids of the batch's messages whose handlers
        have not run yet (all ids are recorded up front): delete them again, or the batch's
        rerun would take them for duplicates and their effects would be lost. Then raise: the
        batch is run again one message at a time (what committed is then a duplicate)."""
        if conn.ended():
            rogue = jobs[pending[0]].message_id
            committed = await conn.fetch(recorded_sql(self._dialect), (self._scope, rogue))
            # After a ROLLBACK nothing of the batch is left: nothing to delete (and an id a
            # concurrent consumer recorded since must not be).
            for index in pending[1:] if committed else []:
                await conn.execute(forget_sql(self._dialect), (self._scope, jobs[index].message_id))
        raise RuntimeError(
            "the transaction was aborted or ended inside a handler (an SQL error it caught, "
            "or its own COMMIT/ROLLBACK): the batch is run again, one message at a time"
        )

    async def _settle(
        self, conn: WorkerConnection, job: Job[R], outcome: R
    ) -> tuple[DedupeVerdict, R | None]:
        if self._judge(outcome) is HandlerEnd.OK:
            return DedupeVerdict.APPLIED, outcome
        await conn.execute(forget_sql(self._dialect), (self._scope, job.message_id))
        return DedupeVerdict.ROLLED_BACK, outcome

    async def _in_savepoint(
        self, conn: WorkerConnection, job: Job[R], previous_open: bool
    ) -> tuple[DedupeVerdict, R | None]:
        if not previous_open:
            await conn.execute(f"SAVEPOINT {_SAVEPOINT}")
        elif self._dialect.name == "postgresql":  # two statements, one round trip
            await conn.execute(f"RELEASE SAVEPOINT {_SAVEPOINT}; SAVEPOINT {_SAVEPOINT}")
        else:  # sqlite3 runs one statement per call
            await conn.execute(f"RELEASE SAVEPOINT {_SAVEPOINT}")
            await conn.execute(f"SAVEPOINT {_SAVEPOINT}")
        if job.order is not None:
            applied = await conn.execute(
                apply_sql(self._dialect), (self._scope, job.order.key, job.order.version)
            )
            if applied != 1:
                return DedupeVerdict.STALE, None
        outcome = await job.call(conn.handle if self.options.pass_transaction else None)
        end = self._judge(outcome)
        if end is HandlerEnd.OK:
            return DedupeVerdict.APPLIED, outcome
        if end is HandlerEnd.ABANDONED and self.options.pass_transaction:
            raise Abandoned(job, outcome)
        # Back to the start of this message: its writes and the guard's version are undone;
        # the id was recorded before the savepoint, so it is deleted explicitly.
        await conn.execute(f"ROLLBACK TO SAVEPOINT {_SAVEPOINT}")
        await conn.execute(forget_sql(self._dialect), (self._scope, job.message_id))
        return DedupeVerdict.ROLLED_BACK, outcome


def _first_line(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0]


__all__ = ["DedupeVerdict", "DedupeWorkers", "HandlerEnd", "OrderKey", "WorkerOptions"]

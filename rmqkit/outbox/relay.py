"""The outbox relay: claim pending rows, publish them with confirms, then mark them published.

Publish first, mark second: a row is marked only after the broker confirmed it, so a crash
between the two leaves it pending and it is published again (at-least-once; the duplicates are
exactly the rows of the batch in flight at the crash). How rows are claimed, and why rows of one
aggregate are never in flight on two relays, is in ``rmqkit.outbox.queries``.

A returned, nacked or otherwise failed row stays pending with ``attempts`` + 1, its
``last_error``, and a back-off (1 s doubling to 5 min, jittered) before it is due again; rows of
its aggregate behind it wait with it, including those of the same batch: they are not sent
(``Broker.publish_in_order``). ``--once`` tries each pending row once and reports what is
left. SIGTERM lets the batch in flight finish (published rows are marked) and returns; work
that outlasts ``grace_s`` after the signal (a broker that blocks publishing, a connection that
hangs) is abandoned: the rows confirmed by then are marked, the others stay pending untouched.

A relay that cannot reach its broker or database when it starts exits with 69 (a supervisor
restarts it); once it has run, a lost connection is retried with back-off.

Test-only hook, read by nothing else: ``RMQKIT_OUTBOX_TEST_PAUSE_BEFORE_MARK=<seconds>`` makes the
relay sleep between the confirms of a batch and its marks, after touching the file named by
``RMQKIT_OUTBOX_TEST_PAUSE_FILE`` (the crash tests kill it there).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import random
import signal
import socket
import time
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Final

from rmqkit.broker.session import CONNECTION_ERRORS, Outcome
from rmqkit.errors import BrokerUnavailable, ConfigError, RmqkitError
from rmqkit.outbox.amqp import Broker, Row
from rmqkit.outbox.metrics import RelayMetrics
from rmqkit.outbox.options import RelayOptions, RelayReport, parse_retention
from rmqkit.outbox.queries import RETENTION_CHUNK, ids_in, queries_for
from rmqkit.outbox.rows import planner, route_rows
from rmqkit.outbox.schema import CHANNEL, REQUIRED_COLUMNS, TABLE, probe_sql, shape_error
from rmqkit.outbox.stopping import GraceOver, Stopping
from rmqkit.publishing.routing import Edge, Encryptor
from rmqkit.settings import Settings
from rmqkit.store import AsyncConnection, Store, map_db_error, open_connection_async
from rmqkit.store import transaction_async as db_transaction

__all__ = ["Relay", "RelayOptions", "RelayReport", "parse_retention", "run_relay"]

log = logging.getLogger("rmqkit.outbox")

BACKOFF_MAX_S: Final = 300.0
RETENTION_EVERY_S: Final = 60.0
GAUGES_EVERY_S: Final = 2.0
RECONNECT_MAX_S: Final = 30.0
CLOSE_TIMEOUT_S: Final = 5.0  # a blocked broker never answers connection.close
_PAUSE_ENV: Final = "RMQKIT_OUTBOX_TEST_PAUSE_BEFORE_MARK"
_PAUSE_FILE_ENV: Final = "RMQKIT_OUTBOX_TEST_PAUSE_FILE"


class Relay:
    """One relay process's loop (see the module docstring)."""

    def __init__(self, settings: Settings, options: RelayOptions) -> None:
        self.options = options
        self.store = Store(options.dsn)
        self.sql = queries_for(self.store.dialect)
        # Rows with a delay go through the ladder with or without a topology; the topology adds
        # lanes and work queues' default delays (a default beyond the ladder: 65 at start).
        self.edge = Edge(options.topology)
        # With a topology, rows for queues that encrypt are checked (never encrypted here: the
        # relay holds no key ring, and the table must not hold plaintext in the first place).
        self.encryptor = Encryptor(topology=self.edge.topology)
        self.pg = self.store.dialect.name == "postgresql"
        self.holder = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:6]}"
        self.broker = Broker(settings, window=max(options.batch, 1), name="rmqkit outbox relay")
        self.metrics = RelayMetrics()
        self.report = RelayReport()
        self.stop = Stopping(options.grace_s)
        self._conn: AsyncConnection | None = None
        self._routed: list[Row] | None = None  # the batch in flight, as routed
        self._listener: Any = None
        self._next_retention = 0.0
        self._next_gauges = 0.0

    # --- life cycle ----------------------------------------------------------------------------
    async def run(self) -> RelayReport:
        """Relay until stopped (SIGTERM) or, with ``once``, until nothing is due."""
        loop = asyncio.get_running_loop()
        with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
            loop.add_signal_handler(signal.SIGTERM, self.request_stop)
        if self.options.metrics_port is not None:
            self.metrics.serve(self.options.metrics_port)
        try:
            if self.options.once:
                try:
                    await self.stop.guarded(self._connect())
                except GraceOver:
                    return self.report
                await self._once()
            else:
                await self._forever()
        finally:
            with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
                loop.remove_signal_handler(signal.SIGTERM)
            await self._disconnect()
        return self.report

    def request_stop(self) -> None:
        """Stop (what SIGTERM does): the batch in flight gets ``grace_s`` to finish."""
        self.stop.request()

    async def _connect(self) -> None:
        # The database first: a bad DSN or a missing table is a configuration error (78) that
        # should not wait on the broker.
        self._conn = await open_connection_async(self.store.dsn)
        await self._check_table()
        if self.pg and self.options.listen:
            self._listener = await open_connection_async(self.store.dsn)
            await self._listener.execute(f"LISTEN {CHANNEL}")
        await self.broker.open()

    async def _disconnect(self) -> None:
        timeout = CLOSE_TIMEOUT_S
        if self.stop.is_set():  # within what is left of the grace
            timeout = min(timeout, max(0.5, self.stop.grace_left()))
        with contextlib.suppress(TimeoutError):  # a blocked or silent broker: abandon it
            await asyncio.wait_for(self.broker.close(), timeout)
        for conn in (self._conn, self._listener):
            if conn is not None:
                with contextlib.suppress(Exception):
                    if not self.pg:
                        await conn.execute(self.sql.release, (self.holder,))
                    await conn.close()
        self._conn = self._listener = None

    async def _check_table(self) -> None:
        try:
            await self._fetch(probe_sql())
        except Exception as exc:
            mapped = self._mapped(exc)
            if not isinstance(mapped, ConfigError) and map_db_error(exc, self.store.dsn) is None:
                # The table is there but not the one rmqkit reads: say which columns it lacks.
                missing = [c for c in REQUIRED_COLUMNS if not await self._readable(c)]
                mapped = shape_error(self.store.dsn, exc, missing)
            raise mapped from None
        try:
            await self._fetch(self.sql.has_delay)
        except Exception:
            # A table from before delays: relay it as it is (no row can carry a delay yet);
            # `rmqkit outbox init` adds the column.
            log.warning(
                "outbox relay: table %s has no column delay_ms (created by an older rmqkit): "
                "rows are relayed without delays; run `rmqkit outbox init` to add it",
                TABLE,
            )
            self.sql = queries_for(self.store.dialect, delay_column=False)

    async def _readable(self, column: str) -> bool:
        try:
            await self._fetch(probe_sql((column,)))
        except Exception:
            return False
        return True

    async def _forever(self) -> None:
        delay = 1.0
        started = False
        while not self.stop.is_set():
            try:
                await self.stop.guarded(self._connect())
                started = True
                delay = 1.0
                await self._serve()
            except GraceOver:
                log.warning("outbox relay: stopped while connecting (grace over)")
                return
            except Exception as exc:
                error = self._mapped(exc)
                if isinstance(error, ConfigError) or not _is_unavailable(error) or not started:
                    # At start, unreachable is an exit (69) for the supervisor to restart.
                    raise error from exc
                log.warning("outbox relay: %s; reconnecting in %.0f s", error, delay)
                await self._disconnect()
                await self._sleep(delay)
                delay = min(delay * 2, RECONNECT_MAX_S)

    def _mapped(self, exc: BaseException) -> BaseException:
        if isinstance(exc, RmqkitError):
            return exc
        text = str(exc)
        if TABLE in text and ("does not exist" in text or "no such table" in text):
            # At start, or dropped under a running relay (a migration rolled back): 78, one line.
            return shape_error(self.store.dsn, exc, [])
        mapped = map_db_error(exc, self.store.dsn)
        if mapped is not None:
            return mapped
        if isinstance(exc, CONNECTION_ERRORS):
            return BrokerUnavailable(f"broker connection lost: {exc}")
        return exc

    # --- the loops -----------------------------------------------------------------------------
    async def _once(self) -> None:
        try:
            run_start = (await self._fetch(self.sql.now))[0][0]
            last = (await self._fetch(self.sql.max_id))[0][0]
            while not self.stop.is_set():
                claimed = await self._batch(self.sql.claim_once, (run_start, run_start))
                if claimed == 0:
                    break
            await self._retention(force=True)
            left = (await self._fetch(self.sql.pending_before, (last,)))[0][0]
        except Exception as exc:
            raise self._mapped(exc) from exc
        self.report.left_pending = int(left)

    async def _serve(self) -> None:
        while not self.stop.is_set():
            if not self.pg and not await self._lease():
                await self._wait(self.options.poll_s)
                continue
            claimed = await self._batch(self.sql.claim_due, ())
            await self._retention()
            await self._gauges()
            if claimed < self.options.batch:
                await self._wait(self.options.poll_s)

    async def _lease(self) -> bool:
        """SQLite: take or renew the relay lease; False while another relay holds it."""
        assert self._conn is not None
        cursor = await self._conn.execute(self.sql.lease, (self.holder, self.options.lease_s))
        held = bool(cursor.rowcount)
        if not held:
            log.info("outbox relay: another relay holds the SQLite lease; waiting")
        return held

    async def _keep_lease(self) -> None:
        """SQLite: renew the lease while a batch is out. A batch can outlast the lease (a broker
        in flow control blocks publishes); without this a second relay would take the lease and
        publish the same rows, a duplicate without any crash."""
        while True:
            await asyncio.sleep(self.options.lease_s / 3)
            await self._lease()

    # --- one batch -----------------------------------------------------------------------------
    async def _batch(self, claim: str, params: tuple[Any, ...]) -> int:
        """Claim, publish, mark one batch; the number of rows claimed."""
        conn = self._conn
        assert conn is not None
        # PostgreSQL: the claim's row and aggregate locks last until the marks commit.
        scope: Any = conn.transaction() if self.pg else contextlib.nullcontext()  # type: ignore[union-attr]
        async with scope:
            limit = self.options.batch
            found = await self._fetch(claim, (*params, limit))
            held = sorted({str(v[7]) for v in found if v[7] is not None})
            if self.pg and held:  # queries.py: the second statement puts aggregates in order
                free = [int(v[0]) for v in found if v[7] is None]
                again = (
                    self.sql.reclaim_once if claim == self.sql.claim_once else self.sql.reclaim_due
                )
                found = await self._fetch(again, (*params, free, held, limit))
            if self.pg:
                # The writers' locks are needed until that snapshot only. (A claim that failed
                # leaves them to the connection, which every error path closes.)
                await self._fetch(self.sql.release_writers)
            rows = [Row.of(v) for v in found]
            if not rows:
                return 0
            log.debug("claimed %d rows, ids %d..%d", len(rows), rows[0].id, rows[-1].id)
            renewing = None if self.pg else asyncio.create_task(self._keep_lease())
            outcomes: list[Outcome | str | None] = [None] * len(rows)
            try:
                try:
                    rows = await self.stop.guarded(self._publish(rows, outcomes))
                except GraceOver:
                    left = sum(o is None for o in outcomes)
                    log.warning(
                        "outbox relay: stopped %.0f s after the signal with %d row(s) of the "
                        "batch unconfirmed; they stay pending",
                        self.options.grace_s,
                        left,
                    )
                    rows = self._routed or rows
                await _test_pause()
            finally:
                if renewing is not None:
                    renewing.cancel()
                    await asyncio.gather(renewing, return_exceptions=True)
            await self._mark(rows, outcomes)
        log.debug("committed the marks of ids %d..%d", rows[0].id, rows[-1].id)
        self.report.batches += 1
        if self.broker.lost:
            raise BrokerUnavailable("the broker connection was lost during a batch")
        return len(rows)

    async def _publish(self, rows: list[Row], outcomes: list[Outcome | str | None]) -> list[Row]:
        """Route and publish one batch, ``outcomes`` filled in place; the routed rows."""
        self._routed = None
        routed = await route_rows(self.edge, self.encryptor, self.broker.session, rows)
        self._routed = routed
        await self.broker.publish_in_order(
            routed, pipelined=self.options.pipelined, prepare=planner(self.edge), results=outcomes
        )
        return routed

    async def _mark(self, rows: Sequence[Row], outcomes: Sequence[Outcome | str | None]) -> None:
        """Confirmed rows published; failed rows back off; rows not sent (None) untouched."""
        assert self._conn is not None
        done = [row.id for row, o in zip(rows, outcomes, strict=True) if o is Outcome.CONFIRMED]
        failed: list[tuple[str, float, int]] = []
        for row, outcome in zip(rows, outcomes, strict=True):
            if outcome is Outcome.CONFIRMED or outcome is None:
                continue
            error = _describe(row, outcome)
            if row.ladder_target is not None and row.routing_problem is None:
                self.edge.forget_ladder()  # missing or broken: declared again next time
            self._count_failure(outcome)
            if len(self.report.errors) < 100:
                self.report.errors[row.message_id] = error
            backoff = min(BACKOFF_MAX_S, 2.0**row.attempts) * random.uniform(0.5, 1.0)
            failed.append((error, backoff, row.id))
        async with db_transaction(self._conn) as conn:
            if done:
                sql = self.store.dialect.q(
                    self.sql.mark_published_prefix + ids_in(self.store.dialect, len(done))
                )
                await conn.execute(sql, done)
            for values in failed:
                await conn.execute(self.sql.mark_failed, values)
        self.report.published += len(done)
        self.metrics.published.inc(len(done))

    def _count_failure(self, outcome: Outcome | str) -> None:
        if outcome is Outcome.RETURNED:
            self.report.returned += 1
            self.metrics.returned.inc()
        elif outcome is Outcome.NACKED:
            self.report.nacked += 1
            self.metrics.nacked.inc()
        else:
            self.report.failed += 1
            self.metrics.failed.inc()

    # --- housekeeping --------------------------------------------------------------------------
    async def _retention(self, *, force: bool = False) -> None:
        """Delete published rows older than the retention, RETENTION_CHUNK rows per statement."""
        if self.options.retention_s is None or (
            not force and time.monotonic() < self._next_retention
        ):
            return
        self._next_retention = time.monotonic() + RETENTION_EVERY_S
        assert self._conn is not None
        while not self.stop.is_set():
            cursor = await self._conn.execute(
                self.sql.delete_published, (self.options.retention_s, RETENTION_CHUNK)
            )
            if cursor.rowcount < RETENTION_CHUNK:
                break

    async def _gauges(self) -> None:
        if self.options.metrics_port is None or time.monotonic() < self._next_gauges:
            return
        self._next_gauges = time.monotonic() + GAUGES_EVERY_S
        count, oldest, now = (await self._fetch(self.sql.pending))[0]
        self.metrics.pending.set(count)
        self.metrics.lag.set(max(0.0, now - oldest) if oldest is not None else 0.0)

    # --- waiting -------------------------------------------------------------------------------
    async def _wait(self, seconds: float) -> None:
        """Until a NOTIFY (PostgreSQL), ``seconds`` (the polling fallback) or a stop."""
        if self._listener is None:
            await self._sleep(seconds)
            return
        deadline = time.monotonic() + seconds
        while not self.stop.is_set() and (left := deadline - time.monotonic()) > 0:
            # Short slices, so a SIGTERM is seen within a quarter second.
            async for _ in self._listener.notifies(timeout=min(left, 0.25), stop_after=1):
                return

    async def _sleep(self, seconds: float) -> None:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.stop.wait(), seconds)

    async def _fetch(self, sql: str, params: Sequence[Any] = ()) -> list[Any]:
        assert self._conn is not None
        cursor = await self._conn.execute(sql, params)
        return list(await cursor.fetchall())


def _describe(row: Row, outcome: Outcome | str) -> str:
    if outcome is Outcome.RETURNED and row.ladder_target is not None:
        return "returned: the delay ladder's entry routed it to no rung (the ladder was deleted?)"
    if outcome is Outcome.RETURNED:
        return (
            f"returned: no queue is bound to exchange {row.exchange!r} for routing key "
            f"{row.routing_key!r}"
        )
    if outcome is Outcome.NACKED:
        return "nacked: the broker refused it (a full queue with overflow=reject-publish?)"
    return str(outcome)


def _is_unavailable(error: BaseException) -> bool:
    return isinstance(error, RmqkitError) and error.exit_code == 69


async def _test_pause() -> None:
    seconds = os.environ.get(_PAUSE_ENV)
    if seconds:
        marker = os.environ.get(_PAUSE_FILE_ENV)
        if marker:
            Path(marker).touch()  # noqa: ASYNC240 (test-only, one tiny file)
        await asyncio.sleep(float(seconds))


async def run_relay(settings: Settings, options: RelayOptions) -> RelayReport:
    """Run one relay (``rmqkit outbox relay``); see ``Relay``."""
    return await Relay(settings, options).run()

"""One batch of the relay: claim pending rows, publish them with confirms, mark them.

Publish first, mark second: a row is marked only after the broker confirmed it, so a crash
between the two leaves it pending and it is published again (at-least-once; the duplicates are
exactly the rows of the batch in flight at the crash). How rows are claimed, and why rows of one
aggregate are never in flight on two relays, is in ``rmqkit.outbox.queries``.

A returned, nacked or otherwise failed row stays pending with ``attempts`` + 1, its
``last_error``, and a back-off (1 s doubling to 5 min, jittered) before it is due again; rows of
its aggregate behind it wait with it, including those of the same batch: they are not sent
(``Broker.publish_in_order``). Its failure is logged once (``rmqkit.outbox.failures``).

SQLite: a relay publishes only while it holds the lease, and each batch is a row of the lease
table from its claim to its marks, so that ``rmqkit outbox retry|discard|retarget``
(``rmqkit.outbox.operator``) never changes a row a relay is publishing.

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
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Final

from rmqkit.broker.session import Outcome
from rmqkit.errors import BrokerUnavailable
from rmqkit.outbox.amqp import Row
from rmqkit.outbox.failures import describe, note_failure
from rmqkit.outbox.queries import ids_in
from rmqkit.outbox.relay_base import RelayBase
from rmqkit.outbox.rows import planner, route_rows
from rmqkit.outbox.stopping import GraceOver
from rmqkit.store import transaction_async as db_transaction

log = logging.getLogger("rmqkit.outbox")

BACKOFF_MAX_S: Final = 300.0
OPERATOR_WAIT_S: Final = 0.05  # SQLite: how often a batch looks again while an operator holds
_PAUSE_ENV: Final = "RMQKIT_OUTBOX_TEST_PAUSE_BEFORE_MARK"
_PAUSE_FILE_ENV: Final = "RMQKIT_OUTBOX_TEST_PAUSE_FILE"


class Batches(RelayBase):
    """Claim, publish and mark one batch; the SQLite lease and batch row."""

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
        assert self._conn is not None
        while True:
            await asyncio.sleep(self.options.lease_s / 3)
            await self._lease()
            await self._conn.execute(self.sql.renew_batch, (self.options.lease_s, self.holder))

    async def _begin_batch(self) -> bool:
        """SQLite: record the batch about to be claimed; False (and nothing claimed) until no
        operator command holds the table."""
        assert self._conn is not None
        while not self.stop.is_set():
            params = (self.holder, self.holder, self.options.lease_s)
            if (await self._conn.execute(self.sql.begin_batch, params)).rowcount:
                return True
            # A hold can outlast the lease: keep it, or give up the batch if another relay has
            # taken it meanwhile (both would claim once the hold is gone). ``--once`` runs
            # without the lease.
            if not self.options.once and not await self._lease():
                return False
            await self._sleep(OPERATOR_WAIT_S)
        return False

    async def _batch(self, claim: str, params: tuple[Any, ...]) -> int:
        """Claim, publish, mark one batch; the number of rows claimed."""
        conn = self._conn
        assert conn is not None
        if not self.pg and not await self._begin_batch():
            return 0
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
                if not self.pg:
                    await conn.execute(self.sql.end_batch, (self.holder,))
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
        """Confirmed rows published; failed rows back off; rows not sent (None) untouched. On
        SQLite the batch's row goes in the same transaction."""
        assert self._conn is not None
        done = [row.id for row, o in zip(rows, outcomes, strict=True) if o is Outcome.CONFIRMED]
        failed: list[tuple[str, float, int]] = []
        noted: list[tuple[Row, str, float]] = []
        for row, outcome in zip(rows, outcomes, strict=True):
            if outcome is Outcome.CONFIRMED or outcome is None:
                continue
            error = describe(row, outcome)
            if row.ladder_target is not None and row.routing_problem is None:
                self.edge.forget_ladder()  # missing or broken: declared again next time
            self._count_failure(outcome)
            if len(self.report.errors) < 100:
                self.report.errors[row.message_id] = error
            backoff = min(BACKOFF_MAX_S, 2.0**row.attempts) * random.uniform(0.5, 1.0)
            failed.append((error, backoff, row.id))
            noted.append((row, error, backoff))
        async with db_transaction(self._conn) as conn:
            if done:
                sql = self.store.dialect.q(
                    self.sql.mark_published_prefix + ids_in(self.store.dialect, len(done))
                )
                await conn.execute(sql, done)
            for values in failed:
                await conn.execute(self.sql.mark_failed, values)
            if not self.pg:
                await conn.execute(self.sql.end_batch, (self.holder,))
        for row, error, backoff in noted:  # once committed: a rolled-back mark is tried again
            note_failure(row, error, backoff)
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


async def _test_pause() -> None:
    seconds = os.environ.get(_PAUSE_ENV)
    if seconds:
        marker = os.environ.get(_PAUSE_FILE_ENV)
        if marker:
            Path(marker).touch()  # noqa: ASYNC240 (test-only, one tiny file)
        await asyncio.sleep(float(seconds))

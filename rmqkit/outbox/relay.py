"""The outbox relay: claim pending rows, publish them with confirms, then mark them published.

This module owns the relay's life cycle and loops: connecting (database first, then broker),
the daemon loop and ``--once``, waiting for work (NOTIFY or polling), reconnecting and stopping.
One batch (claim, publish, mark; publish first, mark second: at-least-once) is
``rmqkit.outbox.batch``; retention, gauges and the failing rows' summary are
``rmqkit.outbox.housekeeping``; what is logged about failing rows is ``rmqkit.outbox.failures``.

``--once`` tries each pending row once and reports what is left. SIGTERM lets the batch in
flight finish (published rows are marked) and returns; work that outlasts ``grace_s`` after the
signal (a broker that blocks publishing, a connection that hangs) is abandoned: the rows
confirmed by then are marked, the others stay pending untouched.

A relay that cannot reach its broker or database when it starts exits with 69 (a supervisor
restarts it); once it has run, a lost connection is retried with back-off. A broker that
answered and then closed the connection (an operator's ``close_all_connections``, a node
shutting down: ``CONNECTION_FORCED``) is retried at start too: it is there, and the close says
nothing about the configuration.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import time
from typing import Final

from rmqkit.broker.session import AMQP_ERRORS, CONNECTION_ERRORS, closed_by_broker
from rmqkit.errors import BrokerUnavailable, ConfigError, RmqkitError
from rmqkit.outbox.batch import BACKOFF_MAX_S, Batches
from rmqkit.outbox.housekeeping import Housekeeping
from rmqkit.outbox.options import RelayOptions, RelayReport, parse_retention
from rmqkit.outbox.queries import queries_for
from rmqkit.outbox.schema import CHANNEL, REQUIRED_COLUMNS, TABLE, probe_sql, shape_error
from rmqkit.outbox.stopping import GraceOver
from rmqkit.settings import Settings
from rmqkit.store import map_db_error, open_connection_async

__all__ = [
    "BACKOFF_MAX_S",
    "Relay",
    "RelayOptions",
    "RelayReport",
    "parse_retention",
    "run_relay",
]

log = logging.getLogger("rmqkit.outbox")

RECONNECT_MAX_S: Final = 30.0
CLOSE_TIMEOUT_S: Final = 5.0  # a blocked broker never answers connection.close


class Relay(Batches, Housekeeping):
    """One relay process's loop (see the module docstring)."""

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
                fatal = not started and not closed_by_broker(exc)
                if isinstance(error, ConfigError) or not _is_unavailable(error) or fatal:
                    # At start, unreachable is an exit (69) for the supervisor to restart.
                    raise error from exc
                log.warning("outbox relay: %s; reconnecting in %.0f s", error, delay)
                await self._disconnect()
                await self._sleep(delay)
                delay = min(delay * 2, RECONNECT_MAX_S)

    def _mapped(self, exc: BaseException) -> BaseException:
        if isinstance(exc, RmqkitError):
            return exc
        if isinstance(exc, AMQP_ERRORS):
            # Before the database's mapping: aiormq's errors are OSErrors too, and a closed
            # broker connection was reported as "cannot reach database".
            return BrokerUnavailable(f"broker connection lost: {exc}")
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
            await self._summary(force=True)
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
            await self._summary()
            if claimed < self.options.batch:
                await self._wait(self.options.poll_s)

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


def _is_unavailable(error: BaseException) -> bool:
    return isinstance(error, RmqkitError) and error.exit_code == 69


async def run_relay(settings: Settings, options: RelayOptions) -> RelayReport:
    """Run one relay (``rmqkit outbox relay``); see ``Relay``."""
    return await Relay(settings, options).run()

"""The relay's side of the broker: one session, one confirmed channel, exchange checks.

Publishing goes through rmqkit's ``ConfirmedPublisher`` (``mandatory``, confirms, a pipelined
window; returns matched exactly) on a channel of ``rmqkit.broker.session``. A row to an
exchange that does not exist is never published: the broker would close the channel (404) and
fail every other publish in flight on it. Exchanges are checked with a passive declare on the
session's probe channel and the answer kept for a few seconds. Neither is a row the AMQP wire
cannot carry (a 256-byte routing key, a header integer beyond 64 bits): it fails alone, before
it has a confirm number, and the rest of its batch goes out.

Order under failure (``publish_in_order``): a batch goes out in waves, the n-th wave holding the
n-th row of each aggregate in the batch (and, in the first, every row without one); a wave's
confirms are awaited before the next is sent. So at most one row per aggregate is unconfirmed
at any time, and once a row fails, the later rows of its aggregate are not sent at all: they
stay pending, untouched, behind it. Rows without an aggregate and the heads of different
aggregates still share one round trip.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Final

from rmqkit.broker.codec import headers_problem, wire_problem
from rmqkit.broker.codec.properties import TypedProperties
from rmqkit.broker.session import CONNECTION_ERRORS, Channel, Outcome, Session, open_session
from rmqkit.errors import BrokerUnavailable, DataError
from rmqkit.settings import Settings

log = logging.getLogger("rmqkit.outbox")

EXCHANGE_CACHE_S: Final = 5.0
PERSISTENT: Final = 2
# A connection closed by the broker (management API, close_all_connections) can still look open
# for a moment: aiormq then raises RuntimeError("... closed") for a new channel.
LOST: Final[tuple[type[BaseException], ...]] = (RuntimeError, *CONNECTION_ERRORS)


@dataclass(frozen=True)
class Row:
    """One claimed outbox row."""

    id: int
    message_id: str
    exchange: str
    routing_key: str
    body: bytes
    headers: str | None
    content_type: str | None
    aggregate: str | None
    attempts: int
    delay_ms: int | None = None  # add(delay=...): None = the work queue's default, if any
    age_ms: float = 0.0  # how long the row had waited in the table when it was claimed
    routing_problem: str | None = None  # set by the relay's Edge: why it cannot be routed
    # Set by the relay's Edge for a row that goes through the delay ladder: exchange and
    # routing_key are then its target (after its lane), and the ladder's entry and headers are
    # planned only as it is sent (``rmqkit.outbox.rows.plan_at_publish``), with the delay left
    # at that moment.
    ladder_target: tuple[str, str] | None = None
    last_error: str | None = None  # the error of its previous attempt (None: first, or reset)
    claimed_at: float = field(default_factory=time.monotonic)  # when age_ms was read

    @classmethod
    def of(cls, values: Sequence[Any]) -> Row:
        """A row from the claim query's columns (``queries.ROW_COLUMNS`` and the age)."""
        i, mid, exchange, key, body, headers, ctype, aggregate, attempts, delay, error, age = values
        delay_ms = None if delay is None else int(delay)
        return cls(
            int(i),
            mid,
            exchange,
            key,
            bytes(body),
            headers,
            ctype,
            aggregate,
            attempts,
            delay_ms,
            float(age or 0.0),
            last_error=error,
        )

    def waited_ms(self) -> float:
        """How long the row has waited since it was written, now (its age at the claim plus
        the time since)."""
        return self.age_ms + (time.monotonic() - self.claimed_at) * 1000.0

    @property
    def problem(self) -> str | None:
        """Why the AMQP wire cannot carry this row (it was not written by ``add``), or why it
        cannot be routed (a delay beyond the ladder's maximum ...); or None."""
        if self.routing_problem is not None:
            return self.routing_problem
        return wire_problem(self.exchange, self.routing_key, self.message_id, self.content_type)


class Broker:
    """The relay's AMQP session (see the module docstring)."""

    def __init__(self, settings: Settings, *, window: int, name: str) -> None:
        self._settings = settings
        self._window = window
        self._name = name
        self._session: Session | None = None
        self._channel: Channel | None = None
        self._exchanges: dict[str, tuple[bool, float]] = {}
        self._broken = False  # a LOST error seen: the session may not know it is closed yet
        self._blocks: contextlib.AsyncExitStack | None = None

    async def open(self) -> None:
        """Connect (BrokerUnavailable 69 / AccessRefused 77 if it cannot) and open the channel.

        A broker that blocks publishing (memory or disk alarm) is logged at once with its
        reason, every 10 s while it lasts, and when it ends: a relay that waits on confirms
        would otherwise look hung (issue 14).
        """
        self._session = await open_session(self._settings, name=self._name)
        self._channel = await self._session.channel(confirms=True, window=self._window)
        self._broken = False
        self._blocks = contextlib.AsyncExitStack()
        await self._blocks.enter_async_context(
            self._session.reporting_blocks(
                lambda line: log.warning("outbox relay: %s", line), every_s=10.0
            )
        )

    @property
    def session(self) -> Session:
        """The open session (the relay declares the delay ladder on it)."""
        if self._session is None:
            raise BrokerUnavailable("the broker connection was lost")
        return self._session

    @property
    def lost(self) -> bool:
        """Whether the connection is gone (the relay reconnects, or ``--once`` exits 69)."""
        return self._broken or self._session is None or self._session.is_closed

    async def close(self) -> None:
        """Close channel and connection; never raises."""
        session, self._session, self._channel = self._session, None, None
        blocks, self._blocks = self._blocks, None
        if blocks is not None:
            with contextlib.suppress(Exception):  # a watch on a dead connection: nothing to stop
                await blocks.aclose()
        if session is not None:
            with contextlib.suppress(Exception):  # already gone: nothing left to release
                await session.close()

    async def exchange_exists(self, exchange: str) -> bool:
        """Whether ``exchange`` exists now (cached for a few seconds)."""
        if not exchange:
            return True
        known = self._exchanges.get(exchange)
        if known is not None and time.monotonic() - known[1] < EXCHANGE_CACHE_S:
            return known[0]
        assert self._session is not None
        try:
            await self._session.require_exchange(exchange)
            exists = True
        except DataError:
            exists = False
        except LOST as exc:
            self._broken = True
            raise BrokerUnavailable(f"the broker connection was lost: {exc}") from exc
        self._exchanges[exchange] = (exists, time.monotonic())
        return exists

    async def publish_in_order(
        self,
        rows: Sequence[Row],
        *,
        pipelined: bool = False,
        prepare: Callable[[Row], Row] | None = None,
        results: list[Outcome | str | None] | None = None,
    ) -> list[Outcome | str | None]:
        """Publish ``rows`` in waves (module docstring): each one's Outcome, the error that
        failed it, or None for a row not sent because an earlier row of its aggregate failed
        in this batch (or the connection was lost before its wave). ``pipelined``: one wave
        for the whole batch (``--order pipelined``: faster for a hot aggregate, but rows of
        the batch behind a failed row of their aggregate go out ahead of its retry).

        ``prepare``: applied to each row just before it is sent (the relay plans a delayed
        row's ladder headers there, with the delay it has left then). ``results``: filled in
        place as confirms arrive, so a caller that cancels the call (a stop whose grace ran
        out) still knows which rows were confirmed; the rows not settled stay None."""
        if results is None:
            results = [None] * len(rows)
        waves: list[list[int]] = []
        depth: dict[str, int] = {}
        for i, row in enumerate(rows):
            n = 0
            if row.aggregate is not None and not pipelined:
                n = depth.get(row.aggregate, 0)
                depth[row.aggregate] = n + 1
            if n == len(waves):
                waves.append([])
            waves[n].append(i)
        failed: set[str | None] = set()
        for wave in waves:
            if self.lost:
                break
            go: list[int] = []
            ready: list[Row] = []
            try:
                for i in [i for i in wave if rows[i].aggregate not in failed]:
                    row = prepare(rows[i]) if prepare is not None else rows[i]
                    problem = row.problem
                    if problem is None and not await self.exchange_exists(row.exchange):
                        problem = f"exchange {row.exchange!r} does not exist"
                    if problem is None:
                        go.append(i)
                        ready.append(row)
                    else:
                        results[i] = problem
                settled = await self._send(ready) if go else []
            except BrokerUnavailable:
                # Lost before this wave went out: the earlier waves' confirmed rows are still
                # marked (the relay reconnects after the marks); this wave's rows stay untouched.
                for i in wave:
                    results[i] = None
                break
            futures = [f for f in settled if not isinstance(f, str)]
            try:
                if futures:
                    await asyncio.wait(futures)
            finally:
                # Cancelled (the relay's grace ran out): what was confirmed so far is kept.
                for i, item in zip(go, settled, strict=True):
                    if isinstance(item, str) or item.done():
                        results[i] = _outcome(item)
            outcomes = [results[i] for i in go]
            if any(isinstance(o, str) for o in outcomes):
                # The channel failed (a 404 closes it: an exchange deleted since it was checked):
                # check every exchange again rather than close the next channel the same way.
                self._exchanges.clear()
            failed.update(
                rows[i].aggregate
                for i in wave
                if results[i] is not None and results[i] is not Outcome.CONFIRMED
            )
            failed.discard(None)
        return results

    async def publish(self, rows: Sequence[Row]) -> list[Outcome | str]:
        """Publish ``rows`` in order, pipelined; each one's Outcome, or the error that failed it.

        Everything is sent before anything is awaited, so a batch costs one round trip.
        """
        settled = await self._send(rows)
        futures = [f for f in settled if not isinstance(f, str)]
        if futures:
            await asyncio.wait(futures)
        return [_outcome(f) for f in settled]

    async def _send(self, rows: Sequence[Row]) -> list[asyncio.Future[Outcome] | str]:
        """Send ``rows``, awaiting nothing but the channel: each one's confirm future, or the
        error that kept it from being sent."""
        if self._channel is None or self._channel.is_closed:
            if self.lost:
                raise BrokerUnavailable("the broker connection was lost")
            assert self._session is not None
            try:
                self._channel = await self._session.channel(confirms=True, window=self._window)
            except LOST as exc:
                self._broken = True
                raise BrokerUnavailable(f"the broker connection was lost: {exc}") from exc
        publisher = self._channel.publisher
        settled: list[asyncio.Future[Outcome] | str] = []
        for row in rows:
            try:
                headers = json.loads(row.headers) if row.headers else None
                problem = headers_problem(headers)
                properties = TypedProperties(
                    delivery_mode=PERSISTENT,
                    message_id=row.message_id,
                    content_type=row.content_type,
                    headers=headers,
                    # when the row was written: the message's age (the consumer's
                    # rmqkit_consumer_message_age_seconds) counts its time in the table
                    timestamp=datetime.fromtimestamp(time.time() - row.waited_ms() / 1000, UTC),
                )
            except ValueError as exc:
                settled.append(f"headers are not valid JSON: {exc}")
                continue
            if problem is not None:
                settled.append(f"cannot be encoded as AMQP: {problem}")
                continue
            try:
                settled.append(
                    await publisher.publish(
                        row.body,
                        exchange=row.exchange,
                        routing_key=row.routing_key,
                        properties=properties,
                    )
                )
            except CONNECTION_ERRORS as exc:
                settled.append(f"channel closed before the publish: {exc}")
            except (TypeError, ValueError, OverflowError) as exc:
                # The codec refused a value: raised before the publish had a confirm number,
                # so the channel is intact and only this row fails (never the relay).
                settled.append(f"cannot be encoded as AMQP: {exc}")
        return settled


def _outcome(settled: asyncio.Future[Outcome] | str) -> Outcome | str:
    if isinstance(settled, str):
        return settled
    if settled.cancelled():
        return "publish cancelled"
    error = settled.exception()
    if error is not None:
        return f"publish failed ({type(error).__name__}: {error})"
    return settled.result()

"""The relay's side of the broker: one session, one confirmed channel, exchange checks.

Publishing goes through rmqkit's ``ConfirmedPublisher`` (``mandatory``, confirms, a pipelined
window; returns matched exactly) on a channel of ``rmqkit.broker.session``. A row to an
exchange that does not exist is never published: the broker would close the channel (404) and
fail every other publish in flight on it. Exchanges are checked with a passive declare on the
session's probe channel and the answer kept for a few seconds.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Final

from rmqkit.broker.codec.properties import TypedProperties
from rmqkit.broker.session import CONNECTION_ERRORS, Channel, Outcome, Session, open_session
from rmqkit.errors import BrokerUnavailable, DataError
from rmqkit.settings import Settings

EXCHANGE_CACHE_S: Final = 5.0
PERSISTENT: Final = 2


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

    @classmethod
    def of(cls, values: Sequence[Any]) -> Row:
        """A row from the claim query's columns (``queries.ROW_COLUMNS``)."""
        i, mid, exchange, key, body, headers, ctype, aggregate, attempts = values
        return cls(int(i), mid, exchange, key, bytes(body), headers, ctype, aggregate, attempts)


class Broker:
    """The relay's AMQP session (see the module docstring)."""

    def __init__(self, settings: Settings, *, window: int, name: str) -> None:
        self._settings = settings
        self._window = window
        self._name = name
        self._session: Session | None = None
        self._channel: Channel | None = None
        self._exchanges: dict[str, tuple[bool, float]] = {}

    async def open(self) -> None:
        """Connect (BrokerUnavailable 69 / AccessRefused 77 if it cannot) and open the channel."""
        self._session = await open_session(self._settings, name=self._name)
        self._channel = await self._session.channel(confirms=True, window=self._window)

    @property
    def lost(self) -> bool:
        """Whether the connection is gone (the relay reconnects, or ``--once`` exits 69)."""
        return self._session is None or self._session.is_closed

    async def close(self) -> None:
        """Close channel and connection; never raises."""
        session, self._session, self._channel = self._session, None, None
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
        self._exchanges[exchange] = (exists, time.monotonic())
        return exists

    async def publish(self, rows: Sequence[Row]) -> list[Outcome | str]:
        """Publish ``rows`` in order, pipelined; each one's Outcome, or the error that failed it.

        Everything is sent before anything is awaited, so a batch costs one round trip.
        """
        if self._channel is None or self._channel.is_closed:
            if self.lost:
                raise BrokerUnavailable("the broker connection was lost")
            assert self._session is not None
            self._channel = await self._session.channel(confirms=True, window=self._window)
        publisher = self._channel.publisher
        settled: list[asyncio.Future[Outcome] | str] = []
        for row in rows:
            try:
                properties = TypedProperties(
                    delivery_mode=PERSISTENT,
                    message_id=row.message_id,
                    content_type=row.content_type,
                    headers=json.loads(row.headers) if row.headers else None,
                )
            except ValueError as exc:
                settled.append(f"headers are not valid JSON: {exc}")
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
        futures = [f for f in settled if not isinstance(f, str)]
        if futures:
            await asyncio.wait(futures)
        return [_outcome(f) for f in settled]


def _outcome(settled: asyncio.Future[Outcome] | str) -> Outcome | str:
    if isinstance(settled, str):
        return settled
    if settled.cancelled():
        return "publish cancelled"
    error = settled.exception()
    if error is not None:
        return f"publish failed ({type(error).__name__}: {error})"
    return settled.result()

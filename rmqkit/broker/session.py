"""An AMQP session: one connection from ``Settings``, its channels, probes and publishers.

Everything rmqkit does over AMQP goes through a ``Session`` (the management HTTP API has
``rmqkit.broker.management``). It opens the connection with rmqkit's error mapping and URL
failover (``rmqkit.broker.amqp.connect``), optionally decoding headers with their exact AMQP
types (``typed=True``, see ``rmqkit.broker.codec``), and reaches the client's raw connection in
one place (``rmqkit.broker.amqp.raw_connection``).

    async with session(settings, name="rmqkit export q", typed=True) as s:
        depth = await s.queue_depth("q")            # QueueDepth(ready, consumers); 65 if missing
        if not await s.queue_exists("other"): ...
        channel = await s.channel(confirms=True)    # Channel; channel.publisher: ConfirmedPublisher
        outcome = await (await channel.publisher.publish(body, exchange="", routing_key="q",
                                                          properties=props))

Probes (``queue_depth``, ``queue_exists``, ``exchange_exists``, ``require_queue``,
``require_exchange``) share one
channel per session, opened on first use and reopened after a probe of a missing object (the
broker closes a channel on a 404). One channel rather than one per probe: opening a channel
right after closing one was seen to get the closed one's Close-Ok (aiormq reuses the number).

How the consumer (``consumer/runner.py``, ``consumer/copies.py``) uses it, with no aiormq import:

* connect: ``s = await open_session(settings, urls=order, name=..., typed=True)`` (typed: a
  header value pamqp cannot decode must not fail the whole connection); ``s.is_closed``,
  ``await s.close()``; ``s.display_url`` (masked) for the log line; reconnect on
  ``except CONNECTION_ERRORS`` (a broker ``basic.cancel`` is the consumer's own exception).
* targets: ``if not await s.queue_exists(name): raise ConfigError(...)`` per queue.
* the channel: ``channel = await s.channel(confirms=True)``; ``await channel.qos(n)``;
  ``tag = await channel.consume(queue, on_delivery)`` where ``on_delivery(delivery: Delivery)``;
  ``await channel.cancel(tag)``; ``channel.add_cancel_listener(fn)`` /
  ``discard_cancel_listener(fn)``, ``fn(consumer_tag)`` on a broker-initiated cancel;
  ``channel.closing`` (future) and ``channel.closed_reason()``; ``await channel.close()``
  (also stops its publisher).
* acks: ``await channel.ack(tag, multiple=True)``, ``channel.nack(tag, multiple=..., requeue=...)``,
  ``channel.reject(tag, requeue=True)``.
* a delivery: ``delivery.delivery.delivery_tag`` / ``.redelivered`` / ``.exchange`` /
  ``.routing_key``, ``delivery.header.properties``, ``delivery.body`` (``Delivery``, a Protocol
  the client's object satisfies: no allocation per message).
* copies: ``channel.publisher.publish(body, exchange="", routing_key=target, properties=
  copy_properties(props, headers))`` (``rmqkit.broker.codec``), settled as an ``Outcome``;
  ``channel.owns(delivery)`` replaces ``publisher.channel is delivered.channel``, and the
  original is rejected with ``channel.reject`` on that same channel.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager, nullcontext
from typing import Any

import aiormq.abc
import aiormq.exceptions
from aio_pika.abc import AbstractConnection

from rmqkit.broker.amqp import amqp_errors_mapped, connect, parse_version, raw_connection
from rmqkit.broker.blocking import BlockWatch, reporting_blocks
from rmqkit.broker.channel import (
    AMQP_ERRORS,
    CONNECTION_ERRORS,
    Channel,
    Delivery,
    OnDelivery,
    QueueDepth,
    closed_by_broker,
)
from rmqkit.broker.codec import typed_decoding
from rmqkit.broker.confirms import ConfirmedPublisher, Outcome, outcome_of
from rmqkit.broker.management import ManagementClient
from rmqkit.errors import DataError, PermissionMissing, RmqkitError
from rmqkit.settings import Settings, mask_url, vhost_of

DEFAULT_WINDOW = 1000  # unconfirmed publishes in flight per publisher


class Session:
    """One open AMQP connection (see the module docstring)."""

    def __init__(
        self,
        connection: AbstractConnection | aiormq.abc.AbstractConnection,
        settings: Settings | None = None,
    ) -> None:
        # An aio-pika connection (what ``connect`` opens) or a bare aiormq one (tests).
        self._owner = connection
        self._raw: aiormq.abc.AbstractConnection = (
            connection
            if isinstance(connection, aiormq.abc.AbstractConnection)
            else raw_connection(connection)
        )
        self._probe: Channel | None = None
        # For the management API fallback of the probes (None: no fallback): one client for
        # the session, and the queues whose probe was refused (asked there directly after:
        # a refusal closes the probe channel, and polling loops would reopen it each time).
        self._settings = settings
        self._api: ManagementClient | None = None
        self._refused: dict[str, PermissionMissing] = {}

    @classmethod
    def of(cls, connection: Session | object) -> Session:
        """``connection`` as a Session (an open aio-pika or aiormq connection is wrapped)."""
        if isinstance(connection, Session):
            return connection
        if isinstance(connection, AbstractConnection | aiormq.abc.AbstractConnection):
            return cls(connection)
        raise TypeError(f"not an AMQP connection: {type(connection).__name__}")

    # --- the connection -------------------------------------------------------------------------
    @property
    def is_closed(self) -> bool:
        """Whether the connection is closed."""
        return bool(self._owner.is_closed)

    @property
    def display_url(self) -> str:
        """The URL connected to, with the password masked."""
        return mask_url(str(self._raw.url))

    @property
    def server_version(self) -> tuple[int, int, int]:
        """The broker version from the connection's server properties."""
        raw = (self._raw.server_properties or {}).get("version", "0.0.0")
        text = raw.decode() if isinstance(raw, bytes) else str(raw)
        return parse_version(text)

    @property
    def cluster_name(self) -> str | None:
        """The cluster name from the connection's server properties (what the management
        API's ``/api/overview`` reports as ``cluster_name`` for the same cluster)."""
        raw = (self._raw.server_properties or {}).get("cluster_name")
        if raw is None:
            return None
        return raw.decode() if isinstance(raw, bytes) else str(raw)

    async def close(self) -> None:
        """Close the connection (and with it every channel)."""
        if self._api is not None:
            await self._api.aclose()
            self._api = None
        await self._owner.close()

    def watch_blocks(self, on_change: Callable[[BlockWatch], None] | None = None) -> BlockWatch:
        """Whether the broker blocks this connection (a memory or disk alarm), and why
        (``rmqkit.broker.blocking``); ``close()`` the watch when done."""
        return BlockWatch(self._raw, on_change)

    def reporting_blocks(
        self,
        say: Callable[[str], None],
        *,
        every_s: float = 10.0,
        progress: Callable[[], str] | None = None,
        what: str = "publishing",
    ) -> AbstractAsyncContextManager[BlockWatch]:
        """``async with s.reporting_blocks(log.warning):`` — one line through ``say`` as soon
        as the broker blocks this connection (with its reason: "low on memory", "low on
        disk"), again every ``every_s`` while blocked, and when unblocked
        (``rmqkit.broker.blocking.reporting_blocks``)."""
        return reporting_blocks(self._raw, say, every_s=every_s, progress=progress, what=what)

    # --- channels -------------------------------------------------------------------------------
    async def channel(self, *, confirms: bool = False, window: int = DEFAULT_WINDOW) -> Channel:
        """A new channel; with ``confirms``, in confirm mode with a ``ConfirmedPublisher``
        (``window`` publishes in flight) as ``channel.publisher``."""
        raw = await self._raw.channel(publisher_confirms=confirms)
        publisher = ConfirmedPublisher(raw, window=window) if confirms else None
        return Channel(raw, publisher)

    async def _probe_channel(self) -> Channel:
        if self._probe is None or self._probe.is_closed:
            self._probe = await self.channel()
        return self._probe

    # --- probes ---------------------------------------------------------------------------------
    # RabbitMQ 4.3 checks a passive queue.declare against the user's permissions on the
    # queue (3.x and 4.0 do not): a user without read or configure on it is refused. The
    # management API answers the same question for any user with a management tag, so a
    # refused probe asks it (its counts lag by the stats interval; a probe's do not).
    async def queue_depth(self, queue: str) -> QueueDepth:
        """Ready messages and consumers of ``queue``; DataError (65) if it does not exist."""
        if queue in self._refused:
            found = await self._from_management(queue, self._refused[queue])
            if found is None:
                raise DataError(f"queue {queue!r} does not exist")
            return found
        try:
            return await (await self._probe_channel()).queue_depth(queue)
        except PermissionMissing as refused:
            self._refused[queue] = refused
            found = await self._from_management(queue, refused)
            if found is None:
                raise DataError(f"queue {queue!r} does not exist") from None
            return found

    async def queue_exists(self, queue: str) -> bool:
        """Whether ``queue`` exists."""
        if queue in self._refused:
            return await self._from_management(queue, self._refused[queue]) is not None
        try:
            return await (await self._probe_channel()).queue_exists(queue)
        except PermissionMissing as refused:
            self._refused[queue] = refused
            return await self._from_management(queue, refused) is not None

    async def _from_management(self, queue: str, refused: PermissionMissing) -> QueueDepth | None:
        """``queue``'s depth from the management API (None: no such queue); re-raises the
        probe's refusal when there is no API to ask or it refuses too."""
        if self._settings is None:
            raise refused
        if self._api is None:
            scoped = self._settings.for_vhost(vhost_of(str(self._raw.url)))
            self._api = ManagementClient.from_settings(scoped)
        try:
            row = await self._api.queue(queue)
        except PermissionMissing:
            raise PermissionMissing(
                f"{str(refused).split(' — ')[0]} — grant read on that queue, or a management tag "
                "(management, policymaker, monitoring or administrator) so rmqkit can ask the "
                "management API instead (docs/permissions.md lists what each command needs)"
            ) from None
        except RmqkitError:
            raise refused from None
        if row is None:
            return None
        return QueueDepth(int(row.get("messages_ready") or 0), int(row.get("consumers") or 0))

    async def require_queue(self, queue: str, error: type[RmqkitError], advice: str) -> None:
        """Raise ``error("queue 'q' does not exist — <advice>")`` unless ``queue`` exists."""
        if not await self.queue_exists(queue):
            raise error(f"queue {queue!r} does not exist — {advice}")

    async def require_exchange(self, exchange: str) -> None:
        """DataError (65) unless ``exchange`` exists (the default exchange always does)."""
        await (await self._probe_channel()).require_exchange(exchange)

    # --- declarations (rmqkit declare) ----------------------------------------------------------
    async def declare(
        self,
        exchanges: list[dict[str, Any]],
        queues: list[dict[str, Any]],
        bindings: list[dict[str, Any]],
    ) -> None:
        """Declare ``exchanges`` (kwargs of ``exchange.declare``), then ``queues``
        (``queue.declare``), then ``bindings`` (``queue.bind``, or ``exchange.bind`` when the
        dict has ``destination``), on one channel of their own. A refusal is mapped to an
        rmqkit error naming the object (406 → TopologyConflict, 65)."""
        channel = await self._raw.channel()
        try:
            for exchange in exchanges:
                with amqp_errors_mapped(f"declaring exchange {exchange['exchange']!r}"):
                    await channel.exchange_declare(**exchange)
            for queue in queues:
                with amqp_errors_mapped(f"declaring queue {queue['queue']!r}"):
                    await channel.queue_declare(**queue)
            for wanted in bindings:
                binding = dict(wanted)
                label = binding.pop("label")
                with amqp_errors_mapped(f"binding {label}"):
                    if "destination" in binding:
                        await channel.exchange_bind(**binding)
                    else:
                        await channel.queue_bind(**binding)
        finally:
            if not channel.is_closed:
                await channel.close()

    async def exchange_exists(self, exchange: str) -> bool:
        """Whether ``exchange`` exists (the default exchange always does)."""
        try:
            await self.require_exchange(exchange)
        except DataError as exc:
            if isinstance(exc.__cause__, aiormq.exceptions.ChannelNotFoundEntity):
                return False
            raise
        return True


async def open_session(
    settings: Settings,
    *,
    name: str = "rmqkit",
    urls: list[str] | None = None,
    typed: bool = False,
) -> Session:
    """Connect to the first URL that answers (``urls``, else the configured ones).

    ``typed``: deliveries carry ``TypedProperties`` with the exact AMQP types of their header
    values (an export must keep them; pamqp's own decoder fails the connection on some values
    RabbitMQ accepts). Raises AccessRefused (77) or BrokerUnavailable (69) as ``connect`` does.
    """
    with typed_decoding() if typed else nullcontext():
        conn = await connect(settings, name=name, urls=urls)
    return Session(conn, settings)


@asynccontextmanager
async def session(
    settings: Settings,
    *,
    name: str = "rmqkit",
    urls: list[str] | None = None,
    typed: bool = False,
) -> AsyncIterator[Session]:
    """``async with session(settings) as s:`` — ``open_session``, always closed."""
    opened = await open_session(settings, name=name, urls=urls, typed=typed)
    try:
        yield opened
    finally:
        await opened.close()


def access_refused(exc: BaseException) -> str | None:
    """The broker's ACCESS_REFUSED text when ``exc`` (or what it wraps) is a channel or
    connection closed for a missing permission, else None. Not worth a reconnect: the same
    permission is missing on the next connection, and each retry spends a delivery."""
    seen: BaseException | None = exc
    for _ in range(5):
        if seen is None:
            return None
        if isinstance(seen, aiormq.exceptions.ChannelAccessRefused) or "ACCESS_REFUSED" in str(
            seen
        ):
            text = str(seen)
            start = text.find("ACCESS_REFUSED")
            # The broker's words only: an rmqkit error already carries its own advice.
            return text[start:].split(" — ")[0].rstrip(" ,)") if start >= 0 else text
        seen = seen.__cause__ or seen.__context__
    return None


__all__ = [
    "AMQP_ERRORS",
    "CONNECTION_ERRORS",
    "DEFAULT_WINDOW",
    "BlockWatch",
    "Channel",
    "ConfirmedPublisher",
    "Delivery",
    "OnDelivery",
    "Outcome",
    "QueueDepth",
    "Session",
    "access_refused",
    "closed_by_broker",
    "open_session",
    "outcome_of",
    "session",
]

"""One AMQP channel as rmqkit uses it, and the delivery type read from it.

``Channel`` wraps one aiormq channel: QoS, consume (with the broker's ``basic.cancel``
notification), ack / nack / reject, queue and exchange probes, and, on a channel opened with
publisher confirms, its ``ConfirmedPublisher``. Channels come from
``rmqkit.broker.session.Session.channel``; nothing outside ``rmqkit.broker`` sees aiormq.

``Delivery`` is what a consumer callback receives. It is a ``Protocol`` shaped like the AMQP
frames of a delivery (the ``basic.deliver`` method, the content header, the body), not a class
of ours: the client's own delivered-message object satisfies it as it is, so the hot path makes
no wrapper per message (a consumer handles tens of thousands a second, and the benchmark holds
it to twice the raw aio-pika loop). Read a delivery as::

    tag = delivery.delivery.delivery_tag        # int
    delivery.delivery.redelivered / .exchange / .routing_key
    props = delivery.header.properties          # rmqkit.broker.codec.Properties
    body = delivery.body                        # bytes
    channel.owns(delivery)                      # arrived on this channel (tags are per channel)

The acks (``ack``/``nack``/``reject``) return the client's own awaitable: no extra coroutine per
call either.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Final, Protocol, cast

import aiormq
import aiormq.abc
import aiormq.exceptions
from pamqp import commands as spec

from rmqkit.broker.amqp import amqp_errors_mapped
from rmqkit.broker.confirms import ConfirmedPublisher
from rmqkit.errors import RmqkitError

CONNECTION_ERRORS: Final[tuple[type[BaseException], ...]] = (
    TimeoutError,
    aiormq.exceptions.AMQPError,
    aiormq.exceptions.ChannelInvalidStateError,
    ConnectionError,
    OSError,
)
"""What a lost connection or channel raises (catch these to reconnect)."""

AMQP_ERRORS: Final[tuple[type[BaseException], ...]] = (
    aiormq.exceptions.AMQPError,
    aiormq.exceptions.ChannelInvalidStateError,
)
"""What the AMQP client itself raises: the broker's errors (they are ``OSError`` subclasses too,
so check these before anything that maps ``OSError`` to another peer)."""

CONNECTION_FORCED: Final = 320  # AMQP reply code: the broker (or an operator) closed us


def closed_by_broker(exc: BaseException) -> bool:
    """Whether the broker answered, then closed the connection with ``CONNECTION_FORCED``
    (``close_all_connections``, a node shutting down): it is there, whatever else is wrong."""
    seen: BaseException | None = exc
    while seen is not None:  # a caller may have wrapped it
        if isinstance(seen, aiormq.exceptions.ConnectionClosed):
            return seen.errno == CONNECTION_FORCED
        seen = seen.__cause__ or seen.__context__
    return False


class DeliverFrame(Protocol):
    """The ``basic.deliver`` method of a delivery."""

    @property
    def delivery_tag(self) -> int: ...
    @property
    def redelivered(self) -> bool: ...
    @property
    def exchange(self) -> str: ...
    @property
    def routing_key(self) -> str: ...
    @property
    def consumer_tag(self) -> str: ...


class ContentHeader(Protocol):
    """The content header of a delivery: its properties (``TypedProperties`` on a typed
    session, see ``rmqkit.broker.session.open_session``)."""

    @property
    def properties(self) -> spec.Basic.Properties: ...


class Delivery(Protocol):
    """One message delivered to a consumer (see the module docstring for why a Protocol)."""

    @property
    def delivery(self) -> DeliverFrame: ...
    @property
    def header(self) -> ContentHeader: ...
    @property
    def body(self) -> bytes: ...
    @property
    def channel(self) -> object: ...  # opaque: compare with ``Channel.owns``


OnDelivery = Callable[[Delivery], Awaitable[None]]
"""A consumer callback: called once per delivery, each call in its own task."""


@dataclass(frozen=True, slots=True)
class QueueDepth:
    """A queue's counts as ``queue.declare(passive)`` reports them."""

    ready: int  # messages ready for delivery
    consumers: int  # consumers on the queue (including ours)


class Channel:
    """One open AMQP channel (see the module docstring)."""

    __slots__ = ("_cancel_hooks", "_publisher", "_raw")

    def __init__(self, raw: aiormq.abc.AbstractChannel, publisher: ConfirmedPublisher | None):
        self._raw = raw
        self._publisher = publisher
        self._cancel_hooks: dict[Callable[[str], None], Callable[[Any], None]] = {}

    # --- state ----------------------------------------------------------------------------------
    @property
    def is_closed(self) -> bool:
        """Whether the channel is closed (by us, the broker, or a lost connection)."""
        return bool(self._raw.is_closed)

    @property
    def closing(self) -> asyncio.Future[Any]:
        """Resolves (or fails with the reason) when the channel closes."""
        return self._raw.closing

    def closed_reason(self) -> str:
        """Why the channel closed, for a log line ("closed by the broker" if unknown)."""
        closing = self._raw.closing
        if closing.done() and not closing.cancelled() and closing.exception() is not None:
            return str(closing.exception())
        return "closed by the broker"

    def owns(self, delivery: Delivery) -> bool:
        """Whether ``delivery`` arrived on this channel (its tag can be settled here)."""
        return delivery.channel is self._raw

    @property
    def publisher(self) -> ConfirmedPublisher:
        """The confirmed publisher of a channel opened with ``confirms=True``."""
        if self._publisher is None:
            raise RuntimeError("this channel was opened without publisher confirms")
        return self._publisher

    async def close(self) -> None:
        """Stop the publisher (if any) and close the channel; safe to call twice."""
        if self._publisher is not None:
            await self._publisher.close()
        if not self._raw.is_closed:
            await self._raw.close()

    # --- consuming ------------------------------------------------------------------------------
    async def qos(self, prefetch_count: int) -> None:
        """``basic.qos``: applies to consumers started on this channel after it."""
        await self._raw.basic_qos(prefetch_count=prefetch_count)

    async def consume(
        self, queue: str, on_delivery: OnDelivery, *, arguments: dict[str, Any] | None = None
    ) -> str:
        """Start a consumer with manual acks (``arguments``: basic.consume's, e.g.
        ``x-consumer-timeout``); returns its consumer tag."""
        # aiormq's delivered message satisfies Delivery structurally (no wrapper per message).
        callback = cast("Callable[[aiormq.abc.DeliveredMessage], Any]", on_delivery)
        consume_ok = await self._raw.basic_consume(
            queue, callback, no_ack=False, arguments=arguments or None
        )
        return str(consume_ok.consumer_tag)

    async def cancel(self, consumer_tag: str) -> None:
        """``basic.cancel`` our consumer and wait for cancel-ok."""
        await self._raw.basic_cancel(consumer_tag)

    def add_cancel_listener(self, listener: Callable[[str], None]) -> None:
        """Call ``listener(consumer_tag)`` when the *broker* cancels a consumer on this channel
        (queue deleted; 4.x consumer timeout). Our own ``cancel`` does not call it."""

        def hook(frame: Any) -> None:
            listener(str(frame.consumer_tag))

        self._cancel_hooks[listener] = hook
        self._raw.on_consumer_cancel_callbacks.add(hook)

    def discard_cancel_listener(self, listener: Callable[[str], None]) -> None:
        """Stop calling ``listener`` (no error if it was not added)."""
        hook = self._cancel_hooks.pop(listener, None)
        if hook is not None:
            self._raw.on_consumer_cancel_callbacks.discard(hook)

    def ack(self, delivery_tag: int, *, multiple: bool = False) -> Awaitable[None]:
        """``basic.ack`` (``multiple``: every unsettled tag up to this one)."""
        return self._raw.basic_ack(delivery_tag, multiple=multiple)

    def nack(
        self, delivery_tag: int, *, multiple: bool = False, requeue: bool = True
    ) -> Awaitable[None]:
        """``basic.nack`` (RabbitMQ's extension: ``multiple`` settles every tag up to this one)."""
        return self._raw.basic_nack(delivery_tag, multiple=multiple, requeue=requeue)

    def reject(self, delivery_tag: int, *, requeue: bool = True) -> Awaitable[None]:
        """``basic.reject`` one delivery (counts toward a quorum queue's delivery limit)."""
        return self._raw.basic_reject(delivery_tag, requeue=requeue)

    # --- probes (passive declares) --------------------------------------------------------------
    # A passive declare of a missing object makes the broker close the channel (404): after a
    # False from queue_exists, or a probe that raised, this channel is closed. Session's probes
    # use a channel of their own for that reason.
    async def queue_depth(self, queue: str) -> QueueDepth:
        """Ready messages and consumers of ``queue``; DataError (65) if it does not exist."""
        with amqp_errors_mapped(f"checking queue {queue!r}"):
            declared = await self._raw.queue_declare(queue, passive=True)
        return QueueDepth(int(declared.message_count or 0), int(declared.consumer_count or 0))

    async def queue_exists(self, queue: str) -> bool:
        """Whether ``queue`` exists (a False closes this channel, see above)."""
        try:
            await self.queue_depth(queue)
        except RmqkitError as exc:
            if isinstance(exc.__cause__, aiormq.exceptions.ChannelNotFoundEntity):
                return False
            raise
        return True

    async def require_exchange(self, exchange: str) -> None:
        """DataError (65) unless ``exchange`` exists (the default exchange always does)."""
        if exchange:
            with amqp_errors_mapped(f"checking exchange {exchange!r}"):
                await self._raw.exchange_declare(exchange, passive=True)


__all__ = [
    "AMQP_ERRORS",
    "CONNECTION_ERRORS",
    "CONNECTION_FORCED",
    "Channel",
    "ContentHeader",
    "DeliverFrame",
    "Delivery",
    "OnDelivery",
    "QueueDepth",
    "closed_by_broker",
]

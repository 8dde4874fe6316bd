"""``rmqkit.Publisher``: confirmed, ``mandatory``, persistent publishing for applications.

    async with rmqkit.Publisher.connect(settings, topology="topologies/orders.toml") as pub:
        result = await pub.publish("orders", "order.created", order, message_id=order.id)
        results = await pub.publish_many("orders", "order.created", [a, b, c])

Every message is sent on one channel in confirm mode through ``ConfirmedPublisher`` (returns
matched exactly, ``window`` publishes in flight, the frames of a batch in one write). With a
topology, each message goes to its lane, gets its delay through the delay ladder and has its
sensitive fields encrypted (``rmqkit.publishing.routing``: the same edge as ``rmqkit publish`` and
the outbox relay); a pydantic model body is its JSON by alias with its ``rmqkit.Sensitive``
fields encrypted. A lost connection is reopened (the configured URLs in order, backoff with
jitter) and the unsettled messages are sent again under the same message_ids: a message is
reported confirmed only when the broker confirmed it, duplicates are possible, loss is not.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Iterable, Sequence
from contextlib import AsyncExitStack
from pathlib import Path
from types import TracebackType
from typing import Any

from rmqkit.broker.confirms import Outcome
from rmqkit.broker.session import DEFAULT_WINDOW, Channel, Session, open_session
from rmqkit.crypto import KeyRing, load_keyring
from rmqkit.errors import DataError, PublisherClosed, RmqkitError
from rmqkit.publishing.prepare import Delay, Prepared, PublishMessage, prepare
from rmqkit.publishing.results import PublishResult, failure
from rmqkit.publishing.routing import Edge, Encryptor
from rmqkit.publishing.settling import SETTLED, all_settled, backoff, size_limit_of
from rmqkit.settings import Settings, load_settings
from rmqkit.topology import Topology
from rmqkit.tracing import Tracing, tracing

log = logging.getLogger("rmqkit.publisher")


class Publisher:
    """Confirmed publishing from application code (module docstring; docs/api.md).

    ``topology``: a ``Topology`` or the path of its file (lanes, default delays, encrypted
    fields); ``keyring``: for sensitive fields (default: RMQKIT_KEYRING_FILE / RMQKIT_KEYRING
    of ``settings``); ``window``: unconfirmed messages in flight; ``retry_busy``: send a
    refused (nacked) message again up to ``busy_retries`` times with backoff;
    ``reconnect_attempts``: reconnects per call before the rest is reported unconfirmed;
    ``timeout_s``: give up on messages when the broker has confirmed nothing for that long
    (a blocked connection, a queue without a leader; None: wait).
    """

    def __init__(
        self,
        settings: Settings | None = None,
        *,
        topology: Topology | str | Path | None = None,
        keyring: KeyRing | None = None,
        window: int = DEFAULT_WINDOW,
        retry_busy: bool = False,
        busy_retries: int = 8,
        reconnect_attempts: int = 5,
        timeout_s: float | None = None,
        name: str = "rmqkit publisher",
    ) -> None:
        self.settings = settings if settings is not None else load_settings()
        self.edge = Edge(topology)
        self.tracing = tracing(self.settings.tracing)  # None: off
        if keyring is None:
            file, inline = self.settings.keyring_sources()
            keyring = load_keyring(file, inline)
        self.encryptor = Encryptor(keyring=keyring, topology=self.edge.topology)
        self.window = window
        self.retry_busy = retry_busy
        self.busy_retries = busy_retries
        self.reconnect_attempts = reconnect_attempts
        self.timeout_s = timeout_s
        self.name = name
        # The broker's max_message_size once it refused a message over it (it closes the
        # channel): larger messages are then refused here, without costing a channel each.
        self.max_message_bytes: int | None = None
        self._session: Session | None = None
        self._channel: Channel | None = None
        self._blocks: AsyncExitStack | None = None
        self._checked: set[str] = set()  # exchanges known to exist
        self._lock = asyncio.Lock()  # one (re)connect at a time
        self._checking = asyncio.Lock()
        self._opened = False
        self._closed = False

    @classmethod
    def connect(cls, settings: Settings | None = None, **options: Any) -> Publisher:
        """A Publisher to use as ``async with Publisher.connect(settings, ...) as pub:``
        (opened on entry, closed on exit); the options of the constructor."""
        return cls(settings, **options)

    @classmethod
    def connect_sync(cls, settings: Settings | None = None, **options: Any) -> Any:
        """An open ``rmqkit.SyncPublisher`` (its own event loop in a thread) for WSGI code."""
        from rmqkit.publishing.sync import SyncPublisher

        return SyncPublisher(settings, **options)

    async def __aenter__(self) -> Publisher:
        await self.open()
        return self

    async def __aexit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()

    @property
    def closed(self) -> bool:
        """Whether ``close()`` was called."""
        return self._closed

    async def open(self) -> None:
        """Connect (the first configured URL that answers): AccessRefused (77),
        BrokerUnavailable (69)."""
        if self._closed:
            raise PublisherClosed("this Publisher is closed — make a new one")
        self._opened = True
        await self._link()

    async def close(self) -> None:
        """Close the connection. Messages not yet confirmed were reported so by their call."""
        self._closed = True
        await self._drop()

    # --- publishing --------------------------------------------------------------------------
    async def publish(
        self,
        exchange: str,
        routing_key: str,
        body: Any,
        *,
        message_id: str | None = None,
        delay: Delay = None,
        headers: dict[str, Any] | None = None,
        content_type: str | None = None,
        correlation_id: str | None = None,
        expiration: str | None = None,
        priority: int | None = None,
        message_type: str | None = None,
    ) -> PublishResult:
        """Publish one message and wait for its confirm. ``body``: bytes, str, a pydantic
        model (JSON by alias) or a JSON value. ``message_id``: its stable id (default: a new
        uuid4 hex, kept across resends). ``delay``: a timedelta, seconds or "90s" (None: the
        work queue's default; 0: none). Raises ``Unroutable`` (65), ``PublisherBusy`` (69) or
        ``PublishInterrupted`` (69), each with ``.results``."""
        message = PublishMessage(
            body,
            message_id,
            headers,
            None,
            delay,
            content_type,
            correlation_id,
            expiration,
            priority,
            message_type,
        )
        results = await self.publish_many(exchange, routing_key, [message])
        return results[0]

    async def publish_many(
        self,
        exchange: str,
        routing_key: str,
        messages: Iterable[PublishMessage | Any],
        *,
        delay: Delay = None,
        headers: dict[str, Any] | None = None,
    ) -> list[PublishResult]:
        """Publish ``messages`` (``rmqkit.publishing.PublishMessage`` objects, or bodies) pipelined,
        ``window`` in flight; one ``PublishResult`` per message, in order, once every one is
        settled. ``delay`` / ``headers``: for the bodies given bare. Every message is prepared
        (serialised, encrypted, routed, headers checked) before the first is sent: a DataError
        (65) there publishes nothing. If some are not confirmed: the ``PublishFailed``
        subclass of the first reason, with all the results."""
        self._usable()
        items = [
            m if isinstance(m, PublishMessage) else PublishMessage(m, headers=headers, delay=delay)
            for m in messages
        ]
        ready = [
            prepare(self.edge, self.encryptor, exchange, routing_key, m, n)
            for n, m in enumerate(items, start=1)
        ]
        if not ready:
            return []
        if self.tracing is not None:
            for each in ready:
                _trace(self.tracing, each)
        session = await self._link()
        await self._declare_edge(session, ready)
        results, why = await self._deliver(ready)
        error = failure(results, why)
        if error is not None:
            raise error
        return results

    # --- the engine --------------------------------------------------------------------------
    async def _deliver(self, ready: Sequence[Prepared]) -> tuple[list[PublishResult], str | None]:
        """Send until every message is settled or given up; resend after a lost channel. Also
        why some were given up (None: none was). Concurrent calls share the channel; each
        drops only the session or channel it saw fail, never one another call reopened."""
        outcome: list[str | None] = [None] * len(ready)
        attempts = [0] * len(ready)
        todo = list(range(len(ready)))
        reconnects = busy_rounds = 0
        why: str | None = None
        while todo:
            try:
                session = await self._link()
            except PublisherClosed:
                raise
            except RmqkitError as exc:  # no URL answers: the rest is unknown
                why = str(exc)
                break
            channel = self._channel
            assert channel is not None
            publisher = channel.publisher
            sent: dict[int, asyncio.Future[Outcome]] = {}
            lost: BaseException | None = None
            limit = self.max_message_bytes
            if limit is not None:  # learnt from an earlier refusal: do not send what it refuses
                for i in [i for i in todo if len(ready[i].body) > limit]:
                    todo.remove(i)
                    outcome[i] = "too_large"
                why = why or f"the broker's max_message_size is {limit} bytes"
            try:
                for i in todo:
                    p = ready[i]
                    attempts[i] += 1
                    sent[i] = await publisher.publish(
                        p.body,
                        exchange=p.routed.exchange,
                        routing_key=p.routed.routing_key,
                        properties=p.properties,
                    )
            except Exception as exc:  # the channel or connection went away mid-send
                lost = exc
            stalled = not await all_settled(list(sent.values()), self.timeout_s)
            again: list[int] = []
            busy: list[int] = []
            for i in todo:
                future = sent.get(i)
                if future is None or not future.done() or future.cancelled():
                    again.append(i)
                elif future.exception() is not None:
                    lost = lost or future.exception()
                    again.append(i)
                else:
                    settled = future.result()
                    if settled is Outcome.NACKED and self.retry_busy:
                        busy.append(i)
                    outcome[i] = SETTLED[settled]
            limit = size_limit_of(lost)
            if limit is not None:  # refused for good: sending it again closes the channel again
                self.max_message_bytes = limit
                for i in [i for i in again if len(ready[i].body) > limit]:
                    again.remove(i)
                    outcome[i] = "too_large"
                why = why or f"the broker's max_message_size is {limit} bytes"
            if stalled:
                why = f"the broker confirmed nothing for {self.timeout_s:g}s"
                await self._drop(session)  # what it may still confirm must not be counted
                break
            if again:
                if session.is_closed:
                    await self._drop(session)
                else:  # the channel alone failed: a new one on the same connection
                    self._drop_channel(channel)
                reconnects += 1
                if reconnects > self.reconnect_attempts:
                    why = f"gave up after {self.reconnect_attempts} reconnects: {lost!r}"
                    break
                log.warning(
                    "rmqkit publisher: %d message(s) unsettled after %r; sending them again",
                    len(again),
                    lost,
                )
                await asyncio.sleep(backoff(reconnects))
            if busy and busy_rounds < self.busy_retries:
                busy_rounds += 1
                await asyncio.sleep(backoff(busy_rounds))
                for i in busy:
                    outcome[i] = None
                again += busy
            todo = sorted(again)
        return [
            PublishResult(
                p.message_id,
                p.exchange,
                p.routing_key,
                outcome[i] == "confirmed",
                outcome[i] or "unconfirmed",  # type: ignore[arg-type]
                p.routed.lane,
                p.routed.applied_ms,
                attempts[i],
            )
            for i, p in enumerate(ready)
        ], why

    async def _declare_edge(self, session: Session, ready: Sequence[Prepared]) -> None:
        """The exchanges asked for exist (DataError 65 otherwise, nothing sent); the delay
        ladder and the exits of delayed messages are declared. The asked exchange is probed,
        as `rmqkit publish` probes it, not where a message is routed: a delayed message's
        ladder entry exists only once ``Edge.declare`` made it, a lane's is the default."""
        asked = {p.exchange for p in ready}
        if asked - self._checked:
            async with self._checking:  # one probe at a time, not one channel per caller
                for exchange in sorted(asked - self._checked):
                    await session.require_exchange(exchange)
                    self._checked.add(exchange)
        if any(p.routed.target is not None for p in ready):
            async with self._checking:
                failed = await self.edge.declare(session, [p.routed for p in ready])
            if failed:
                (exchange, key), error = next(iter(failed.items()))
                where = f"exchange {exchange!r}" if exchange else f"queue {key!r}"
                raise DataError(f"delayed messages for {where}: {error} (nothing was published)")

    def _usable(self) -> None:
        if self._closed:
            raise PublisherClosed("publish on a closed Publisher — make a new one")
        if not self._opened:
            raise PublisherClosed(
                "the Publisher is not open — use `async with Publisher.connect(...)` or open()"
            )

    async def _link(self) -> Session:
        """The open session with a confirm channel, (re)connecting if needed."""
        async with self._lock:
            if self._closed:
                raise PublisherClosed("the Publisher is closed")
            if self._session is None or self._session.is_closed:
                await self._drop()
                self._session = await self._open_session()
            if self._channel is None or self._channel.is_closed:
                try:
                    self._channel = await self._session.channel(confirms=True, window=self.window)
                except Exception:  # the connection died too, and the client has not seen it
                    await self._drop()
                    self._session = await self._open_session()
                    self._channel = await self._session.channel(confirms=True, window=self.window)
            return self._session

    async def _open_session(self) -> Session:
        session = await open_session(self.settings, name=self.name)
        self._blocks = AsyncExitStack()
        await self._blocks.enter_async_context(
            session.reporting_blocks(log.warning, what="publishing")
        )
        return session

    def _drop_channel(self, failed: Channel) -> None:
        if self._channel is not failed:
            return  # another call has opened a new one already
        channel, self._channel = self._channel, None
        if channel is not None:
            task = asyncio.ensure_future(channel.close())
            task.add_done_callback(lambda t: t.cancelled() or t.exception())

    async def _drop(self, failed: Session | None = None) -> None:
        """Close the session (only if it is still ``failed``, when given) and its channel."""
        if failed is not None and self._session is not failed:
            return  # another call has reconnected already
        session, self._session = self._session, None
        channel, self._channel = self._channel, None
        blocks, self._blocks = self._blocks, None
        if channel is not None:
            with contextlib.suppress(Exception):
                await channel.publisher.close()
        if blocks is not None:
            with contextlib.suppress(Exception):
                await blocks.aclose()
        if session is not None:
            # a blocked connection's close is never answered: do not wait on it for long
            with contextlib.suppress(Exception, TimeoutError):
                await asyncio.wait_for(session.close(), timeout=5)


def _trace(tracing: Tracing, ready: Prepared) -> None:
    """A ``create`` span for one message, a child of the caller's span, in its headers."""
    headers = dict(ready.properties.headers or {})
    with tracing.sending(
        "create",
        exchange=ready.routed.exchange,
        routing_key=ready.routed.routing_key,
        message_id=ready.message_id,
        body_size=len(ready.body),
    ):
        tracing.inject(headers)
    ready.properties.headers = headers

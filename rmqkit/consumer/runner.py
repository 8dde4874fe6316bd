"""One consumer process: connection, QoS, dispatch, acks, retry/park copies, reconnect, shutdown.

Hot path (per delivery): aiormq hands each delivery to ``_on_delivery`` as its own task; the
handler runs; success marks the tag finished and the flusher acks the finished prefix with
``multiple=True`` every few milliseconds. A failure becomes a copy (retry → wait queue, park →
parking queue) published with confirms and ``mandatory``; the original is marked finished only
when the copy is confirmed. A nack or return leaves the original to come back, never acked: it
is held for a backoff per target queue, then put back with basic.reject(requeue=True), which
counts toward the delivery limit on every version (rmqkit.consumer.refusals).

A basic.cancel from the broker (4.3: the queue's consumer timeout; any version: the queue was
deleted) is treated like a lost channel: logged, ``consuming`` false (``/readyz`` fails), and the
connection is reopened with backoff; acks of handlers still running on the old channel are
dropped and those messages come back.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
from datetime import UTC, datetime
from time import monotonic, perf_counter
from typing import Any

import aiormq
from aiormq.abc import AbstractChannel, DeliveredMessage

from rmqkit.broker.amqp import connect
from rmqkit.broker.confirms import ConfirmedPublisher
from rmqkit.broker.fieldtypes import Timestamp
from rmqkit.broker.pamqp_hook import typed_decoding
from rmqkit.consumer.acks import AckTracker
from rmqkit.consumer.attempts import attempt_number
from rmqkit.consumer.config import ConsumerConfig
from rmqkit.consumer.copies import CopySender
from rmqkit.consumer.decision import (
    Ack,
    HandlerTimeout,
    MissingMessageId,
    Success,
    TooLarge,
    decide,
)
from rmqkit.consumer.handler import LoadedHandler, run_handler
from rmqkit.consumer.logs import current_message
from rmqkit.consumer.message import Message
from rmqkit.consumer.metrics import ConsumerMetrics
from rmqkit.consumer.refusals import Backoff, RefusedCopies
from rmqkit.consumer.threads import HandlerThreads
from rmqkit.errors import AccessRefused, ConfigError, RmqkitError
from rmqkit.headers import ATTEMPT
from rmqkit.settings import Settings, mask_url

log = logging.getLogger("rmqkit.consumer")
HOST = socket.gethostname()
_PERSISTENT = 2
CAUTIOUS_SETTLED = 10
# ...and for at least this long: a message that crashes workers comes back within seconds of
# each crash (restart backoff 0.2 s, 0.4 s, …); every worker must still be cautious then, or it
# receives the poison with a full window and spends its neighbours' delivery attempts.
CAUTIOUS_MIN_S = 15.0


class ConsumerCancelled(ConnectionError):
    """The broker cancelled our consumer (basic.cancel): reconnect as after a lost channel."""


__all__ = ["Backoff", "Consumer", "ConsumerCancelled"]


def _as_datetime(value: object) -> datetime | None:
    if isinstance(value, Timestamp):
        return value.to_datetime()
    return value if isinstance(value, datetime) else None


def _closing_reason(channel: AbstractChannel) -> str:
    closing = channel.closing
    if closing.done() and not closing.cancelled() and closing.exception() is not None:
        return str(closing.exception())
    return "closed by the broker"


class Consumer:
    """Consume one work queue until ``stop()``; reconnects by itself across the URLs."""

    def __init__(
        self,
        settings: Settings,
        config: ConsumerConfig,
        handler: LoadedHandler,
        metrics: ConsumerMetrics,
        *,
        cautious: bool = False,
    ) -> None:
        self.settings = settings
        # After a crash: prefetch 1 until CAUTIOUS_SETTLED messages have been settled, so a
        # message that kills the process spends only its own delivery attempts.
        self._cautious = cautious
        self._cautious_until = CAUTIOUS_SETTLED
        self._cautious_since = monotonic()
        self._consumer_tag = ""
        self.config = config
        self.handler = handler
        self.metrics = metrics
        self._stop = asyncio.Event()
        self._stopping = False
        self._in_flight = 0
        self._idle = asyncio.Event()
        self._idle.set()
        self._flush_wanted = asyncio.Event()
        self._tracker = AckTracker()
        self._publisher: ConfirmedPublisher | None = None  # the current channel's
        self._wait_queues = config.policy.all_wait_queues
        self._permanent = frozenset(config.policy.permanent_errors)
        self._copies = CopySender(
            metrics,
            config.tier_names,
            RefusedCopies(metrics, consumer_timeout_s=config.consumer_timeout_s),
            self._finished,
            self._sleep_unless_stopped,
        )
        # Never hold more messages than can start: a prefetched message no handler started is
        # handed back at every stop or restart, and each return spends one of its delivery
        # attempts (issue 9, finding 12). So the prefetch is the concurrency, and every
        # delivery starts its handler at once: no semaphore on the hot path.
        self.prefetch = min(config.prefetch, config.concurrency or config.prefetch)
        self._flush_threshold = max(1, self.prefetch // 4)
        self._pid = os.getpid()
        self.processed = 0  # deliveries settled in this process (for tests and logs)
        # Set when stuck sync handlers hold the handler threads: the worker exits to be
        # restarted (see _check_threads).
        self.recycle = False
        # Plain `def` handlers run here: a thread per message held plus spares for calls stuck
        # past their timeout (rmqkit.consumer.threads); never waited for at exit.
        self.threads: HandlerThreads | None = None
        if not handler.is_async:
            self.threads = HandlerThreads(self.prefetch)
            threads = self.threads
            threads.on_change = lambda: metrics.set_stuck_handlers(threads.stuck)

    # --- lifecycle ---------------------------------------------------------------------------
    def stop(self) -> None:
        """Ask for a graceful stop: no new deliveries; in-flight ones finish within the grace."""
        self._stopping = True
        self._stop.set()

    def _enter_cautious(self) -> None:
        self._cautious = True
        self._cautious_until = self.processed + CAUTIOUS_SETTLED
        self._cautious_since = monotonic()

    def close(self) -> None:
        """Release the handler threads without waiting for ones still running."""
        if self.threads is not None:
            self.threads.close()

    async def run(self) -> None:
        """Consume until stopped. Raises AccessRefused/ConfigError (fatal); retries the rest."""
        backoff = Backoff()
        urls = list(self.settings.amqp_urls)
        start = 0
        first = True
        while not self._stopping:
            order = urls[start:] + urls[:start]
            try:
                # Exact decoding (rmqkit.broker.pamqp_hook): pamqp's own decoder fails the whole
                # connection on header values RabbitMQ accepts (a timestamp past year 9999, a
                # non-UTF-8 key), which would turn one such message into a reconnect loop.
                with typed_decoding():
                    conn = await connect(
                        self.settings, urls=order, name=f"rmqkit consume {self.config.queue}"
                    )
            except (AccessRefused, ConfigError):
                raise
            except RmqkitError as exc:
                delay = backoff.next_delay()
                log.warning("broker unavailable (%s); retrying in %.1fs", exc, delay)
                start = (start + 1) % len(urls)
                await self._sleep_unless_stopped(delay)
                continue
            if not first:
                self.metrics.reconnected()
            first = False
            try:
                await self._consume(conn)
                backoff.reset()
            except (AccessRefused, ConfigError):
                raise
            except (
                TimeoutError,
                aiormq.exceptions.AMQPError,
                aiormq.exceptions.ChannelInvalidStateError,
                ConnectionError,
                OSError,
            ) as exc:
                delay = backoff.next_delay()
                # What broke the connection may be a message (a frame the client cannot read):
                # come back cautious, so it spends only its own delivery attempts.
                if not isinstance(exc, ConsumerCancelled):
                    self._enter_cautious()
                log.warning(
                    "connection lost (%s: %s); reconnecting in %.1fs",
                    type(exc).__name__,
                    exc,
                    delay,
                )
                start = (start + 1) % len(urls)
                await self._sleep_unless_stopped(delay)
            finally:
                self.metrics.set_connected(False)
                self.metrics.set_consuming(False)
                if not conn.is_closed:
                    await asyncio.shield(self._close_quietly(conn))

    async def _sleep_unless_stopped(self, delay: float) -> None:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._stop.wait(), timeout=delay)

    @staticmethod
    async def _close_quietly(conn: Any) -> None:
        # Already broken: nothing to save; the broker requeues what was unacked.
        with contextlib.suppress(Exception):
            await asyncio.wait_for(conn.close(), timeout=5)

    # --- one connection ----------------------------------------------------------------------
    async def _consume(self, conn: Any) -> None:
        raw: aiormq.Connection = conn.transport.connection
        channel = await raw.channel(publisher_confirms=True)
        publisher = self._publisher = ConfirmedPublisher(channel)
        await self._check_targets(raw)
        await channel.basic_qos(prefetch_count=1 if self._cautious else self.prefetch)
        tracker = AckTracker()
        self._tracker = tracker
        flusher = asyncio.create_task(self._flusher(channel, tracker))
        cancelled: asyncio.Future[str] = asyncio.get_running_loop().create_future()

        def on_cancel(frame: Any) -> None:
            # Only a broker-initiated basic.cancel gets here (aiormq has already answered it);
            # ours (drain, leaving cautious mode) end with cancel-ok and are not reported.
            tag = str(frame.consumer_tag)
            if tag == self._consumer_tag and not cancelled.done():
                cancelled.set_result(tag)
                self.metrics.cancelled_by_broker()

        channel.on_consumer_cancel_callbacks.add(on_cancel)
        consume_ok = await channel.basic_consume(self.config.queue, self._on_delivery, no_ack=False)
        self._consumer_tag = str(consume_ok.consumer_tag)
        self.metrics.set_connected(True)
        self.metrics.set_consuming(True)
        log.info(
            "consuming %s on %s (prefetch %s)",
            self.config.queue,
            mask_url(str(raw.url)),
            "1, cautious after a crash" if self._cautious else self.prefetch,
        )
        stop_wait = asyncio.ensure_future(self._stop.wait())
        closing = asyncio.ensure_future(channel.closing)
        try:
            done, _ = await asyncio.wait(
                {stop_wait, closing, cancelled}, return_when=asyncio.FIRST_COMPLETED
            )
            if closing in done or channel.is_closed:
                tracker.alive = False
                raise ConnectionError(f"channel closed: {_closing_reason(channel)}")
            if cancelled in done:
                tracker.alive = False
                log.error(
                    "the broker cancelled consumer %s on %s (the queue's consumer timeout %gs "
                    "passed with a message unacked, or the queue was deleted); no deliveries "
                    "until reconnected; %d handler(s) still running, their messages come back",
                    cancelled.result(),
                    self.config.queue,
                    self.config.consumer_timeout_s,
                    self._in_flight,
                )
                raise ConsumerCancelled(f"consumer {cancelled.result()} cancelled by the broker")
            await self._drain(channel, self._consumer_tag, tracker)
        finally:
            channel.on_consumer_cancel_callbacks.discard(on_cancel)
            stop_wait.cancel()
            closing.cancel()
            tracker.alive = False
            self._flush_wanted.set()
            flusher.cancel()
            await publisher.close()

    async def _check_targets(self, raw: aiormq.Connection) -> None:
        """Fail fast if the wait or parking queues are missing: copies would be returned."""
        for name in (self.config.queue, self.config.policy.parking_queue, *self._wait_queues):
            probe = await raw.channel()
            try:
                await probe.queue_declare(name, passive=True)
            except aiormq.exceptions.ChannelNotFoundEntity:
                raise ConfigError(
                    f"queue {name!r} does not exist — run `rmqkit declare` for the topology "
                    "first (retries and parking need their queues)"
                ) from None
            await probe.close()

    async def _drain(
        self, channel: AbstractChannel, consumer_tag: str, tracker: AckTracker
    ) -> None:
        """Graceful stop: cancel the consumer, let in-flight handlers finish, ack, close."""
        self.metrics.set_consuming(False)
        try:
            await channel.basic_cancel(consumer_tag)
        except Exception:
            return  # channel already gone: the broker requeues everything unacked
        deadline = monotonic() + self.config.grace_s
        while self._in_flight and monotonic() < deadline:
            self._idle.clear()
            try:
                await asyncio.wait_for(self._idle.wait(), timeout=max(0.0, deadline - monotonic()))
            except TimeoutError:
                break
        if self._in_flight:
            log.warning(
                "grace period over with %d handler(s) still running; their messages "
                "will be redelivered",
                self._in_flight,
            )
        await self._flush(channel, tracker)
        await channel.close()

    # --- acks --------------------------------------------------------------------------------
    async def _flusher(self, channel: AbstractChannel, tracker: AckTracker) -> None:
        wanted = self._flush_wanted
        while tracker.alive:
            if self._cautious:  # wake up now and then to see whether caution may end
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(wanted.wait(), timeout=1.0)
            else:
                await wanted.wait()
            wanted.clear()
            if tracker.pending_acks < self._flush_threshold:
                await asyncio.sleep(self.config.ack_flush_s)
            if not tracker.alive:
                return
            await self._flush(channel, tracker)
            if (
                self._cautious
                and self.processed >= self._cautious_until
                and monotonic() - self._cautious_since >= CAUTIOUS_MIN_S
            ):
                self._cautious = False
                await self._widen_prefetch(channel)

    async def _widen_prefetch(self, channel: AbstractChannel) -> None:
        """Leave cautious mode. basic.qos only applies to consumers created after it, so a new
        consumer takes over at the full prefetch and the prefetch-1 one is cancelled."""
        await channel.basic_qos(prefetch_count=self.prefetch)
        old_tag = self._consumer_tag
        consume_ok = await channel.basic_consume(self.config.queue, self._on_delivery, no_ack=False)
        self._consumer_tag = str(consume_ok.consumer_tag)
        await channel.basic_cancel(old_tag)
        log.info("left cautious mode: prefetch %d", self.prefetch)

    async def _flush(self, channel: AbstractChannel, tracker: AckTracker) -> None:
        before = tracker.outstanding
        tag = tracker.take_ack()
        if tag is None or not tracker.alive:
            return
        count = before - tracker.outstanding  # now: deliveries during the await would add
        try:
            await channel.basic_ack(tag, multiple=True)
        except Exception:
            tracker.alive = False  # tags die with the channel; those messages come back
            return
        self.metrics.acked(count)

    # --- one delivery ------------------------------------------------------------------------
    async def _on_delivery(self, delivered: DeliveredMessage) -> None:
        tracker = self._tracker
        tag: int = delivered.delivery.delivery_tag  # type: ignore[union-attr,assignment]
        tracker.received(tag)
        self._in_flight += 1
        self.metrics.received()
        self.metrics.in_flight_inc()
        try:
            await self._handle(delivered, tracker, tag)
        finally:
            self._in_flight -= 1
            self.metrics.in_flight_dec()
            if not self._in_flight:
                self._idle.set()

    async def _handle(self, delivered: DeliveredMessage, tracker: AckTracker, tag: int) -> None:
        props = delivered.header.properties
        headers: dict[str, Any] = props.headers or {}
        body = delivered.body
        config = self.config
        outcome: Any
        attempt = 1
        if config.max_message_bytes is not None and len(body) > config.max_message_bytes:
            outcome = TooLarge(len(body), config.max_message_bytes)
        elif config.require_message_id and not props.message_id:
            outcome = MissingMessageId()
        else:
            deliver = delivered.delivery
            # Without x-death and our attempt header this is a first delivery: skip the parse.
            if headers and ("x-death" in headers or ATTEMPT in headers):
                attempt = attempt_number(headers, config.queue, wait_queues=self._wait_queues)
            current_message.set((props.message_id, attempt))
            message = Message(
                body,
                headers=headers,
                message_id=props.message_id,
                routing_key=deliver.routing_key or "",  # type: ignore[union-attr]
                exchange=deliver.exchange or "",  # type: ignore[union-attr]
                redelivered=bool(deliver.redelivered),  # type: ignore[union-attr]
                attempt=attempt,
                content_type=props.content_type,
                correlation_id=props.correlation_id,
                timestamp=_as_datetime(props.timestamp),
                delivery_tag=tag,
            )
            started = perf_counter()
            outcome = await run_handler(
                self.handler,
                message,
                timeout_s=config.handler_timeout_s,
                permanent_types=self._permanent,
                executor=self.threads,
            )
            self.metrics.observe_handler(perf_counter() - started)
        if type(outcome) is Success:
            self._finished(tracker, tag)
            return
        if type(outcome) is HandlerTimeout and self.threads is not None:
            self._check_threads(self.threads)
        deliver = delivered.delivery
        decision = decide(
            outcome,
            headers,
            config.policy,
            exchange=deliver.exchange or "",  # type: ignore[union-attr]
            routing_key=deliver.routing_key or "",  # type: ignore[union-attr]
            now=datetime.now(UTC),
            host=HOST,
            pid=self._pid,
        )
        if isinstance(decision, Ack):
            self._finished(tracker, tag)
            return
        await self._copies.send(self._publisher, delivered, decision, tracker, tag, attempt)

    def _check_threads(self, threads: HandlerThreads) -> None:
        """After a sync handler's timeout: if stuck calls now hold the handler threads, say so
        and recycle this worker (a thread cannot be stopped; a new process gets them back).

        The stuck messages' retry copies go out as usual before the stop; the graceful drain
        then lets the handlers still running finish within the grace, and the supervisor
        restarts the worker. A message that hangs its handler every time thus spends its own
        attempts (and, if it is running at a restart, its own delivery-limit count) only.
        """
        if not threads.exhausted or self.recycle:
            return
        self.recycle = True
        self.metrics.threads_exhausted()
        log.error(
            "handler threads exhausted: %d call(s) still running past the handler timeout "
            "(%gs) hold the spare threads; recycling this worker process",
            threads.stuck,
            self.config.handler_timeout_s or 0,
        )
        self.stop()

    def _finished(self, tracker: AckTracker, tag: int) -> None:
        tracker.finished(tag)
        self.processed += 1
        if tracker.pending_acks >= self._flush_threshold or not self._flush_wanted.is_set():
            self._flush_wanted.set()

"""One consumer's connection: connect, QoS, consume, batched acks, reconnect, graceful stop.

``QueueConsumer`` owns the connection side: it opens the connection (failing over across the
URLs with backoff), checks the work, wait and parking queues exist, sets the prefetch (1 while
cautious: crash, reconnect), registers the consumer, acks the finished prefix of tags with
``multiple=True`` every few milliseconds (the flusher), and on stop cancels the consumer, lets
in-flight handlers finish within the grace and acks what finished. What happens to each delivery
(handler, outcome, retry/park copy) is rmqkit.consumer.dispatch's ``Dispatcher``, which
QueueConsumer holds (``self.dispatcher``): the client hands each delivery to its ``_on_delivery``
as its own task. The public ``rmqkit.Consumer`` (rmqkit.consumer.embedded) runs one
QueueConsumer per queue it serves.

A basic.cancel from the broker (4.3: the queue's consumer timeout; any version: the queue was
deleted) is treated like a lost channel: logged, ``consuming`` false (``/readyz`` fails), and the
connection is reopened with backoff; acks of handlers still running on the old channel are
dropped and those messages come back.

A queue this consumer needs (its own, its wait queues, its parking queue) that is missing when it
connects is fatal (ConfigError, 78) only at the first start of the consumer: the operator sees at
once that the topology is not declared. Once it has consumed (and in a worker the supervisor
restarted), a missing queue was deleted under it: this consumer *waits* — logs what is missing,
``/readyz`` names it, re-checks with backoff (passively: the topology owns the queue, so it is
never declared here) — and consumes again when the queue is back, while the worker's other
consumers (lanes, partitions) go on. A queue declared again with other arguments than when the
consumer started (read through the management API) is not consumed either, and said so.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from time import monotonic
from typing import Any

from rmqkit.broker.session import (
    CONNECTION_ERRORS,
    Channel,
    Session,
    access_refused,
    open_session,
)
from rmqkit.consumer.acks import AckTracker
from rmqkit.consumer.config import (
    PER_CONSUMER_TIMEOUT_SINCE,
    ConsumerConfig,
    consumer_timeout_ms,
)
from rmqkit.consumer.dedupe import DedupeStep
from rmqkit.consumer.dispatch import Dispatcher
from rmqkit.consumer.handler import LoadedHandler
from rmqkit.consumer.hooks import HookRunner
from rmqkit.consumer.metrics import ConsumerMetrics
from rmqkit.consumer.refusals import Backoff
from rmqkit.consumer.threads import HandlerThreads
from rmqkit.consumer.watch import QueueWatch
from rmqkit.crypto import KeyRing
from rmqkit.errors import AccessRefused, ConfigError, RmqkitError
from rmqkit.settings import Settings
from rmqkit.tracing import tracing

log = logging.getLogger("rmqkit.consumer")
_PERSISTENT = 2
CAUTIOUS_SETTLED = 10
BLOCKED_EVERY_S = 30.0  # how often a blocked consumer repeats that it is (the first line: at once)
# ...and for at least this long: a message that crashes workers comes back within seconds of
# each crash (restart backoff 0.2 s, 0.4 s, …); every worker must still be cautious then, or it
# receives the poison with a full window and spends its neighbours' delivery attempts.
CAUTIOUS_MIN_S = 15.0
# A queue deleted under the consumer: re-checked after 0.5-1 s, then doubling up to this (passive
# declares on the consumer's own connection: cheap, but not in a tight loop for hours).
RECHECK_CAP_S = 10.0
STILL_WAITING_EVERY_S = 60.0  # how often the log repeats that a queue is still missing


def consume_arguments(
    version: tuple[int, int, int], config: ConsumerConfig
) -> dict[str, Any] | None:
    """basic.consume's arguments: on 4.3, a consumer timeout of the consumer's own, derived
    from the handler timeout, so a shorter queue- or broker-wide one cannot cancel a handler
    rmqkit still lets run (4.3 does not count a timeout toward the delivery limit: the
    message came back over and over, its handler run each time)."""
    timeout = consumer_timeout_ms(config.handler_timeout_s)
    if version < PER_CONSUMER_TIMEOUT_SINCE or timeout is None:
        return None
    return {"x-consumer-timeout": timeout}


class ConsumerCancelled(ConnectionError):
    """The broker cancelled our consumer (basic.cancel): reconnect as after a lost channel."""


__all__ = ["Backoff", "ConsumerCancelled", "QueueConsumer"]


class QueueConsumer:
    """Consume one work queue until ``stop()``; reconnects by itself across the URLs. (The
    public ``rmqkit.Consumer``, rmqkit.consumer.embedded, runs one per queue it serves.)"""

    def __init__(
        self,
        settings: Settings,
        config: ConsumerConfig,
        handler: LoadedHandler,
        metrics: ConsumerMetrics,
        *,
        cautious: bool = False,
        keyring: KeyRing | None = None,
        missing_is_fatal: bool = True,
        hooks: HookRunner | None = None,
    ) -> None:
        # one delivery's path (checks, handler, outcome, copies, acks) is the dispatcher's; this
        # class owns the connection around it
        self.dispatcher = Dispatcher(
            config, handler, metrics, keyring, hooks, tracing=tracing(settings.tracing)
        )
        self.metrics = metrics
        self.settings = settings
        self.watch = QueueWatch(settings, config.queue, missing_is_fatal=missing_is_fatal)
        # After a crash: prefetch 1 until CAUTIOUS_SETTLED messages have been settled, so a
        # message that kills the process spends only its own delivery attempts.
        self._cautious = cautious
        # Why, as the consume log line says it: only what is known (a broker restart is no crash)
        self._cautious_why = "after a worker crash, restarted by the supervisor"
        self._cautious_until = CAUTIOUS_SETTLED
        self._cautious_since = monotonic()
        self._consumer_tag = ""
        self._consume_args: dict[str, Any] | None = None

    # --- lifecycle ---------------------------------------------------------------------------
    @property
    def config(self) -> ConsumerConfig:
        """The served queue's configuration (one object, shared with the dispatcher)."""
        return self.dispatcher.config

    @config.setter
    def config(self, config: ConsumerConfig) -> None:
        self.dispatcher.config = config

    def stop(self) -> None:
        """Stop consuming: finish what is in flight, ack it, close (see ``Dispatcher.stop``)."""
        self.dispatcher.stop()

    @property
    def processed(self) -> int:
        """Deliveries settled in this process."""
        return self.dispatcher.processed

    @property
    def recycle(self) -> bool:
        """Whether the dispatcher asked for a fresh process (handlers stuck past their timeout)."""
        return self.dispatcher.recycle

    @property
    def threads(self) -> HandlerThreads | None:
        """The handler threads (plain ``def`` handlers), None for an async handler."""
        return self.dispatcher.threads

    @property
    def dedupe(self) -> DedupeStep | None:
        """The ``--dedupe`` step, None without it."""
        return self.dispatcher.dedupe

    def _enter_cautious(self) -> None:
        self._cautious = True
        self._cautious_why = "after a lost connection: messages unacked on it come back redelivered"
        self._cautious_until = self.dispatcher.processed + CAUTIOUS_SETTLED
        self._cautious_since = monotonic()

    def close(self) -> None:
        """Release the handler threads without waiting for ones still running."""
        if self.dispatcher.threads is not None:
            self.dispatcher.threads.close()

    async def run(self) -> None:
        """Consume until stopped. Raises AccessRefused/ConfigError (fatal); retries the rest."""
        backoff = Backoff()
        urls = list(self.settings.amqp_urls)
        start = 0
        first = True
        while not self.dispatcher._stopping:
            order = urls[start:] + urls[:start]
            try:
                # Typed (exact) decoding: pamqp's own decoder fails the whole connection on
                # header values RabbitMQ accepts (a timestamp past year 9999, a non-UTF-8 key),
                # which would turn one such message into a reconnect loop.
                conn = await open_session(
                    self.settings,
                    urls=order,
                    name=f"rmqkit consume {self.config.queue}",
                    typed=True,
                )
            except (AccessRefused, ConfigError):
                raise
            except RmqkitError as exc:
                delay = backoff.next_delay()
                log.warning("broker unavailable (%s); retrying in %.1fs", exc, delay)
                start = (start + 1) % len(urls)
                await self.dispatcher._sleep_unless_stopped(delay)
                continue
            if not first:
                self.metrics.reconnected()
            first = False
            try:
                await self._consume(conn)
                backoff.reset()
            except (AccessRefused, ConfigError):
                raise
            except CONNECTION_ERRORS as exc:
                refused = access_refused(exc)
                if refused is not None:
                    # Stop rather than loop: every reconnect would redeliver the message in
                    # flight, spending its delivery attempts until the limit parks it.
                    raise AccessRefused(
                        f"broker refused the consumer of {self.config.queue!r}: {refused} — "
                        "grant the user the permissions docs/permissions.md lists for "
                        "`rmqkit consume` (write on the exchanges retries and parking go "
                        "through: '' for wait queues); the message in flight was returned "
                        "to the queue"
                    ) from None
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
                await self.dispatcher._sleep_unless_stopped(delay)
            finally:
                self.metrics.set_connected(False, self.config.queue)
                self.metrics.set_consuming(False, self.config.queue)
                if not conn.is_closed:
                    await asyncio.shield(self._close_quietly(conn))

    @staticmethod
    async def _close_quietly(conn: Session) -> None:
        # Already broken: nothing to save; the broker requeues what was unacked.
        with contextlib.suppress(Exception):
            await asyncio.wait_for(conn.close(), timeout=5)

    # --- one connection ----------------------------------------------------------------------
    async def _consume(self, conn: Session) -> None:
        if not await self._wait_until_consumable(conn):
            return  # stopped while waiting for a queue
        channel = self.dispatcher._channel = await conn.channel(confirms=True)
        await channel.qos(1 if self._cautious else self.dispatcher.prefetch)
        tracker = AckTracker()
        self.dispatcher._tracker = tracker
        flusher = asyncio.create_task(self._flusher(channel, tracker))
        cancelled: asyncio.Future[str] = asyncio.get_running_loop().create_future()

        def on_cancel(tag: str) -> None:
            # Only a broker-initiated basic.cancel gets here (the client has already answered
            # it); ours (drain, leaving cautious mode) end with cancel-ok and are not reported.
            if tag == self._consumer_tag and not cancelled.done():
                cancelled.set_result(tag)
                self.metrics.cancelled_by_broker(self.config.queue)

        channel.add_cancel_listener(on_cancel)
        self._consume_args = consume_arguments(conn.server_version, self.config)
        self._consumer_tag = await channel.consume(
            self.config.queue, self.dispatcher._on_delivery, arguments=self._consume_args
        )
        self.watch.consumed()
        self.metrics.set_connected(True, self.config.queue)
        self.metrics.set_consuming(True, self.config.queue)
        log.info(
            "consuming %s on %s (prefetch %s; hooks: %s)",
            self.config.queue,
            conn.display_url,
            f"1, cautious {self._cautious_why}" if self._cautious else self.dispatcher.prefetch,
            "none" if self.dispatcher.hooks is None else self.dispatcher.hooks.hooks.describe(),
        )
        stop_wait = asyncio.ensure_future(self.dispatcher._stop.wait())
        closing = asyncio.ensure_future(channel.closing)
        # A memory or disk alarm blocks this connection at its first retry or park publish,
        # and then its acks wait too: say so at once and while it lasts, or a stalled consumer
        # looks idle to whoever is on call (nothing is lost: the broker reads it all later).
        blocks = conn.reporting_blocks(
            log.warning,
            every_s=BLOCKED_EVERY_S,
            what="this consumer (its acks, retries and parks wait)",
            progress=lambda: f"{self.dispatcher._in_flight} message(s) in hand",
        )
        try:
            async with blocks:
                done, _ = await asyncio.wait(
                    {stop_wait, closing, cancelled}, return_when=asyncio.FIRST_COMPLETED
                )
                if closing in done or channel.is_closed:
                    tracker.alive = False
                    raise ConnectionError(f"channel closed: {channel.closed_reason()}")
                if cancelled in done:
                    tracker.alive = False
                    log.error(
                        "the broker cancelled consumer %s on %s (the queue's consumer timeout %gs "
                        "passed with a message unacked, or the queue was deleted); no deliveries "
                        "until reconnected; %d handler(s) still running, their messages come back",
                        cancelled.result(),
                        self.config.queue,
                        self.config.consumer_timeout_s,
                        self.dispatcher._in_flight,
                    )
                    self.watch.suspect = True
                    raise ConsumerCancelled(
                        f"consumer {cancelled.result()} cancelled by the broker"
                    )
                await self._drain(channel, self._consumer_tag, tracker)
        finally:
            channel.discard_cancel_listener(on_cancel)
            stop_wait.cancel()
            closing.cancel()
            tracker.alive = False
            self.dispatcher._flush_wanted.set()
            flusher.cancel()
            await channel.publisher.close()

    async def _wait_until_consumable(self, conn: Session) -> bool:
        """Whether to consume now (False: stopped while waiting). Raises ConfigError if a queue
        is missing at the first start; later waits, re-checking with backoff, until every queue
        this consumer needs exists (and its own is declared as it was)."""
        queue = self.config.queue
        self.metrics.set_connected(True, queue)
        problem = await self._problem(conn)
        if problem is None:
            self.metrics.set_waiting(queue, None)
            return True
        if self.watch.missing_is_fatal and self.watch.missing:
            raise ConfigError(
                f"queue {self.watch.missing[0]!r} does not exist — run `rmqkit declare` for the "
                "topology first (retries and parking need their queues)"
            )
        backoff = Backoff(base_s=1.0, cap_s=RECHECK_CAP_S)
        logged_at = 0.0
        logged = ""
        while True:
            self.metrics.set_consuming(False, queue)
            self.metrics.set_waiting(queue, problem)
            if problem != logged or monotonic() - logged_at >= STILL_WAITING_EVERY_S:
                # ERROR: messages published to a missing queue are unroutable (lost unless the
                # publisher uses mandatory); someone must declare it again.
                log.error(
                    "%s; re-checking every %gs at most (other queues this consumer serves are "
                    "consumed on)",
                    problem,
                    RECHECK_CAP_S,
                )
                logged, logged_at = problem, monotonic()
            await self.dispatcher._sleep_unless_stopped(backoff.next_delay())
            if self.dispatcher._stopping:
                return False
            problem = await self._problem(conn)
            if problem is None:
                self.metrics.set_waiting(queue, None)
                log.info("the queues of %s are back: consuming it again", queue)
                return True

    async def _problem(self, conn: Session) -> str | None:
        """Why this consumer cannot consume now (QueueWatch.problem), or None."""
        policy = self.config.policy
        return await self.watch.problem(conn, [policy.parking_queue, *self.dispatcher._wait_queues])

    async def _drain(self, channel: Channel, consumer_tag: str, tracker: AckTracker) -> None:
        """Graceful stop: cancel the consumer, let in-flight handlers finish, ack, close."""
        self.metrics.set_consuming(False, self.config.queue)
        try:
            await channel.cancel(consumer_tag)
        except Exception:
            return  # channel already gone: the broker requeues everything unacked
        deadline = monotonic() + self.config.grace_s
        while self.dispatcher._in_flight and monotonic() < deadline:
            self.dispatcher._idle.clear()
            try:
                await asyncio.wait_for(
                    self.dispatcher._idle.wait(), timeout=max(0.0, deadline - monotonic())
                )
            except TimeoutError:
                break
        if self.dispatcher._in_flight:
            log.warning(
                "grace period over with %d handler(s) still running; their messages "
                "will be redelivered",
                self.dispatcher._in_flight,
            )
        await self.dispatcher._flush(channel, tracker, everything=True)
        await channel.close()

    # --- acks --------------------------------------------------------------------------------
    async def _flusher(self, channel: Channel, tracker: AckTracker) -> None:
        wanted = self.dispatcher._flush_wanted
        while tracker.alive:
            if self._cautious:  # wake up now and then to see whether caution may end
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(wanted.wait(), timeout=1.0)
            else:
                await wanted.wait()
            wanted.clear()
            if tracker.pending_acks < self.dispatcher._flush_threshold:
                await asyncio.sleep(self.config.ack_flush_s)
            if not tracker.alive:
                return
            await self.dispatcher._flush(channel, tracker)
            if (
                self._cautious
                and self.dispatcher.processed >= self._cautious_until
                and monotonic() - self._cautious_since >= CAUTIOUS_MIN_S
            ):
                self._cautious = False
                await self._widen_prefetch(channel)

    async def _widen_prefetch(self, channel: Channel) -> None:
        """Leave cautious mode. basic.qos only applies to consumers created after it, so a new
        consumer takes over at the full prefetch and the prefetch-1 one is cancelled."""
        await channel.qos(self.dispatcher.prefetch)
        old_tag = self._consumer_tag
        self._consumer_tag = await channel.consume(
            self.config.queue, self.dispatcher._on_delivery, arguments=self._consume_args
        )
        await channel.cancel(old_tag)
        log.info("left cautious mode: prefetch %d", self.dispatcher.prefetch)

    # _flush (what is finished goes out as acks) is the Dispatcher's.

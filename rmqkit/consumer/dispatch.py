"""What happens to one delivery: the consumer's per-message hot path.

``Dispatcher`` owns the state the deliveries share (the ack tracker of the current channel, the
in-flight count, the handler threads, the copy sender) and the path of one delivery: checks
(size, message id), the attempt number, the handler run, then the outcome: success marks the tag
finished for the batched ack; a failure is decided (rmqkit.consumer.decision) and becomes a
retry or park copy (rmqkit.consumer.copies), the original finished only once its copy is
confirmed. Nothing here opens, watches or closes a connection: rmqkit.consumer.runner's
``QueueConsumer`` does, and acks the finished tags.

Kept lean: this path creates no task, lock, semaphore or timer per delivery (aiormq already runs
each delivery as its own task), and awaits only the handler and, on failure, the copy.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
from datetime import UTC, datetime
from time import perf_counter, time
from typing import Any

from rmqkit.broker.session import Channel, Delivery
from rmqkit.consumer.acks import AckTracker, flush_acks
from rmqkit.consumer.attempts import attempt_number, delivery_count
from rmqkit.consumer.config import ConsumerConfig
from rmqkit.consumer.conflation import Conflation, key_of
from rmqkit.consumer.copies import CopySender
from rmqkit.consumer.decision import (
    Ack,
    DecryptFailed,
    Failed,
    HandlerOutcome,
    HandlerTimeout,
    MissingMessageId,
    Park,
    RetryLater,
    Success,
    TooLarge,
    Undecodable,
    decide,
)
from rmqkit.consumer.dedupe import DedupeStep
from rmqkit.consumer.delivery import (
    masked,
    message_of,
    traceback_of,
    warn_overdue,
    warn_redelivered,
)
from rmqkit.consumer.handler import LoadedHandler, run_handler
from rmqkit.consumer.hooks import HookRunner, copy_event, internal_error_event, success_event
from rmqkit.consumer.logs import current_message
from rmqkit.consumer.message import Message
from rmqkit.consumer.metrics import ConsumerMetrics
from rmqkit.consumer.refusals import RefusedCopies
from rmqkit.consumer.threads import HandlerThreads
from rmqkit.crypto import KeyRing, decrypt_fields
from rmqkit.crypto import Undecryptable as UndecryptableField
from rmqkit.headers import ATTEMPT
from rmqkit.tracing import Tracing, current_span

log = logging.getLogger("rmqkit.consumer")
DELIVERY_COUNT = "x-delivery-count"
HOST = socket.gethostname()
# How far past the handler timeout a delivery may stay undecided before the watchdog names it
# (a timed-out handler's retry copy is confirmed within milliseconds).
WATCHDOG_MARGIN_S = 1.0
# An AMQP timestamp above this (the year 5138 in seconds) is taken for milliseconds.
MILLISECONDS_FROM = 1e11


class Dispatcher:
    """Runs the handler on each delivery of one consumer and settles it by the outcome."""

    def __init__(
        self,
        config: ConsumerConfig,
        handler: LoadedHandler,
        metrics: ConsumerMetrics,
        keyring: KeyRing | None = None,
        hooks: HookRunner | None = None,
        *,
        tracing: Tracing | None = None,
    ) -> None:
        self.config = config
        # OpenTelemetry (rmqkit.tracing): a span per handling (None: off, and the path below
        # does no tracing work at all).
        self.tracing = tracing
        # on_success/on_retry/on_park (rmqkit.consumer.hooks): told once an outcome is settled,
        # never awaited here (None: no hook, and nothing below builds an event).
        self.hooks = hooks
        # Opens the encrypted fields of bodies before the handler sees them (None: no key ring;
        # a body that holds an envelope is then parked undecryptable, never handed over).
        self.keyring = keyring
        self.handler = handler
        self.metrics = metrics
        self._stop = asyncio.Event()
        self._stopping = False
        self._in_flight = 0
        self._idle = asyncio.Event()
        self._idle.set()
        self._flush_wanted = asyncio.Event()
        self._tracker = AckTracker()
        self._channel: Channel | None = None  # the current connection's (acks, copies)
        self._wait_queues = config.policy.all_wait_queues
        self._permanent = frozenset(config.policy.permanent_errors)
        self._copies = CopySender(
            metrics,
            config.tier_names,
            RefusedCopies(metrics, consumer_timeout_s=config.consumer_timeout_s),
            self._copy_confirmed,
            self._sleep_unless_stopped,
        )
        # Never hold more messages than can start: a prefetched message no handler started is
        # handed back at every stop or restart, and each return spends one of its delivery
        # attempts (issue 9, finding 12). So the prefetch is the concurrency, and every
        # delivery starts its handler at once: no semaphore on the hot path.
        self.prefetch = min(config.prefetch, config.concurrency or config.prefetch)
        self._flush_threshold = max(1, self.prefetch // 4)
        # Finished tags past a slow one are acked alone once this many deliveries are unacked
        # (the broker would soon stop sending): a slow message then holds one slot only.
        self._alone_window = max(1, self.prefetch - self._flush_threshold)
        # The watchdog: a delivery in hand this long with nothing decided for it is named.
        timeout_s = config.handler_timeout_s or config.consumer_timeout_s / 2
        self._watch_after_s = timeout_s + WATCHDOG_MARGIN_S
        self._watch_every_s = max(1.0, min(self._watch_after_s / 4, 30.0))
        self._watch: asyncio.TimerHandle | None = None
        self._reflush: asyncio.TimerHandle | None = None  # a flush due for lingering tags
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
        # --dedupe: handlers run in store transactions that record the message id (None: off,
        # and the path below does no database work at all).
        self.dedupe: DedupeStep | None = None
        if config.dedupe is not None:
            self.dedupe = DedupeStep(config, handler, metrics, self.threads, self._permanent)
        # --conflate-key-header: only the newest message per key is handled (None: off).
        self._conflate_header = config.conflate_key_header
        self.conflation = Conflation() if config.conflate_key_header else None

    def stop(self) -> None:
        """Ask for a graceful stop: no new deliveries; in-flight ones finish within the grace."""
        self._stopping = True
        self._stop.set()

    async def _sleep_unless_stopped(self, delay: float) -> None:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._stop.wait(), timeout=delay)

    # --- one delivery ------------------------------------------------------------------------
    async def _on_delivery(self, delivered: Delivery) -> None:
        tracker = self._tracker
        tag: int = delivered.delivery.delivery_tag
        tracker.received(tag, delivered.header.properties.message_id)
        if self._watch is None:
            self._watch = self._arm_watchdog()
        self._in_flight += 1
        self.metrics.received()
        self.metrics.in_flight_inc()
        started = perf_counter()
        outcome = "failed"
        try:
            if self.tracing is None:
                outcome = await self._handle(delivered, tracker, tag)
            else:
                outcome = await self._handle_traced(self.tracing, delivered, tracker, tag)
        except Exception as exc:
            # Whatever failed on the way (headers, attempts, decryption, the copy), the
            # delivery must still end acked, retried or parked: an unsettled tag on an open
            # channel is never redelivered and, at the head of the window, stops every ack.
            await self._settle_failure(delivered, tracker, tag, exc)
        finally:
            self.metrics.processed(outcome, perf_counter() - started)
            self._in_flight -= 1
            self.metrics.in_flight_dec()
            if not self._in_flight:
                self._idle.set()

    async def _handle_traced(
        self, tracing: Tracing, delivered: Delivery, tracker: AckTracker, tag: int
    ) -> str:
        """``_handle`` inside the delivery's span (the handler's own spans are its children)."""
        props = delivered.header.properties
        deliver = delivered.delivery
        with tracing.processing(
            props.headers,
            queue=self.config.queue,
            exchange=deliver.exchange or "",
            routing_key=deliver.routing_key or "",
            message_id=props.message_id,
            body_size=len(delivered.body),
            delivery_tag=tag,
        ):
            return await self._handle(delivered, tracker, tag)

    async def _handle(self, delivered: Delivery, tracker: AckTracker, tag: int) -> str:
        """Handle one delivery; how it ended (the ``rmqkit_outcome`` of its metrics)."""
        props = delivered.header.properties
        if props.timestamp is not None:
            self._observe_age(props.timestamp)
        headers: dict[str, Any] = props.headers or {}
        body = delivered.body
        config = self.config
        outcome: HandlerOutcome
        attempt = 1
        deliveries = 1  # the broker's count for this delivery (x-delivery-count + 1)
        if config.max_message_bytes is not None and len(body) > config.max_message_bytes:
            outcome = TooLarge(len(body), config.max_message_bytes)
        elif config.require_message_id and not props.message_id:
            outcome = MissingMessageId()
        else:
            deliver = delivered.delivery
            # Without x-death and our attempt header this is a first delivery: skip the parse
            # (with the broker's delayed retry, its count of returns is the attempts' too).
            broker_retry = config.policy.broker_retry
            if headers and (
                "x-death" in headers
                or ATTEMPT in headers
                or (broker_retry and DELIVERY_COUNT in headers)
            ):
                attempt = attempt_number(
                    headers,
                    config.queue,
                    wait_queues=self._wait_queues,
                    broker_retry=broker_retry,
                )
            current_message.set((props.message_id, attempt))
            if deliver.redelivered or headers.get(DELIVERY_COUNT):
                deliveries = delivery_count(headers, bool(deliver.redelivered))
                # a retry the broker held back is a redelivery by design: no warning
                if deliveries > 1 and not broker_retry:
                    warn_redelivered(props.message_id, attempt, deliveries)
            sealed = body
            try:
                # Every envelope in the body, all or nothing (a body without one is returned
                # as is, without a parse). The copies below publish delivered.body: ciphertext.
                body = decrypt_fields(body, None, self.keyring, first=config.encrypted_fields)
            except UndecryptableField as exc:
                outcome = DecryptFailed(str(exc), exc.reason)
            else:
                handled = await self._handle_message(
                    delivered, body, headers, attempt, tracker, tag
                )
                if handled is None:  # superseded: acked unhandled
                    return "superseded"
                outcome = handled
                if body is not sealed and isinstance(outcome, Failed | Undecodable):
                    # The error's text is stored with the parked copy and logged: never the
                    # values decrypted for the handler (a handler quoting one in its error).
                    outcome = masked(outcome, self.keyring)
        return await self._settle(delivered, tracker, tag, outcome, headers, attempt, deliveries)

    def _observe_age(self, timestamp: Any) -> None:
        """The message's age: from its AMQP timestamp (first publish; copies keep it).

        Seconds by the spec; many producers write milliseconds, so a value past the year 5000
        as seconds is read as ms. Whatever else a producer put there is not observed: a
        metric must never cost a message its handling."""
        try:
            sent = timestamp.timestamp() if isinstance(timestamp, datetime) else float(timestamp)
        except (TypeError, ValueError, OverflowError, OSError):
            return
        if sent > MILLISECONDS_FROM:
            sent /= 1000.0
        self.metrics.observe_age(max(0.0, time() - sent))

    async def _handle_message(
        self,
        delivered: Delivery,
        body: bytes,
        headers: dict[str, Any],
        attempt: int,
        tracker: AckTracker,
        tag: int,
    ) -> HandlerOutcome | None:
        """The handler's outcome for a decrypted ``body``; None when conflation superseded it
        (then already settled)."""
        props = delivered.header.properties
        message = message_of(delivered, body, headers, attempt, tag)
        if self.conflation is None:
            return await self._run(message)
        key = key_of(headers.get(self._conflate_header or ""))
        if key is None:
            return await self._run(message)
        if not await self.conflation.admit(key):
            self._superseded(props.message_id, attempt, key)
            self._finished(tracker, tag)
            return None
        try:
            return await self._run(message)
        finally:
            self.conflation.release(key)

    async def _settle(
        self,
        delivered: Delivery,
        tracker: AckTracker,
        tag: int,
        outcome: HandlerOutcome,
        headers: dict[str, Any],
        attempt: int,
        deliveries: int,
    ) -> str:
        """Ack a success; else decide, and publish the retry or park copy (ciphertext as
        received: ``delivered.body``, never the decrypted one). A hook hears of it after.
        Returns how it ended: acked, requeued, retried or parked."""
        deliver = delivered.delivery
        config = self.config
        hooks = self.hooks
        if self.tracing is not None:
            _trace_outcome(outcome, attempt, deliveries)
        if type(outcome) is Success:
            self._finished(tracker, tag)
            if hooks is not None and hooks.wants("success"):
                props = delivered.header.properties
                hooks.emit(success_event(config.queue, props.message_id, attempt, deliver, headers))
            return "acked"
        if type(outcome) is HandlerTimeout and self.threads is not None:
            self._check_threads(self.threads)
        decision = decide(
            outcome,
            headers,
            config.policy,
            exchange=deliver.exchange or "",
            routing_key=deliver.routing_key or "",
            now=datetime.now(UTC),
            host=HOST,
            pid=self._pid,
            delivered=deliveries,
        )
        if isinstance(decision, Ack):
            self._finished(tracker, tag)
            return "acked"
        if isinstance(decision, RetryLater) and decision.requeue:  # retry_engine = "broker"
            put_back = await self._copies.requeue(
                self._channel, delivered, decision, tracker, tag, attempt, deliveries
            )
            if put_back and hooks is not None:
                props = delivered.header.properties
                hooks.emit(copy_event(config, props.message_id, attempt, decision, outcome))
            return "requeued"
        if self.tracing is not None:
            # the next attempt's span (or a replay's) links to this one
            self.tracing.link_to_current(decision.headers)
            _trace_decision(decision)
        if hooks is not None:  # told by the copy's confirm (_copy_confirmed)
            props = delivered.header.properties
            event = copy_event(config, props.message_id, attempt, decision, outcome)
            hooks.expect(tracker, tag, event)
        await self._copies.send(
            self._channel,
            delivered,
            decision,
            tracker,
            tag,
            attempt,
            traceback_of(outcome),
            deliveries,
        )
        if hooks is not None:
            hooks.forget(tracker, tag)
        return "parked" if isinstance(decision, Park) else "retried"

    def _copy_confirmed(self, tracker: AckTracker, tag: int) -> None:
        """A retry or park copy is confirmed: its original may be acked, then its hook told."""
        self._finished(tracker, tag)
        if self.hooks is not None:
            self.hooks.confirmed(tracker, tag)

    async def _run(self, message: Message) -> HandlerOutcome:
        """The handler's outcome for ``message`` (in a store transaction with --dedupe)."""
        if self.dedupe is not None:
            return await self.dedupe.handle(message)
        started = perf_counter()
        outcome = await run_handler(
            self.handler,
            message,
            timeout_s=self.config.handler_timeout_s,
            permanent_types=self._permanent,
            executor=self.threads,
        )
        self.metrics.observe_handler(perf_counter() - started)
        return outcome

    def _superseded(self, message_id: str | None, attempt: int, key: str | bytes) -> None:
        self.metrics.superseded()
        log.info(
            "superseded: a newer message with %s=%s arrived; acked without calling the handler",
            self._conflate_header,
            key,
            extra={"message_id": message_id, "attempt": attempt, "decision": "superseded"},
        )

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

    async def _settle_failure(
        self, delivered: Delivery, tracker: AckTracker, tag: int, exc: Exception
    ) -> None:
        """Park a delivery rmqkit failed on as internal_error (CopySender.settle_failure)."""
        if self.hooks is not None and tracker.is_open(tag):  # its fields may be decrypted
            props, context = delivered.header.properties, current_message.get()
            event = internal_error_event(
                self.config.queue, props.message_id, context, exc, withhold=bool(self.keyring)
            )
            self.hooks.expect(tracker, tag, event)
        await self._copies.settle_failure(
            self._channel,
            delivered,
            tracker,
            tag,
            exc,
            self.config.policy,
            host=HOST,
            pid=self._pid,
        )
        if self.hooks is not None:
            self.hooks.forget(tracker, tag)

    # --- the watchdog: deliveries unsettled for too long --------------------------------------
    def _arm_watchdog(self) -> asyncio.TimerHandle:
        return asyncio.get_running_loop().call_later(self._watch_every_s, self._watchdog)

    def _watchdog(self) -> None:
        """Name each delivery in hand past the handler timeout with nothing decided for it
        (once per delivery): a hole in the settling would otherwise show only as a stall."""
        self._watch = None
        tracker = self._tracker
        warn_overdue(tracker, self._watch_after_s, self.config.queue)
        if tracker.outstanding and not self._stopping:
            self._watch = self._arm_watchdog()

    async def _flush(
        self, channel: Channel, tracker: AckTracker, *, everything: bool = False
    ) -> None:
        """Ack what is finished: the finished prefix in one ``multiple`` ack, the finished tags
        past an unfinished one alone (``everything``: all of them now, e.g. at shutdown)."""
        count = await flush_acks(channel, tracker, everything=everything, window=self._alone_window)
        if count:
            self.metrics.acked(count)
        if tracker.pending_acks and tracker.alive and self._reflush is None:
            # Finished past a slow one: look again one flush interval later (a timer, not the
            # event at once: with nothing to ack yet, the flusher would spin and starve the loop).
            self._reflush = asyncio.get_running_loop().call_later(
                self.config.ack_flush_s, self._flush_again
            )

    def _flush_again(self) -> None:
        self._reflush = None
        self._flush_wanted.set()

    def _finished(self, tracker: AckTracker, tag: int) -> None:
        tracker.finished(tag)
        self.processed += 1
        if tracker.pending_acks >= self._flush_threshold or not self._flush_wanted.is_set():
            self._flush_wanted.set()


def _trace_outcome(outcome: HandlerOutcome, attempt: int, deliveries: int) -> None:
    """The handler's outcome on the current (the delivery's) span."""
    span = current_span()
    span.set_attribute("rmqkit.attempt", attempt)
    span.set_attribute("rmqkit.delivery_count", deliveries)
    span.set_attribute("rmqkit.outcome", "acked" if type(outcome) is Success else "failed")
    if type(outcome) is not Success:
        error = getattr(outcome, "exc_type", None) or getattr(outcome, "error_type", None)
        span.set_attribute("error.type", str(error or type(outcome).__name__))


def _trace_decision(decision: RetryLater | Park) -> None:
    """What became of a failed delivery, on its span: retried, or parked and why."""
    span = current_span()
    if isinstance(decision, Park):
        span.set_attribute("rmqkit.outcome", "parked")
        span.set_attribute("rmqkit.parking_reason", decision.reason.value)
    else:
        span.set_attribute("rmqkit.outcome", "retried")

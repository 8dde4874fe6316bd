"""Retry and parking copies: publish one, settle its original by the broker's answer.

A failed delivery becomes a copy (retry → a wait queue, park → the parking queue), published
with confirms and ``mandatory`` on the delivery's own channel. Only a confirmed copy lets the
original be acked (marked finished for the batched ack). A copy that could not be published
because the channel went away leaves the original to the broker, which redelivers it. A refused
copy (nacked: a full bounded queue; returned: no such queue) does not exist: the original is
held for the target's backoff and put back with ``basic.reject(requeue=True)``
(rmqkit.consumer.refusals says why a reject and not a nack).

The handler's traceback is logged once per message: with the line of its first failure
(attempt 1, by the attempt number the copies carry, so the same in every worker and after a
restart), as ``exc`` in JSON logs or the lines after it in text. Later retry lines and the park
line carry the error's type and message only; the parked copy stores the last traceback
(``rmqkit-traceback``, ``rmqkit parking show``). A message that fails N times and is parked thus
puts one traceback in the log, and one that fails once and then succeeds still has its cause
there.

A copy that cannot be published while the channel stays open (it cannot be encoded, say)
raises ``CopyNotPublished``: the original would otherwise stay unsettled on an open channel,
which the broker never redelivers. The dispatcher then parks it as an internal error.

Failure path only: nothing here runs for a delivery whose handler succeeded.
"""

from __future__ import annotations

import contextlib
import logging
import traceback as traceback_module
from collections.abc import Awaitable, Callable, Mapping
from datetime import UTC, datetime
from typing import Any

from rmqkit import headers as h
from rmqkit.broker.codec import copy_properties
from rmqkit.broker.session import Channel, Delivery, Outcome
from rmqkit.consumer.acks import AckTracker
from rmqkit.consumer.decision import (
    Park,
    RetryLater,
    internal_error_park,
    qualified_type_name,
)
from rmqkit.consumer.metrics import ConsumerMetrics
from rmqkit.consumer.policy import QueuePolicy
from rmqkit.consumer.refusals import RefusedCopies

log = logging.getLogger("rmqkit.consumer")


class CopyNotPublished(Exception):
    """A copy could not be published while the delivery's channel stays open: its original is
    not settled, and nothing would ever bring it back unless the caller settles it."""

    def __init__(self, target: str, cause: BaseException) -> None:
        super().__init__(f"copy to {target} not published: {type(cause).__name__}: {cause}")
        self.target = target
        self.cause = cause


class CopySender:
    """Publishes the copies of one consumer and settles their originals."""

    def __init__(
        self,
        metrics: ConsumerMetrics,
        tier_names: tuple[str, ...],
        refusals: RefusedCopies,
        finished: Callable[[AckTracker, int], None],
        sleep: Callable[[float], Awaitable[None]],
    ) -> None:
        self._metrics = metrics
        self._tier_names = tier_names
        self._refusals = refusals
        self._finished = finished  # the original may be acked
        self._sleep = sleep  # returns early when the consumer stops

    async def send(
        self,
        channel: Channel | None,
        delivered: Delivery,
        decision: RetryLater | Park,
        tracker: AckTracker,
        tag: int,
        attempt: int,
        traceback: Callable[[], str] | None = None,
        deliveries: int = 1,
    ) -> None:
        """Publish ``decision``'s copy of ``delivered`` on ``channel`` (the consumer's current
        one) and settle the original (tag ``tag``). ``traceback`` formats the handler's
        traceback; it is called, and logged, only for a confirmed copy of attempt 1.
        ``deliveries``: the broker's delivery count of this delivery, shown as ``delivered``."""
        props = delivered.header.properties
        copy = copy_properties(props, decision.headers)
        if isinstance(decision, RetryLater) and decision.expiration_ms is not None:
            # Full jitter: the drawn wait, as a per-message TTL within the slot queue's own.
            copy.expiration = str(decision.expiration_ms)
        extra = {"message_id": props.message_id, "attempt": attempt, "delivered": deliveries}
        target = decision.target_queue
        if channel is None or not channel.owns(delivered) or channel.is_closed:
            # Its channel is gone: the broker has put the original back already.
            log.warning(
                "copy to %s not sent (the delivery's channel is closed); the message will be "
                "redelivered",
                target,
                extra=extra,
            )
            return
        try:
            settled = await channel.publisher.publish(
                delivered.body, exchange="", routing_key=target, properties=copy
            )
            outcome = await settled
        except Exception as exc:
            if channel.is_closed:  # the channel went away meanwhile: the original comes back
                log.warning(
                    "copy to %s not confirmed (%s); the message will be redelivered",
                    target,
                    exc,
                    extra=extra,
                )
                return
            # The channel is open, so the broker will not redeliver the original by itself (a
            # copy that cannot be encoded, a publisher that stopped): the caller must settle it.
            raise CopyNotPublished(target, exc) from exc
        if outcome is Outcome.CONFIRMED:
            self._finished(tracker, tag)
            self._refusals.confirmed(target)
            error_type, message = _failure(decision.headers)
            extra["error_type"] = error_type
            if attempt == 1 and traceback is not None:
                text = traceback()
                if text:
                    extra["traceback"] = text
            self._metrics.sent(target, "parked" if isinstance(decision, Park) else "retried")
            if isinstance(decision, Park):
                self._metrics.parked(decision.reason.value)
                log.warning(
                    "parked in %s: %s (%s: %s)",
                    target,
                    decision.reason.value,
                    error_type,
                    message,
                    extra={**extra, "decision": "park", "reason": decision.reason.value},
                )
            else:
                tier = self._tier_names[decision.tier_index]
                self._metrics.retried(tier)
                log.info(
                    "retry via %s: %s: %s",
                    target,
                    error_type,
                    message,
                    extra={**extra, "decision": "retry", "tier": tier},
                )
            return
        # Nacked (e.g. a full queue with reject-publish) or returned (no such queue): the copy
        # does not exist, so the original must not be acked. Hold it for the target's backoff
        # (cut short by a stop), then put it back with a reject: unlike nack-requeue on 4.3,
        # that counts toward the delivery limit, so the broker parks it in the end.
        self._metrics.sent(target, "refused")
        delay = self._refusals.refused(target, outcome.value, extra)
        await self._sleep(delay)
        if tracker.alive and not channel.is_closed:
            try:
                await channel.reject(tag, requeue=True)
            except Exception:
                if not channel.is_closed:
                    raise  # the caller settles it (the original would stay in hand)
                return  # the channel went away meanwhile: the broker requeues it
            tracker.settled_elsewhere(tag)

    async def requeue(
        self,
        channel: Channel | None,
        delivered: Delivery,
        decision: RetryLater,
        tracker: AckTracker,
        tag: int,
        attempt: int,
        deliveries: int,
    ) -> bool:
        """retry_engine = "broker": put the delivery back with basic.reject(requeue=True); the
        work queue's delayed retry holds it for the tier's delay and counts the return. False
        when its channel had gone (the broker put it back already, and counted it)."""
        props = delivered.header.properties
        extra = {"message_id": props.message_id, "attempt": attempt, "delivered": deliveries}
        if channel is None or not channel.owns(delivered) or channel.is_closed:
            return False
        try:
            await channel.reject(tag, requeue=True)
        except Exception:
            if not channel.is_closed:
                raise  # the caller settles it (the delivery would stay in hand)
            return False
        tracker.settled_elsewhere(tag)
        tier = self._tier_names[decision.tier_index]
        self._metrics.retried(tier)
        error_type, message = _failure(decision.headers)
        log.info(
            "retry via the broker's delayed retry (%s): %s: %s",
            tier,
            error_type,
            message,
            extra={**extra, "error_type": error_type, "decision": "retry", "tier": tier},
        )
        return True

    async def settle_failure(
        self,
        channel: Channel | None,
        delivered: Delivery,
        tracker: AckTracker,
        tag: int,
        exc: Exception,
        policy: QueuePolicy,
        *,
        host: str,
        pid: int,
    ) -> None:
        """Park a delivery that rmqkit failed on (reason internal_error, with the traceback):
        with its headers, else (they were what could not be written) without them. If even
        that copy cannot be published, close the channel so the broker redelivers it (its
        delivery limit parks it in the end): never leave it unsettled on an open channel."""
        props = delivered.header.properties
        extra = {"message_id": props.message_id, "delivery_tag": tag, "queue": policy.queue}
        log.error(
            "internal error on a delivery (%s); parking it as internal_error",
            describe_error(exc),
            exc_info=exc,
            extra=extra,
        )
        if not tracker.is_open(tag):
            return  # decided already (the error came after): nothing left to settle
        trace = h.truncate_traceback("".join(traceback_module.format_exception(exc)))
        deliver = delivered.delivery
        for headers in (props.headers, None):
            try:
                decision = internal_error_park(
                    qualified_type_name(type(exc)),
                    describe_error(exc),
                    trace,
                    headers,
                    policy,
                    exchange=deliver.exchange or "",
                    routing_key=deliver.routing_key or "",
                    now=datetime.now(UTC),
                    host=host,
                    pid=pid,
                )
                await self.send(channel, delivered, decision, tracker, tag, 1, None)
                return
            except Exception as again:
                exc = again
        log.error(
            "delivery %d (message_id %s) cannot be settled (%s); closing the channel so the "
            "broker redelivers it",
            tag,
            props.message_id,
            describe_error(exc),
            extra=extra,
        )
        if channel is not None and channel.owns(delivered):
            tracker.alive = False  # its tags die with it: no ack may go out on it any more
            with contextlib.suppress(Exception):
                await channel.close()


def describe_error(exc: BaseException) -> str:
    """``Type: message`` of an exception on one line (for a log line or a header), even when
    its ``str()`` raises: this runs while settling a delivery rmqkit failed on."""
    try:
        text = " ".join(str(exc).split())
    except Exception:
        text = "<str() of the error failed>"
    name = qualified_type_name(type(exc))
    return f"{name}: {text[:500]}" if text else name


def _failure(headers: Mapping[str, Any]) -> tuple[str, str]:
    """The error a retry or park copy records, for its log line: the on-call engineer reads why
    from the log without opening the message (issue 14). One line, at most 200 characters."""
    error_type = str(headers.get(h.ERROR_TYPE) or "-")
    message = " ".join(str(headers.get(h.ERROR_MESSAGE) or "").split())
    return error_type, message[:200]

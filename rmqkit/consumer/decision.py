"""The per-message decision: ack, retry through a wait queue, or park. A pure function.

``decide(outcome, headers, policy, ...)`` looks only at its arguments (the clock, host, pid and
random source are passed in), so every branch is unit-tested without a broker. The runner carries
a RetryLater or Park out by publishing a copy of the message (same body and properties, message_id
untouched, the decision's headers) to ``target_queue`` through the default exchange with confirms
and ``mandatory``, and acks the original only after the copy is confirmed.

Header policy of the copies (names in rmqkit.headers, described in docs/headers.md):

* start from the delivery's headers minus the broker's (x-death, x-*-death-*, x-delivery-count);
* ATTEMPT = the number of the delivery that just failed (attempt_number of this delivery);
* ORIGINAL_EXCHANGE / ORIGINAL_ROUTING_KEY and FIRST_FAILED_AT are written once and then kept: a
  retried copy comes back from its wait queue through the default exchange with the work queue's
  name as routing key, which must not overwrite where the producer sent it;
* DELIVERED = the broker's deliveries of the failing copy (x-delivery-count + 1), > 1 after
  crashes or lost connections;
* the last error (type under its public name, rmqkit.headers.public_type_name; bounded
  message), LAST_FAILED_AT, HOST and PID describe the latest failure
  on retries and parks alike, so an operator can see why a message is waiting;
* a retry copy drops PARK_REASON, TRACEBACK and FINGERPRINT left over from an earlier parking
  (after a replay), so its headers never mix two failures; a parked copy gets all three.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from rmqkit import headers as h
from rmqkit.consumer.attempts import attempt_number
from rmqkit.consumer.outcomes import (
    DecryptFailed,
    Failed,
    HandlerOutcome,
    HandlerTimeout,
    MissingMessageId,
    Success,
    TooLarge,
    Undecodable,
    UnroutableType,
    qualified_type_name,
)
from rmqkit.consumer.policy import QueuePolicy
from rmqkit.deaths import DeathEvent, DeathReason, read_x_death
from rmqkit.delay import delivered_route
from rmqkit.fingerprint import fingerprint

# --- decisions -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Ack:
    """Ack the delivery; nothing to publish."""


@dataclass(frozen=True)
class RetryLater:
    """Publish a copy with ``headers`` to the wait queue ``target_queue``, then ack the original."""

    target_queue: str
    headers: dict[str, Any] = field(hash=False)
    tier_index: int
    delay_ms: int  # the tier's nominal delay; the slot's TTL is at most this
    # full jitter: the copy's per-message TTL (the drawn wait), None to wait the slot's TTL
    expiration_ms: int | None = None
    # retry_engine = "broker": no copy; the delivery itself goes back with basic.reject(requeue)
    # and the work queue's delayed retry holds it (target_queue is the work queue)
    requeue: bool = False


@dataclass(frozen=True)
class Park:
    """Publish a copy with ``headers`` to the parking queue ``target_queue``, then ack."""

    target_queue: str
    headers: dict[str, Any] = field(hash=False)
    reason: h.ParkingReason


Decision = Ack | RetryLater | Park


@dataclass(frozen=True)
class _Error:
    type: str
    message: str
    traceback: str | Callable[[], str]  # a callable: formatted only if the message is parked

    def traceback_text(self) -> str:
        return self.traceback if isinstance(self.traceback, str) else self.traceback()


def decide(
    outcome: HandlerOutcome,
    headers: Mapping[str, Any] | None,
    policy: QueuePolicy,
    *,
    exchange: str,
    routing_key: str,
    now: datetime,
    host: str,
    pid: int,
    rand: Callable[[], float] = random.random,
    delivered: int = 1,
) -> Decision:
    """What to do with one delivery of ``policy.queue`` given how handling it went.

    ``exchange``/``routing_key``: the delivery's (used as the original ones only if the message
    carries none yet). ``now`` should be timezone-aware (naive is taken as UTC). ``rand`` returns a
    float in [0, 1) and picks the jitter slot. ``delivered``: the broker's delivery count of
    this delivery (attempts.delivery_count), recorded in the copy.
    """
    if isinstance(outcome, Success):
        return Ack()

    attempt = attempt_number(
        headers,
        policy.queue,
        wait_queues=policy.all_wait_queues,
        broker_retry=policy.broker_retry,
    )
    context = _CopyContext(
        headers, policy, exchange, routing_key, now, host, pid, attempt, delivered
    )

    if isinstance(outcome, UnroutableType):  # an Undecodable: tested first
        error = _Error(outcome.exc_type, outcome.detail, "")
        return context.park(h.ParkingReason.UNROUTABLE_TYPE, error)
    if isinstance(outcome, Undecodable):
        error = _Error(h.public_type_name(outcome.exc_type), outcome.detail, outcome.traceback)
        return context.park(h.ParkingReason.UNDECODABLE, error)
    if isinstance(outcome, TooLarge):
        message = f"body is {outcome.size_bytes} bytes, the limit is {outcome.limit_bytes} bytes"
        return context.park(h.ParkingReason.TOO_LARGE, _Error(outcome.error_type, message, ""))
    if isinstance(outcome, DecryptFailed):
        # Never retried: a key that is missing or a ciphertext that was altered stays so.
        error = _Error(outcome.error_type, outcome.detail, "")
        return context.park(h.ParkingReason.UNDECRYPTABLE, error)
    if isinstance(outcome, MissingMessageId):
        message = "the message has no message_id and this queue requires one"
        return context.park(
            h.ParkingReason.MISSING_MESSAGE_ID, _Error(outcome.error_type, message, "")
        )

    requested_delay_s: float | None = None
    if isinstance(outcome, HandlerTimeout):
        error = _Error(
            outcome.error_type, f"handler did not finish within {outcome.timeout_s:g} s", ""
        )
    else:
        # Stored under its public name (rmqkit.Permanent); the permanent_errors match below
        # keeps the qualified names, as the handler module spelled them.
        error = _Error(
            h.public_type_name(outcome.exc_type), outcome.exc_message, outcome.traceback_text
        )
        if outcome.permanent or policy.is_permanent((outcome.exc_type, *outcome.base_types)):
            return context.park(h.ParkingReason.PERMANENT, error)
        requested_delay_s = outcome.retry_delay_s

    if attempt >= policy.effective_max_attempts:
        return context.park(h.ParkingReason.EXHAUSTED, error)
    if policy.broker_retry:
        # The broker's delay is min(first x returns, last) = the tier of this attempt: a
        # requested delay (rmqkit.Retry(delay_s=)) cannot be passed on, the ladder applies.
        tier = _tier_for(policy, attempt, None)
        delay_ms = policy.retry_delays_ms[tier]
        # headers: what the failure was, for the log line and the hook (no copy carries them)
        failure = context._failure_headers(error)
        return RetryLater(policy.queue, failure, tier, delay_ms, requeue=True)
    tier = _tier_for(policy, attempt, requested_delay_s)
    slots = policy.wait_queues[tier]
    if policy.full_jitter:
        index, expiration_ms = _full_jitter_slot(policy, tier, rand)
        return context.retry(slots[index], tier, policy.retry_delays_ms[tier], error, expiration_ms)
    slot = min(int(rand() * len(slots)), len(slots) - 1)
    return context.retry(slots[max(slot, 0)], tier, policy.retry_delays_ms[tier], error)


def internal_error_park(
    error_type: str,
    message: str,
    traceback: str,
    headers: Mapping[str, Any] | None,
    policy: QueuePolicy,
    *,
    exchange: str,
    routing_key: str,
    now: datetime,
    host: str,
    pid: int,
    delivered: int = 1,
) -> Park:
    """Park a delivery rmqkit itself failed on (``ParkingReason.INTERNAL_ERROR``).

    ``headers``: the delivery's, kept on the copy as any park keeps them; pass None when they
    are what failed (a copy that could not be encoded): the copy then carries rmqkit's headers
    only. Never raises on what the headers hold: a header that cannot be read is left out.
    """
    error = _Error(error_type, message, traceback)
    try:
        attempt = attempt_number(
            headers,
            policy.queue,
            wait_queues=policy.all_wait_queues,
            broker_retry=policy.broker_retry,
        )
        context = _CopyContext(
            headers, policy, exchange, routing_key, now, host, pid, attempt, delivered
        )
        return context.park(h.ParkingReason.INTERNAL_ERROR, error)
    except Exception:
        context = _CopyContext(None, policy, exchange, routing_key, now, host, pid, 1, delivered)
        return context.park(h.ParkingReason.INTERNAL_ERROR, error)


def _full_jitter_slot(
    policy: QueuePolicy, tier: int, rand: Callable[[], float]
) -> tuple[int, int | None]:
    """Full jitter: the slot for a wait ``t`` uniform over ``[0, d]`` (the one with the smallest
    TTL >= t) and the copy's expiration (None when the slot's TTL is ``t`` already)."""
    ttls = policy.wait_ttls_ms[tier]
    wait_ms = min(int(rand() * (policy.retry_delays_ms[tier] + 1)), max(ttls))
    index = min((i for i, ttl in enumerate(ttls) if ttl >= wait_ms), key=lambda i: (ttls[i], i))
    return index, (None if wait_ms >= ttls[index] else wait_ms)


def _tier_for(policy: QueuePolicy, attempt: int, requested_delay_s: float | None) -> int:
    delays = policy.retry_delays_ms
    if requested_delay_s is None:
        return min(attempt - 1, len(delays) - 1)
    requested_ms = requested_delay_s * 1000.0
    fitting = [i for i, delay in enumerate(delays) if delay >= requested_ms]
    if fitting:
        return min(fitting, key=lambda i: (delays[i], i))
    return max(range(len(delays)), key=lambda i: (delays[i], -i))


@dataclass(frozen=True)
class _CopyContext:
    headers: Mapping[str, Any] | None
    policy: QueuePolicy
    exchange: str
    routing_key: str
    now: datetime
    host: str
    pid: int
    attempt: int
    delivered: int = 1

    def retry(
        self,
        target: str,
        tier: int,
        delay_ms: int,
        error: _Error,
        expiration_ms: int | None = None,
    ) -> RetryLater:
        copy = self._failure_headers(error)
        copy.pop(h.PARK_REASON, None)
        copy.pop(h.TRACEBACK, None)
        copy.pop(h.FINGERPRINT, None)
        copy[h.RETRY_TIER] = tier
        copy[h.RETRY_DELAY_MS] = delay_ms
        return RetryLater(
            target_queue=target,
            headers=copy,
            tier_index=tier,
            delay_ms=delay_ms,
            expiration_ms=expiration_ms,
        )

    def park(self, reason: h.ParkingReason, error: _Error) -> Park:
        copy = self._failure_headers(error)
        copy[h.PARK_REASON] = reason.value
        text = error.traceback_text()
        if text:
            copy[h.TRACEBACK] = h.truncate_traceback(text)
        else:
            copy.pop(h.TRACEBACK, None)
        # from the values as stored, so a view computing it again from them gets the same id
        copy[h.FINGERPRINT] = fingerprint(
            reason.value, error.type, copy[h.ERROR_MESSAGE], copy.get(h.TRACEBACK)
        ).id
        return Park(target_queue=self.policy.parking_queue, headers=copy, reason=reason)

    def _failure_headers(self, error: _Error) -> dict[str, Any]:
        copy = h.strip_broker_headers(self.headers)
        now = h.format_timestamp(self.now)
        first_death_here = self._first_death_here()
        copy[h.ATTEMPT] = self.attempt
        copy[h.ORIGIN_QUEUE] = self.policy.queue
        copy[h.ORIGINAL_EXCHANGE], copy[h.ORIGINAL_ROUTING_KEY] = self._original_route(
            first_death_here
        )
        copy[h.FIRST_FAILED_AT] = self._first_failed_at(first_death_here, now)
        copy[h.LAST_FAILED_AT] = now
        copy[h.ERROR_TYPE] = error.type
        copy[h.ERROR_MESSAGE] = h.truncate_message(error.message)
        copy[h.HOST] = self.host
        copy[h.PID] = self.pid
        copy[h.DELIVERED] = min(self.delivered, h.COUNT_MAX)
        return copy

    def _first_death_here(self) -> DeathEvent | None:
        """The oldest x-death entry of this work queue: a broker-driven loop rejected the message
        here before (no rmqkit copy carries x-death, so it is never one of ours)."""
        return next(
            (
                event
                for event in reversed(read_x_death(self.headers))
                if event.queue == self.policy.queue
            ),
            None,
        )

    def _original_route(self, first_death_here: DeathEvent | None) -> tuple[str, str]:
        """Our headers if an earlier copy set them; else the route x-death recorded when the
        message first died in this queue (the producer's exchange and routing key); else this
        delivery's — either mapped back through the delay ladder's headers
        (rmqkit.delay.delivered_route) when it left a ladder stage."""
        headers = self.headers or {}
        exchange = _existing_text(headers.get(h.ORIGINAL_EXCHANGE))
        routing_key = _existing_text(headers.get(h.ORIGINAL_ROUTING_KEY))
        if first_death_here is not None and first_death_here.exchange is not None:
            fallback = (
                first_death_here.exchange,
                first_death_here.routing_keys[0] if first_death_here.routing_keys else "",
            )
        else:
            fallback = (self.exchange, self.routing_key)
        # A message that came out of the delay ladder was delivered through its
        # `….after-NN` stage exchange: keep the target its producer asked for instead.
        fallback = delivered_route(fallback[0], fallback[1], headers)
        return (
            fallback[0] if exchange is None else exchange,
            fallback[1] if routing_key is None else routing_key,
        )

    def _first_failed_at(self, first_death_here: DeathEvent | None, now: str) -> str:
        """Kept from the first failure: our header, else the time of the first rejection in a
        broker-driven loop (x-death, whole seconds), else now."""
        existing = _existing_text((self.headers or {}).get(h.FIRST_FAILED_AT))
        if existing is not None and h.parse_timestamp(existing) is not None:
            return existing
        if (
            first_death_here is not None
            and first_death_here.reason == DeathReason.REJECTED
            and first_death_here.time is not None
        ):
            return h.format_timestamp(first_death_here.time)
        return now


def _existing_text(value: object) -> str | None:
    if isinstance(value, str):
        return value
    if isinstance(value, bytes | bytearray):
        return bytes(value).decode("utf-8", errors="replace")
    return None


# The outcomes live in rmqkit.consumer.outcomes; importing them from here keeps working.
__all__ = [
    "Ack",
    "Decision",
    "DecryptFailed",
    "Failed",
    "HandlerOutcome",
    "HandlerTimeout",
    "MissingMessageId",
    "Park",
    "RetryLater",
    "Success",
    "TooLarge",
    "Undecodable",
    "decide",
    "internal_error_park",
    "qualified_type_name",
]

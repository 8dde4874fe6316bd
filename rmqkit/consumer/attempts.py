"""Attempt counting and x-death parsing, right on RabbitMQ 3.10 through 4.x. Pure; no broker.

Where the count comes from:

* ``rmqkit-attempt`` (headers.ATTEMPT) — the attempts already made, written by rmqkit into every
  copy it republishes. It is the source of truth because it survives a client republish on every
  broker version (4.0+ ignores a client-set x-death; see rabbitmq-facts.md).
* x-death ``{queue: <work queue>, reason: rejected}`` — failures of a broker-driven loop
  (``reject(requeue=False)`` → DLX → wait queue → back), e.g. messages that went around a retry loop
  before rmqkit consumed the queue, or a consumer that rejects instead of republishing. Every copy
  rmqkit publishes has x-death stripped, so any such entry happened *after* the last republish and
  adds to the header's count instead of overlapping it.
* x-death ``{queue: <one of the wait queues>, reason: expired}`` — every return from a wait queue
  follows one failure, so their total is a lower bound. It only matters when someone republished
  without stripping x-death on 3.10-3.12 (where the broker keeps a client's x-death).

``x-delivery-count`` is deliberately *not* an attempt: the quorum queue raises it for every return
(connection loss, shutdown handing back prefetched messages that never reached a handler, browsing
with get + nack). Crash loops are caught by the broker's delivery limit instead, which parks the
message with x-death reason ``delivery_limit``.

Shapes differ by version and client decoding, so parsing is lenient: values may be ``str``,
``bytes`` or ``bytearray``; ``count`` any int width (or missing: one death per entry, as very old
brokers wrote); ``time`` an aware or naive datetime or epoch number; ``x-last-death-*`` exists only
on 3.13+ (derived from the newest entry otherwise); unreadable entries are skipped, never raised on.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum
from typing import Any

from rmqkit import headers as h


class DeathReason(StrEnum):
    """The ``reason`` values the broker writes into x-death."""

    REJECTED = "rejected"
    EXPIRED = "expired"
    MAXLEN = "maxlen"
    DELIVERY_LIMIT = "delivery_limit"


@dataclass(frozen=True)
class DeathEvent:
    """One x-death entry: the message died ``count`` times in ``queue`` for ``reason``."""

    queue: str
    reason: str  # a DeathReason value, or whatever a newer broker writes
    count: int
    time: datetime | None  # first death of this {queue, reason}; whole seconds; UTC
    exchange: str | None  # the exchange the message had been published to when it died there
    routing_keys: tuple[str, ...]
    original_expiration: str | None = None  # per-message TTL it had, if any


@dataclass(frozen=True)
class DeathHistory:
    """x-death plus the x-first-death-* / x-last-death-* summary headers."""

    events: tuple[DeathEvent, ...]  # newest first, as the broker orders them
    first_queue: str | None = None
    first_reason: str | None = None
    first_exchange: str | None = None
    last_queue: str | None = None
    last_reason: str | None = None
    last_exchange: str | None = None

    def count(self, *, queue: str | None = None, reason: str | None = None) -> int:
        """Total deaths matching ``queue`` and/or ``reason`` (None matches any)."""
        return sum(
            event.count
            for event in self.events
            if (queue is None or event.queue == queue)
            and (reason is None or event.reason == reason)
        )

    def find(self, *, queue: str, reason: str) -> DeathEvent | None:
        """The entry for ``{queue, reason}``, if any (the oldest one if a client duplicated it)."""
        matches = [e for e in self.events if e.queue == queue and e.reason == reason]
        return matches[-1] if matches else None

    @property
    def delivery_limit_hit(self) -> bool:
        return DeathReason.DELIVERY_LIMIT in (
            self.first_reason,
            self.last_reason,
            *(event.reason for event in self.events),
        )


def read_x_death(headers: Mapping[str, Any] | None) -> list[DeathEvent]:
    """The x-death entries as typed records, newest first; [] when there are none."""
    if not headers:
        return []
    raw = headers.get("x-death")
    if isinstance(raw, Mapping):  # a single table instead of an array: be generous
        raw = [raw]
    if not isinstance(raw, list | tuple):
        return []
    events = []
    for entry in raw:
        event = _death_event(entry)
        if event is not None:
            events.append(event)
    return events


def read_death_history(headers: Mapping[str, Any] | None) -> DeathHistory:
    """x-death with its summary headers; before 3.13, x-last-death-* comes from the newest entry."""
    events = tuple(read_x_death(headers))
    headers = headers or {}
    newest = events[0] if events else None
    last_queue = _text(headers.get("x-last-death-queue"))
    last_reason = _text(headers.get("x-last-death-reason"))
    last_exchange = _text(headers.get("x-last-death-exchange"))
    if last_queue is None and last_reason is None and newest is not None:
        last_queue, last_reason, last_exchange = newest.queue, newest.reason, newest.exchange
    return DeathHistory(
        events=events,
        first_queue=_text(headers.get("x-first-death-queue")),
        first_reason=_text(headers.get("x-first-death-reason")),
        first_exchange=_text(headers.get("x-first-death-exchange")),
        last_queue=last_queue,
        last_reason=last_reason,
        last_exchange=last_exchange,
    )


def recorded_attempts(headers: Mapping[str, Any] | None) -> int:
    """The value of our ATTEMPT header as a non-negative int; 0 when absent or unreadable.

    Lenient because the header may have been typed by hand (the management UI publishes header
    values as strings) or re-encoded by another client.
    """
    if not headers:
        return 0
    return _non_negative_int(headers.get(h.ATTEMPT)) or 0


def attempts_made(
    headers: Mapping[str, Any] | None, queue: str, *, wait_queues: Collection[str] = ()
) -> int:
    """How many deliveries of this message through ``queue`` have already failed."""
    history = read_death_history(headers)
    rejected_since_republish = history.count(queue=queue, reason=DeathReason.REJECTED)
    returned_from_waiting = sum(
        history.count(queue=wait, reason=DeathReason.EXPIRED) for wait in set(wait_queues)
    )
    made = max(recorded_attempts(headers) + rejected_since_republish, returned_from_waiting)
    # Capped so that the number of the next delivery still fits the header it is written to
    # (a count of 2**63-1 set by hand or by another client must not make the copy unwritable).
    return min(made, h.COUNT_MAX - 1)


def attempt_number(
    headers: Mapping[str, Any] | None, queue: str, *, wait_queues: Collection[str] = ()
) -> int:
    """1-based number of the current delivery of a message consumed from ``queue``.

    ``wait_queues``: the names of ``queue``'s wait (jitter slot) queues, used as a lower bound (see
    the module docstring); never lower than ATTEMPT + 1.
    """
    return attempts_made(headers, queue, wait_queues=wait_queues) + 1


def delivery_count(headers: Mapping[str, Any] | None, redelivered: bool = False) -> int:
    """How many times the queue has delivered this message, this delivery included.

    ``x-delivery-count`` (quorum queues: returns before this delivery) + 1. Without the header
    (3.12+ omit it at 0; classic queues never set it) 1, or 2 when the broker flags the
    delivery as ``redelivered`` (a lower bound). Not an attempt (see the module docstring): it
    shows a crash loop, which attempts cannot, since no failure is ever recorded.
    """
    count = _non_negative_int((headers or {}).get("x-delivery-count"))
    if count is None:
        return 2 if redelivered else 1
    return min(count, h.COUNT_MAX - 1) + 1


def delivery_limit_hit(headers: Mapping[str, Any] | None) -> bool:
    """Whether a quorum queue's delivery limit dead-lettered this message (at any point)."""
    return read_death_history(headers).delivery_limit_hit


def parking_reason(headers: Mapping[str, Any] | None) -> str | None:
    """Why a message in a parking queue is there: our PARK_REASON, else ``delivery_limit`` if the
    broker parked it, else None (e.g. somebody published it there by hand).

    Returns the raw string for a reason this version does not know (written by a newer rmqkit).
    """
    if headers:
        reason = _text(headers.get(h.PARK_REASON))
        if reason:
            try:
                return h.ParkingReason(reason)
            except ValueError:
                return reason
    if delivery_limit_hit(headers):
        return h.ParkingReason.DELIVERY_LIMIT
    return None


# --- lenient value readers -----------------------------------------------------------------------


def _death_event(entry: object) -> DeathEvent | None:
    if not isinstance(entry, Mapping):
        return None
    fields = {_text(key): value for key, value in entry.items()}
    queue = _text(fields.get("queue"))
    reason = _text(fields.get("reason"))
    if queue is None or reason is None:
        return None
    count = _non_negative_int(fields.get("count"))
    raw_keys = fields.get("routing-keys")
    if isinstance(raw_keys, str | bytes | bytearray):
        raw_keys = [raw_keys]
    routing_keys = (
        tuple(key for key in map(_text, raw_keys) if key is not None)
        if isinstance(raw_keys, list | tuple)
        else ()
    )
    return DeathEvent(
        queue=queue,
        reason=reason,
        count=1 if count is None else count,
        time=h.parse_timestamp(fields.get("time")),
        exchange=_text(fields.get("exchange")),
        routing_keys=routing_keys,
        original_expiration=_text(fields.get("original-expiration")),
    )


def _text(value: object) -> str | None:
    if isinstance(value, str):
        return value
    if isinstance(value, bytes | bytearray):
        return bytes(value).decode("utf-8", errors="replace")
    return None


def _non_negative_int(value: object) -> int | None:
    """A count as an int in [0, COUNT_MAX]; None when ``value`` is not one."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return min(max(int(value), 0), h.COUNT_MAX)
    if isinstance(value, float):
        return min(max(int(value), 0), h.COUNT_MAX) if math.isfinite(value) else None
    text = _text(value)
    if text is not None and len(text) <= 40:  # int() of a huge digit string is slow or refused
        try:
            return min(max(int(text.strip()), 0), h.COUNT_MAX)
        except ValueError:
            return None
    return None

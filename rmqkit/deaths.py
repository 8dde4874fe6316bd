"""The broker's dead-letter record of a message (x-death and the x-first/last-death-* headers),
read leniently, right on RabbitMQ 3.10 through 4.x. Pure; no broker.

Below the consumer and parking layers, which both read it: the consumer counts attempts from it
(``rmqkit.consumer.attempts``), parking shows why and where a message died.

Shapes differ by version and client decoding, so parsing is lenient: values may be ``str``,
``bytes`` or ``bytearray``; ``count`` any int width (or missing: one death per entry, as very old
brokers wrote); ``time`` an aware or naive datetime or epoch number; ``x-last-death-*`` exists only
on 3.13+ (derived from the newest entry otherwise); unreadable entries are skipped, never raised on.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
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
    last_queue = lenient_text(headers.get("x-last-death-queue"))
    last_reason = lenient_text(headers.get("x-last-death-reason"))
    last_exchange = lenient_text(headers.get("x-last-death-exchange"))
    if last_queue is None and last_reason is None and newest is not None:
        last_queue, last_reason, last_exchange = newest.queue, newest.reason, newest.exchange
    return DeathHistory(
        events=events,
        first_queue=lenient_text(headers.get("x-first-death-queue")),
        first_reason=lenient_text(headers.get("x-first-death-reason")),
        first_exchange=lenient_text(headers.get("x-first-death-exchange")),
        last_queue=last_queue,
        last_reason=last_reason,
        last_exchange=last_exchange,
    )


def delivery_limit_hit(headers: Mapping[str, Any] | None) -> bool:
    """Whether a quorum queue's delivery limit dead-lettered this message (at any point)."""
    return read_death_history(headers).delivery_limit_hit


def parking_reason(headers: Mapping[str, Any] | None) -> str | None:
    """Why a message in a parking queue is there: our PARK_REASON, else ``delivery_limit`` if the
    broker parked it, else None (e.g. somebody published it there by hand).

    Returns the raw string for a reason this version does not know (written by a newer rmqkit).
    """
    if headers:
        reason = lenient_text(headers.get(h.PARK_REASON))
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
    fields = {lenient_text(key): value for key, value in entry.items()}
    queue = lenient_text(fields.get("queue"))
    reason = lenient_text(fields.get("reason"))
    if queue is None or reason is None:
        return None
    count = lenient_count(fields.get("count"))
    raw_keys = fields.get("routing-keys")
    if isinstance(raw_keys, str | bytes | bytearray):
        raw_keys = [raw_keys]
    routing_keys = (
        tuple(key for key in map(lenient_text, raw_keys) if key is not None)
        if isinstance(raw_keys, list | tuple)
        else ()
    )
    return DeathEvent(
        queue=queue,
        reason=reason,
        count=1 if count is None else count,
        time=h.parse_timestamp(fields.get("time")),
        exchange=lenient_text(fields.get("exchange")),
        routing_keys=routing_keys,
        original_expiration=lenient_text(fields.get("original-expiration")),
    )


def lenient_text(value: object) -> str | None:
    """A header value as text (bytes decoded as UTF-8, errors replaced); None for a non-text."""
    if isinstance(value, str):
        return value
    if isinstance(value, bytes | bytearray):
        return bytes(value).decode("utf-8", errors="replace")
    return None


def lenient_count(value: object) -> int | None:
    """A count as an int in [0, COUNT_MAX]; None when ``value`` is not one."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return min(max(int(value), 0), h.COUNT_MAX)
    if isinstance(value, float):
        return min(max(int(value), 0), h.COUNT_MAX) if math.isfinite(value) else None
    text = lenient_text(value)
    if text is not None and len(text) <= 40:  # int() of a huge digit string is slow or refused
        try:
            return min(max(int(text.strip()), 0), h.COUNT_MAX)
        except ValueError:
            return None
    return None

"""A parked message as operators see it, and the filters shared by every parking command."""

from __future__ import annotations

import fnmatch
import json
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from pamqp.commands import Basic

from rmqkit import headers as h
from rmqkit.consumer.attempts import read_death_history

REDACTED = "***"


def _text(value: object) -> str | None:
    if isinstance(value, bytes | bytearray):
        return bytes(value).decode("utf-8", "replace")
    return value if isinstance(value, str) else None


@dataclass(frozen=True, slots=True)
class ParkedMessage:
    """One message in a parking queue (read unacked; the broker still holds it)."""

    delivery_tag: int
    properties: Basic.Properties
    body: bytes
    message_id: str | None
    reason: str | None
    attempts: int
    origin_queue: str | None
    error_type: str | None
    error_message: str | None
    first_failed_at: datetime | None
    last_failed_at: datetime | None
    headers: dict[str, Any] = field(hash=False)

    @classmethod
    def from_delivery(cls, tag: int, properties: Basic.Properties, body: bytes) -> ParkedMessage:
        headers: dict[str, Any] = dict(properties.headers or {})
        reason = _text(headers.get(h.PARK_REASON))
        origin = _text(headers.get(h.ORIGIN_QUEUE))
        attempts = headers.get(h.ATTEMPT)
        last = h.parse_timestamp(headers.get(h.LAST_FAILED_AT))
        # rmqkit's own headers say it all for what its consumer parked; x-death is read only
        # for what the broker dead-lettered (it was 8% of a `list`).
        if reason is None or origin is None or not isinstance(attempts, int) or last is None:
            history = read_death_history(headers)
            if reason is None and history.delivery_limit_hit:
                reason = h.ParkingReason.DELIVERY_LIMIT.value
            elif reason is None and history.events:
                reason = history.events[0].reason  # dead-lettered by the broker (rejected…)
            if origin is None and history.events:
                origin = history.events[-1].queue  # the oldest event: where it first died
            if not isinstance(attempts, int):
                attempts = sum(e.count for e in history.events if e.reason != "expired")
            if last is None and history.events:
                last = history.events[0].time
        return cls(
            delivery_tag=tag,
            properties=properties,
            body=body,
            message_id=properties.message_id,
            reason=reason,
            attempts=int(attempts),
            origin_queue=origin,
            error_type=_text(headers.get(h.ERROR_TYPE)),
            error_message=_text(headers.get(h.ERROR_MESSAGE)),
            first_failed_at=h.parse_timestamp(headers.get(h.FIRST_FAILED_AT)) or last,
            last_failed_at=last,
            headers=headers,
        )

    @property
    def size(self) -> int:
        return len(self.body)

    def age_s(self, now: datetime) -> float | None:
        moment = self.last_failed_at
        return None if moment is None else max(0.0, (now - moment).total_seconds())

    def summary(self, *, redact: frozenset[str] = frozenset()) -> dict[str, Any]:
        """The NDJSON object of `list --json` (headers made JSON-safe, sensitive keys masked)."""
        return {
            "message_id": self.message_id,
            "reason": self.reason,
            "attempts": self.attempts,
            "origin_queue": self.origin_queue,
            "error_type": self.error_type,
            "error_message": self.error_message,
            "first_failed_at": _iso(self.first_failed_at),
            "last_failed_at": _iso(self.last_failed_at),
            "size": self.size,
            "headers": redact_value(json_safe(self.headers), redact),
        }


def _iso(moment: datetime | None) -> str | None:
    return None if moment is None else h.format_timestamp(moment)


_PLAIN = frozenset({str, int, float, bool})


def json_safe(value: Any) -> Any:
    """AMQP header values as plain JSON (for display; export keeps exact types instead)."""
    if type(value) in _PLAIN or value is None:  # most header values: checked first, cheaply
        return value
    if isinstance(value, dict):
        return {str(k): json_safe(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [json_safe(v) for v in value]
    if isinstance(value, bytes | bytearray):
        try:
            return bytes(value).decode("utf-8")
        except UnicodeDecodeError:
            return "0x" + bytes(value).hex()
    if isinstance(value, datetime):
        return h.format_timestamp(value if value.tzinfo else value.replace(tzinfo=UTC))
    if value is None or isinstance(value, str | int | float | bool):
        return value
    return str(value)


def redact_value(value: Any, keys: frozenset[str]) -> Any:
    """Mask the values of ``keys`` (case-insensitive) anywhere in nested dicts and lists."""
    if not keys:
        return value
    if isinstance(value, dict):
        return {
            k: (REDACTED if str(k).lower() in keys else redact_value(v, keys))
            for k, v in value.items()
        }
    if isinstance(value, list):
        return [redact_value(v, keys) for v in value]
    return value


def redact_body(body: bytes, keys: frozenset[str]) -> Any:
    """The body for display: JSON parsed and redacted, text as text, binary as hex."""
    try:
        data = json.loads(body)
    except (ValueError, UnicodeDecodeError):
        try:
            return body.decode("utf-8")
        except UnicodeDecodeError:
            return {"binary_hex": body[:4096].hex(), "size": len(body)}
    return redact_value(data, keys)


@dataclass(frozen=True)
class ParkedFilter:
    """The filters of list, stats, replay, purge and export; all given ones must match."""

    reasons: frozenset[str] = frozenset()
    error_type: str | None = None  # glob
    origin: str | None = None
    older_than_s: float | None = None
    newer_than_s: float | None = None
    headers: tuple[tuple[str, str], ...] = ()
    ids: frozenset[str] = frozenset()
    grep: bytes | None = None

    @property
    def empty(self) -> bool:
        return self == ParkedFilter()

    def matches(self, message: ParkedMessage, now: datetime) -> bool:
        if self.reasons and message.reason not in self.reasons:
            return False
        if self.ids and message.message_id not in self.ids:
            return False
        if self.origin is not None and message.origin_queue != self.origin:
            return False
        if self.error_type is not None and not fnmatch.fnmatchcase(
            message.error_type or "", self.error_type
        ):
            return False
        if self.older_than_s is not None or self.newer_than_s is not None:
            age = message.age_s(now)
            if age is None:
                return False
            if self.older_than_s is not None and age < self.older_than_s:
                return False
            if self.newer_than_s is not None and age > self.newer_than_s:
                return False
        for key, wanted in self.headers:
            have = message.headers.get(key)
            if have is None or str(json_safe(have)) != wanted:
                return False
        return self.grep is None or self.grep in message.body

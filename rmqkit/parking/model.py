"""A parked message as operators see it, and the filters shared by every parking command."""

from __future__ import annotations

import contextlib
import fnmatch
import json
import re
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import Any

from rmqkit import headers as h
from rmqkit.broker.codec import Properties
from rmqkit.crypto import KeyRing, Matcher, decrypt_fields, redact_fields
from rmqkit.deaths import DeathReason, read_death_history
from rmqkit.fingerprint import Fingerprint, fingerprint

REDACTED = "***"

# Every reason a parked message can carry: rmqkit's park reasons and the broker's x-death ones.
KNOWN_REASONS: frozenset[str] = frozenset(h.ParkingReason) | frozenset(DeathReason)

# The broker's dead-letter headers; a parked message without any of them was parked by rmqkit.
_BROKER_DEATH_HEADERS = frozenset({"x-death", "x-last-death-reason", "x-first-death-reason"})


def _text(value: object) -> str | None:
    if isinstance(value, bytes | bytearray):
        return bytes(value).decode("utf-8", "replace")
    return value if isinstance(value, str) else None


def broker_death_is_newest(
    park_reason: str | None,
    recorded_at: datetime | None,
    replayed_at: datetime | None,
    death_at: datetime | None,
) -> bool:
    """Whether a message's broker death (x-death) is newer than rmqkit's parking record.

    Called only for a message that has x-death. ``park_reason`` / ``recorded_at``: rmqkit's
    ``rmqkit-park-reason`` and ``rmqkit-last-failed-at``; ``replayed_at``: ``rmqkit-replayed-at``;
    ``death_at``: the time of the newest x-death entry (whole seconds, rounded down).

    The broker's death wins when:

    1. rmqkit did not park the message (no park reason or no parking time): a retry copy or a
       message rmqkit never saw, dead-lettered by the broker;
    2. the message was replayed at or after rmqkit's record: every copy rmqkit publishes has
       x-death stripped, so this death happened after the replay and the record is stale;
    3. the death is later than the record (x-death's time is rounded down to the second, so a
       later second is certainly later; within the same second rule 2 decides).

    Otherwise the x-death predates rmqkit's record (e.g. an imported message that kept it) and
    rmqkit's record describes the newest death.
    """
    if park_reason is None or recorded_at is None:
        return True
    if replayed_at is not None and replayed_at >= recorded_at:
        return True
    return death_at is not None and death_at > recorded_at


def _latest(*moments: datetime | None) -> datetime | None:
    known = [m for m in moments if m is not None]
    return max(known) if known else None


@dataclass(frozen=True, slots=True)
class ParkedMessage:
    """One message in a parking queue (read unacked; the broker still holds it).

    ``reason``, ``origin_queue``, ``error_*``, ``attempts`` and ``last_failed_at`` describe the
    *newest* death of the message (see ``broker_death_is_newest``): rmqkit's parking headers, or
    the broker's x-death when the broker dead-lettered the message after rmqkit last wrote them
    (e.g. a replayed message that then hit the delivery limit).
    """

    delivery_tag: int
    properties: Properties
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
    # The routing key the message had when it reached its origin queue (the producer's): rmqkit's
    # header, else x-death's entry for the origin queue; None when neither says.
    original_routing_key: str | None = None

    @classmethod
    def from_delivery(cls, tag: int, properties: Properties, body: bytes) -> ParkedMessage:
        headers: dict[str, Any] = dict(properties.headers or {})
        reason = _text(headers.get(h.PARK_REASON))
        origin = _text(headers.get(h.ORIGIN_QUEUE))
        attempts = headers.get(h.ATTEMPT)
        last = h.parse_timestamp(headers.get(h.LAST_FAILED_AT))
        error_type = _text(headers.get(h.ERROR_TYPE))
        error_message = _text(headers.get(h.ERROR_MESSAGE))
        original_key = _text(headers.get(h.ORIGINAL_ROUTING_KEY))
        # x-death is parsed only when the broker dead-lettered the message (parsing it for every
        # message was 8% of a `list`).
        if not _BROKER_DEATH_HEADERS.isdisjoint(headers):
            history = read_death_history(headers)
            newest = history.events[0] if history.events else None
            death_time = newest.time if newest is not None else None
            replayed = h.parse_timestamp(headers.get(h.REPLAYED_AT))
            if (newest is not None or history.last_reason is not None) and (
                broker_death_is_newest(reason, last, replayed, death_time)
            ):
                # The broker's death is the parking event: rmqkit's record (if any) is older.
                reason = history.last_reason or (newest.reason if newest else None)
                origin = history.last_queue or origin
                last = _latest(death_time, last, replayed)
                error_type = error_message = None
                recorded = attempts if isinstance(attempts, int) else 0
                attempts = recorded + sum(
                    e.count for e in history.events if e.reason != DeathReason.EXPIRED
                )
            else:
                origin = origin or history.last_queue
                if not isinstance(attempts, int):
                    attempts = sum(
                        e.count for e in history.events if e.reason != DeathReason.EXPIRED
                    )
                if last is None:
                    last = death_time
            if original_key is None and origin is not None:
                # The oldest entry of the origin queue recorded how the message reached it
                # (later ones may show a wait queue's route back: default exchange, queue name).
                first_here = next((e for e in reversed(history.events) if e.queue == origin), None)
                if first_here is not None and first_here.routing_keys:
                    original_key = first_here.routing_keys[0]
        return cls(
            delivery_tag=tag,
            properties=properties,
            body=body,
            message_id=properties.message_id,
            reason=reason,
            attempts=int(attempts) if isinstance(attempts, int) else 0,
            origin_queue=origin,
            error_type=error_type,
            error_message=error_message,
            first_failed_at=h.parse_timestamp(headers.get(h.FIRST_FAILED_AT)) or last,
            last_failed_at=last,
            headers=headers,
            original_routing_key=original_key,
        )

    @property
    def size(self) -> int:
        return len(self.body)

    @property
    def own_parking(self) -> bool:
        """rmqkit's parking headers describe the newest death (not the broker's, after)."""
        return bool(self.error_type) and _text(self.headers.get(h.PARK_REASON)) == self.reason

    @property
    def failure_id(self) -> str:
        """The id of how this message failed: the consumer's ``rmqkit-fingerprint`` when its
        parking is the newest death, else ``failure().id`` (cheap when the header is there)."""
        stored = _text(self.headers.get(h.FINGERPRINT)) if self.own_parking else None
        return stored or self.failure().id

    def failure(self) -> Fingerprint:
        """How this message failed (rmqkit.fingerprint), with ``failure_id`` as its id;
        computed from the reason and error shown (a broker's death carries no error or
        traceback of the application's)."""
        own = self.own_parking
        traceback = _text(self.headers.get(h.TRACEBACK)) if own else None
        computed = fingerprint(self.reason, self.error_type, self.error_message, traceback)
        stored = _text(self.headers.get(h.FINGERPRINT)) if own else None
        return replace(computed, id=stored) if stored else computed

    @property
    def replays(self) -> int:
        """How many times it was replayed out of parking (``rmqkit-replay-count``)."""
        count = self.headers.get(h.REPLAY_COUNT)
        return count if isinstance(count, int) and count > 0 else 0

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
            "error_message": self.redacted_error(redact),
            "first_failed_at": _iso(self.first_failed_at),
            "last_failed_at": _iso(self.last_failed_at),
            "size": self.size,
            "headers": self.redacted_headers(redact),
        }

    def sensitive_values(self, keys: frozenset[str]) -> frozenset[str]:
        """The values the ``keys`` fields hold in this message's body and headers: free text
        (the error message, the traceback) that quotes one of them must not show it."""
        if not keys:
            return frozenset()
        found: set[str] = set()
        with contextlib.suppress(ValueError, UnicodeDecodeError):  # not JSON: no fields
            _collect(json.loads(self.body), keys, found)
        _collect(json_safe(self.headers), keys, found)
        return frozenset(found)

    def redacted_error(self, keys: frozenset[str]) -> str | None:
        """The error message with the ``keys`` fields' values masked."""
        if self.error_message is None or not keys:
            return self.error_message
        return redact_text(self.error_message, keys, self.sensitive_values(keys))

    def redacted_headers(self, keys: frozenset[str]) -> Any:
        """The headers made JSON-safe, ``keys`` masked, also inside the error message and the
        traceback rmqkit stored (they quote what the handler saw)."""
        shown = redact_value(json_safe(self.headers), keys)
        if keys:
            values = self.sensitive_values(keys)
            for name in (h.ERROR_MESSAGE, h.TRACEBACK):
                if isinstance(shown.get(name), str):
                    shown[name] = redact_text(shown[name], keys, values)
        return shown


def _collect(value: Any, keys: frozenset[str], found: set[str]) -> None:
    if isinstance(value, dict):
        for k, v in value.items():
            if str(k).lower() in keys and v is not None and not isinstance(v, dict | list):
                found.add(str(v))
            _collect(v, keys, found)
    elif isinstance(value, list):
        for v in value:
            _collect(v, keys, found)


def redact_text(text: str, keys: frozenset[str], values: frozenset[str] = frozenset()) -> str:
    """``text`` with ``key=value`` / ``'key': 'value'`` spellings of the ``keys`` masked, and
    every occurrence of ``values`` (what those fields hold in the message) masked too."""
    for value in sorted(values, key=len, reverse=True):
        if len(value) >= 3:  # shorter values ("1", "no") would mask half the text
            text = text.replace(value, REDACTED)
    if keys:
        names = "|".join(re.escape(k) for k in sorted(keys, key=len, reverse=True))
        prefix = rf"""(?i)(["']?\b(?:{names})\b["']?\s*[:=]\s*)"""
        quoted = re.compile(prefix + r"""(["'])(.*?)\2""")
        text = quoted.sub(lambda m: f"{m.group(1)}{m.group(2)}{REDACTED}{m.group(2)}", text)
        bare = re.compile(prefix + r"""(?!\*\*\*)([^"'\s,;})\]][^\s,;})\]]*)""")
        text = bare.sub(lambda m: f"{m.group(1)}{REDACTED}", text)
    return text


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


def redact_body(body: bytes, keys: frozenset[str], *, keyring: KeyRing | None = None) -> Any:
    """The body for display: JSON parsed and redacted, text as text, binary as hex.

    Encrypted fields (``$rmqkit_enc`` envelopes, docs/encryption.md) show as
    ``[encrypted kid=…]``; with ``keyring`` (``--decrypt``) as their values instead, a field
    that cannot be opened as ``[undecryptable kid=…: reason]`` while the rest still shows."""
    try:
        data = json.loads(body)
    except (ValueError, UnicodeDecodeError):
        try:
            return body.decode("utf-8")
        except UnicodeDecodeError:
            return {"binary_hex": body[:4096].hex(), "size": len(body)}
    data = (
        redact_fields(data)
        if keyring is None
        else decrypt_fields(data, None, keyring, strict=False)
    )
    return redact_value(data, keys)


PREVIEW_CHARS = 60


def body_preview(body: bytes, keys: frozenset[str], width: int = PREVIEW_CHARS) -> str:
    """The start of the body, on one line, as `parking show` shows it: the same redaction
    (``redact_body``: encrypted fields as ``[encrypted kid=…]``, the ``keys`` fields masked;
    never decrypted), JSON compact, binary as its size. Cut at ``width`` characters with "…"
    — after redaction, so a cut never exposes what was masked."""
    shown = redact_body(body, keys)
    if isinstance(shown, str):
        text = shown
    elif isinstance(shown, dict) and set(shown) == {"binary_hex", "size"}:
        text = f"<{shown['size']} bytes binary>"
    else:
        text = json.dumps(shown, ensure_ascii=False, separators=(",", ":"), default=str)
    text = " ".join(text.split())  # one line: no tab or newline reaches a TSV column
    return text if len(text) <= width else text[: width - 1] + "…"


def decrypted_body(body: bytes, keyring: KeyRing) -> bytes:
    """``body`` with every envelope opened (bad ones marked, ``strict=False``): what
    ``export --decrypt`` writes. A body without envelopes comes back as the same bytes."""
    return decrypt_fields(body, None, keyring, strict=False)


def error_type_matches(pattern: str, error_type: str | None) -> bool:
    """Whether a stored error type matches an ``--error-type`` glob. A pattern without a dot
    also matches the class name alone (``MailboxFull`` finds ``shipping.errors.MailboxFull``):
    handlers' errors are stored by their full path, operators name them as they read them."""
    stored = error_type or ""
    # Stored names are public ones (rmqkit.Permanent); a pattern written with the old module
    # path (rmqkit.consumer.message.Permanent) still finds them.
    pattern = h.public_type_name(pattern)
    if fnmatch.fnmatchcase(stored, pattern):
        return True
    return "." not in pattern and fnmatch.fnmatchcase(stored.rsplit(".", 1)[-1], pattern)


@dataclass(frozen=True)
class ParkedFilter:
    """The filters of list, stats, replay, purge and export; all given ones must match.

    ``looked_at`` gathers the reason and error type of every message ``matches`` was asked
    about, so a filter that matched nothing can say what the queue does hold."""

    reasons: frozenset[str] = frozenset()
    error_type: str | None = None  # glob
    origin: str | None = None
    older_than_s: float | None = None
    newer_than_s: float | None = None
    headers: tuple[tuple[str, str], ...] = ()
    ids: frozenset[str] = frozenset()
    grep: bytes | None = None
    # --match FIELD=VALUE: blind-index equality on encrypted fields, nothing decrypted
    match: tuple[Matcher, ...] = ()
    group: str | None = None  # a fingerprint id, or a prefix of one (parking groups)
    since: datetime | None = None  # parked (last failure) at or after
    until: datetime | None = None  # parked before
    looked_at: set[tuple[str | None, str | None]] = field(
        default_factory=set, compare=False, repr=False
    )

    @property
    def empty(self) -> bool:
        return self == ParkedFilter()

    def matches(self, message: ParkedMessage, now: datetime) -> bool:
        self.looked_at.add((message.reason, message.error_type))
        if self.reasons and message.reason not in self.reasons:
            return False
        if self.ids and message.message_id not in self.ids:
            return False
        if self.origin is not None and message.origin_queue != self.origin:
            return False
        if self.error_type is not None and not error_type_matches(
            self.error_type, message.error_type
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
        if self.grep is not None and self.grep not in message.body:
            return False
        if self.since is not None or self.until is not None:
            parked = message.last_failed_at
            if parked is None:
                return False
            if self.since is not None and parked < self.since:
                return False
            if self.until is not None and parked >= self.until:
                return False
        if self.group is not None and not message.failure_id.startswith(self.group.lower()):
            return False
        return all(m.matches(message.body) for m in self.match)

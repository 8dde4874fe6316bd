"""Every message header rmqkit writes, and the broker headers it strips on republish.

This module is the one place that names them; docs/headers.md describes each one for operators.

Our headers use the prefix ``rmqkit-`` and never ``x-``: RabbitMQ 4.0+ ignores an ``x-death`` that a
client publishes, and ``x-`` names are the broker's namespace, so a count that must survive a
republish has to live in a header the broker leaves alone.

Timestamps (``*-at`` headers) are ISO-8601 UTC strings with millisecond precision, e.g.
``2024-05-01T12:34:56.789Z``, not AMQP timestamps: the AMQP ``T`` type holds whole seconds (too
coarse to see sub-second retry delays), the management UI shows it as a bare integer, and pamqp
guesses seconds vs milliseconds when decoding it. A fixed-width string reads the same in the UI, in
``rmqkit parking show`` and in an NDJSON export, and sorts in time order.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping
from datetime import UTC, datetime
from decimal import Decimal
from enum import StrEnum
from typing import Any, Final

PREFIX: Final = "rmqkit-"

# --- written on every copy rmqkit publishes (retry and park) -------------------------------------
ATTEMPT: Final = "rmqkit-attempt"
"""int: attempts made so far, i.e. the number of the delivery that failed (1 = first delivery)."""
ERROR_TYPE: Final = "rmqkit-error-type"
"""str: type name of the last error: ``pkg.mod.Cls`` (builtins unqualified), and for a class
rmqkit exports at top level its public name (``rmqkit.Permanent``, see ``public_type_name``)."""
ERROR_MESSAGE: Final = "rmqkit-error-message"
"""str: ``str(exc)`` of the last error, at most ERROR_MESSAGE_MAX_CHARS characters."""
ORIGIN_QUEUE: Final = "rmqkit-origin-queue"
"""str: the work queue whose consumer failed the message (where a replay sends it back)."""
ORIGINAL_EXCHANGE: Final = "rmqkit-original-exchange"
"""str: the exchange the producer published to ("" = default exchange); kept across retries."""
ORIGINAL_ROUTING_KEY: Final = "rmqkit-original-routing-key"
"""str: the producer's routing key; kept across retries."""
FIRST_FAILED_AT: Final = "rmqkit-first-failed-at"
"""str (ISO-8601 UTC): when the first failure happened; kept across retries."""
LAST_FAILED_AT: Final = "rmqkit-last-failed-at"
"""str (ISO-8601 UTC): when the latest failure happened."""
HOST: Final = "rmqkit-host"
"""str: host name of the consumer that made the latest decision."""
PID: Final = "rmqkit-pid"
"""int: process id of the consumer that made the latest decision."""
DELIVERED: Final = "rmqkit-delivered"
"""int: how many times the broker delivered the failing copy from the work queue (its
``x-delivery-count`` + 1): above 1 when earlier deliveries did not finish (a worker crash, a
kill -9, a lost connection). Attempts count handler failures; this counts deliveries."""

# --- retry copies only ----------------------------------------------------------------------------
RETRY_TIER: Final = "rmqkit-retry-tier"
"""int: 0-based index of the delay tier the copy was sent to."""
RETRY_DELAY_MS: Final = "rmqkit-retry-delay-ms"
"""int: nominal delay of that tier in ms (the chosen jitter slot may be shorter, never longer)."""

# --- parked copies only ---------------------------------------------------------------------------
PARK_REASON: Final = "rmqkit-park-reason"
"""str: a ParkingReason value."""
TRACEBACK: Final = "rmqkit-traceback"
"""str: the last error's traceback, its last TRACEBACK_MAX_CHARS characters."""
FINGERPRINT: Final = "rmqkit-fingerprint"
"""str: the failure's fingerprint id (rmqkit.fingerprint): messages that failed the same
way share it (``rmqkit parking groups``)."""

# --- written by ``rmqkit parking replay`` ---------------------------------------------------------
REPLAY_COUNT: Final = "rmqkit-replay-count"
"""int: how many times the message was replayed out of parking."""
REPLAYED_AT: Final = "rmqkit-replayed-at"
"""str (ISO-8601 UTC): when it was last replayed."""

# --- written by ``rmqkit parking edit`` -----------------------------------------------------------
EDITED_FROM: Final = "rmqkit-edited-from"
"""str: the message_id of the parked message this one is an edited copy of (the copy has a
new message_id of its own; the audit log has the edit)."""

# --- written by the consumer on its retry and park copies when tracing (rmqkit.tracing) --------
TRACE_LINK: Final = "rmqkit-trace-link"
"""str (a W3C traceparent): the span of the handling that made this copy; the next handling's
span, and a replay's, link to it. The trace itself travels in ``traceparent``."""

# --- written by ``rmqkit parking archive`` (removed by ``restore``) ------------------------------
ARCHIVED_AT: Final = "rmqkit-archived-at"
"""str (ISO-8601 UTC): when it was moved from parking to the archive queue."""

# --- written by the delay ladder (rmqkit.delay.ladder, docs/delay.md) ----------------------------
# Defined there (rmqkit.delay imports this module, not the other way round); named here so this
# module lists every header rmqkit writes. tests/unit/test_decision.py checks they agree.
DELAY_PREFIX: Final = "rmqkit-delay-"
"""Prefix of every header the delay ladder writes."""
DELAY_BIT_PREFIX: Final = "rmqkit-delay-bit-"
"""``rmqkit-delay-bit-00`` …: ``"1"`` if that bit of the delay in ladder units is set, else
``"0"``; present for every bit up to the highest set one."""
DELAY_TOP: Final = "rmqkit-delay-top"
"""str: the highest set bit (``"7"``): the ladder's entry exchange routes on it."""
DELAY_EXCHANGE: Final = "rmqkit-delay-exchange"
"""str: the exchange the delayed message is delivered into when due ("" = default exchange)."""
DELAY_ROUTING_KEY: Final = "rmqkit-delay-routing-key"
"""str: its routing key."""
DELAY_MS: Final = "rmqkit-delay-ms"
"""int: the delay asked for, in ms (before rounding up to whole units)."""
DELAY_UNITS: Final = "rmqkit-delay-units"
"""int: the delay in whole ladder units applied (``ceil(delay_ms / unit_ms)``)."""

ALL_HEADERS: Final = frozenset(
    {
        ATTEMPT,
        ERROR_TYPE,
        ERROR_MESSAGE,
        ORIGIN_QUEUE,
        ORIGINAL_EXCHANGE,
        ORIGINAL_ROUTING_KEY,
        FIRST_FAILED_AT,
        LAST_FAILED_AT,
        HOST,
        PID,
        DELIVERED,
        RETRY_TIER,
        RETRY_DELAY_MS,
        PARK_REASON,
        TRACEBACK,
        FINGERPRINT,
        REPLAY_COUNT,
        REPLAYED_AT,
        ARCHIVED_AT,
        EDITED_FROM,
        TRACE_LINK,
        DELAY_TOP,
        DELAY_EXCHANGE,
        DELAY_ROUTING_KEY,
        DELAY_MS,
        DELAY_UNITS,
    }
)
"""Every fixed header name above (the delay ladder's per-bit headers share DELAY_BIT_PREFIX)."""

COUNT_MAX: Final = 2**63 - 1
"""The largest count an integer header holds (AMQP's signed 64-bit ``l``): counts read from a
delivery (``rmqkit-attempt``, x-death ``count``, ``x-delivery-count``) are capped to it, so the
copy that carries them can always be written."""

ERROR_MESSAGE_MAX_CHARS: Final = 1000
# The whole header table travels in one content-header frame (frame_max, 128 KiB by default), so
# what we add must stay small whatever the handler raised.
TRACEBACK_MAX_CHARS: Final = 4000
TRUNCATION_MARK: Final = "…"


class ParkingReason(StrEnum):
    """Why a message is in a parking queue (the value of PARK_REASON)."""

    PERMANENT = "permanent"
    """The handler raised rmqkit.Permanent or an exception type configured as permanent."""
    EXHAUSTED = "exhausted"
    """Transient failures used up max_attempts (or the queue has no retry tier to wait in)."""
    UNDECODABLE = "undecodable"
    """The body could not be decoded or failed validation against the handler's model."""
    DELIVERY_LIMIT = "delivery_limit"
    """Set by the broker, not by rmqkit: the quorum queue's delivery limit dead-lettered the message
    (typically a handler that crashes its process every time). Read from x-death; never written
    into PARK_REASON by rmqkit."""
    TOO_LARGE = "too_large"
    """The body is larger than the consumer's configured maximum message size."""
    MISSING_MESSAGE_ID = "missing_message_id"
    """The queue requires a message_id (the idempotency key) and the message has none."""
    UNDECRYPTABLE = "undecryptable"
    """A field of the body could not be decrypted (unknown key id, tampered ciphertext, a
    consumer without the key ring, a malformed envelope): parked at once, never retried and
    never handed to the handler; the error message names the field, key id and cause
    (docs/encryption.md). The parked copy keeps the ciphertext as received."""
    UNROUTABLE_TYPE = "unroutable_type"
    """A consumer of routed handlers (``rmqkit consume MODULE``, ``@rmqkit.handler``) has no
    handler for the message's type, or the message carries none (``--route-by``)."""
    INTERNAL_ERROR = "internal_error"
    """rmqkit itself failed on this delivery (decoding its headers, counting its attempts,
    building or encoding its retry copy, ...): parked at once with the error type, message and
    traceback, so one such message never stops the consumer. Report it as a bug; replay the
    message once fixed."""


# Headers the broker owns. Stripped from every copy rmqkit publishes: a client-set x-death is kept
# by 3.10-3.12 (it would grow forever and feed the broker's dead-letter cycle detection) and
# ignored by 4.0+; x-delivery-count / x-acquired-count are per-queue counters that must not travel
# with a copy.
# The broker's delivery annotations: how often the queue holding the message delivered it (4.3+:
# and how often it was acquired). They describe that queue's deliveries, not the message, and
# change with every browse of a parking queue: parking views show them as delivered, export keeps
# them (a faithful record), and nothing rmqkit publishes carries them (replay, import, copies).
DELIVERY_COUNTERS: Final = frozenset({"x-delivery-count", "x-acquired-count"})
BROKER_HEADERS: Final = frozenset(
    {
        "x-death",
        "x-first-death-queue",
        "x-first-death-reason",
        "x-first-death-exchange",
        "x-last-death-queue",
        "x-last-death-reason",
        "x-last-death-exchange",
        "x-delivery-count",
        "x-acquired-count",
    }
)


def strip_broker_headers(headers: Mapping[str, Any] | None) -> dict[str, Any]:
    """A copy of ``headers`` without BROKER_HEADERS, safe to publish again.

    Nested lists and tables are copied too (mutating the result never changes the delivery), and
    values are made encodable again: pamqp decodes a long string that is not UTF-8 into ``bytes``
    but cannot encode ``bytes`` (``TypeError`` on publish), so ``bytes`` become ``bytearray`` (AMQP
    byte array ``x``); tuples become lists. Idempotent.
    """
    if not headers:
        return {}
    return {
        str(key): _republishable(value)
        for key, value in headers.items()
        if key not in BROKER_HEADERS
    }


def _republishable(value: Any) -> Any:
    if isinstance(value, bytes):
        return bytearray(value)
    if isinstance(value, bytearray):
        return bytearray(value)
    if isinstance(value, Mapping):
        return {str(k): _republishable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_republishable(v) for v in value]
    return value


def is_amqp_value(value: object) -> bool:
    """Whether pamqp can encode ``value`` in a header table (and rmqkit allows it: no None)."""
    if value is None or isinstance(value, bytes):
        return False
    if isinstance(value, bool | int | str | bytearray | Decimal | datetime):
        return not isinstance(value, int) or -(2**63) <= value < 2**63
    if isinstance(value, float):
        return math.isfinite(value)
    if isinstance(value, dict):
        return all(isinstance(k, str) and is_amqp_value(v) for k, v in value.items())
    if isinstance(value, list):
        return all(is_amqp_value(v) for v in value)
    return False


def format_timestamp(moment: datetime) -> str:
    """``2024-05-01T12:34:56.789Z``; a naive datetime is taken as UTC."""
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return moment.astimezone(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def parse_timestamp(value: object) -> datetime | None:
    """Read a timestamp header back: our ISO string, an AMQP timestamp, or epoch seconds/ms.

    Returns an aware UTC datetime, or None if ``value`` is not a timestamp.
    """
    if isinstance(value, datetime):
        return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)
    if isinstance(value, bytes | bytearray):
        value = bytes(value).decode("utf-8", errors="replace")
    if isinstance(value, str):
        try:
            parsed = datetime.fromisoformat(value.strip())
        except ValueError:
            return None
        return parsed.replace(tzinfo=UTC) if parsed.tzinfo is None else parsed.astimezone(UTC)
    if isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value):
        seconds = value / 1000.0 if value > 0xFFFFFFFF else float(value)  # as pamqp decodes 'T'
        try:
            return datetime.fromtimestamp(seconds, tz=UTC)
        except (OverflowError, OSError, ValueError):
            return None
    return None


def truncate_message(text: str, max_chars: int = ERROR_MESSAGE_MAX_CHARS) -> str:
    """The first ``max_chars`` characters of ``text`` (the end replaced by a mark if cut)."""
    if len(text) <= max_chars:
        return text
    if max_chars <= len(TRUNCATION_MARK):
        return text[:max_chars]
    return text[: max_chars - len(TRUNCATION_MARK)] + TRUNCATION_MARK


def truncate_traceback(text: str, max_chars: int = TRACEBACK_MAX_CHARS) -> str:
    """The last ``max_chars`` characters of ``text``: the innermost frames and the error line."""
    if len(text) <= max_chars:
        return text
    if max_chars <= len(TRUNCATION_MARK):
        return text[len(text) - max_chars :]
    return TRUNCATION_MARK + text[len(text) - (max_chars - len(TRUNCATION_MARK)) :]


def public_type_name(name: str) -> str:
    """The name an error type is stored and shown under (ERROR_TYPE, parking views, logs).

    A class rmqkit exports at top level is named as users import it, not by the module that
    defines it: ``rmqkit.consumer.message.Permanent`` -> ``rmqkit.Permanent`` (issue 14). Any
    other name is returned as is. Parking views map names stored by older versions the same way,
    so ``--error-type rmqkit.Permanent`` finds messages stored under either name.
    """
    return _public_names().get(name, name)


@functools.cache
def _public_names() -> dict[str, str]:
    # Read from the package's own export table, so a class exported later is covered without a
    # second list to keep in step. Strings only: nothing is imported for it.
    import rmqkit

    names: dict[str, str] = {}
    lazy: Mapping[str, tuple[str, str | None]] = getattr(rmqkit, "_LAZY", {})
    for public, (module, attribute) in lazy.items():
        if attribute is not None:
            names[f"{module}.{attribute}"] = f"rmqkit.{public}"
    for public in getattr(rmqkit, "__all__", ()):
        value = vars(rmqkit).get(public)
        if isinstance(value, type):
            names[f"{value.__module__}.{value.__qualname__}"] = f"rmqkit.{public}"
    return names

"""The topology file's schema: the pydantic models of its TOML tables (``TopologyModel`` and
what it holds), with the duration and retention parsing their fields use. Pure validation; the
``Topology`` facade over a validated file (names, lanes, lookups) is rmqkit.topology.model."""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    StrictBool,
    model_validator,
)

from rmqkit.delay.ladder import DEFAULT_BITS, DEFAULT_UNIT_MS
from rmqkit.durations import format_duration_ms, parse_delay_ms, parse_duration_ms

BUILTIN_EXCHANGE_PREFIX = "amq."


def _duration_text(value: Any) -> str:
    if isinstance(value, bool) or not isinstance(value, str):
        raise ValueError(
            f'bad duration {value!r}: write it as a string with a unit, e.g. "5s" or "500ms"'
        )
    return value


def _duration(value: Any) -> int:
    return parse_duration_ms(_duration_text(value))


DurationMs = Annotated[int, BeforeValidator(_duration)]
"""A duration written as ``"500ms"``/``"5s"``/``"2m"``/``"1h"``, held in milliseconds."""


def _delay(value: Any) -> int | None:
    """A default delay: any spelling of zero (``"0s"``, ``"0m"``, ``"0.0s"``) means none."""
    if value is None:
        return None
    return parse_delay_ms(_duration_text(value)) or None


DelayMs = Annotated[int | None, BeforeValidator(_delay)]
"""A queue's default delay in milliseconds; a zero duration is None (no delay)."""

DAY_MS = 86_400_000
# RabbitMQ stores message-ttl as a 32-bit millisecond count: about 49.7 days.
MAX_TTL_MS = 2**32 - 1


def _retention(value: Any) -> int:
    """A retention period: a duration, or whole days (``"4d"``), as retention is usually said."""
    if isinstance(value, str) and value.strip().endswith("d") and not value.strip()[:-1].isalpha():
        days = value.strip()[:-1].strip()
        try:
            ms = round(float(days) * DAY_MS)
        except ValueError:
            raise ValueError(f'bad retention {value!r}: write e.g. "4d", "12h" or "30m"') from None
    else:
        ms = _duration(value)
    if not 0 < ms <= MAX_TTL_MS:
        raise ValueError(
            f"bad retention {value!r}: must be above zero and at most 49d (RabbitMQ's limit for "
            "a message TTL)"
        )
    return ms


def format_retention_ms(ms: int) -> str:
    """``4d`` for whole days, else as any other duration (``36h``, ``2s``)."""
    return f"{ms // DAY_MS}d" if ms % DAY_MS == 0 else format_duration_ms(ms)


RetentionMs = Annotated[int, BeforeValidator(_retention)]
"""A retention period (``"4d"``, ``"12h"``, ``"2s"``), held in milliseconds."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ExchangeModel(_Strict):
    """``[exchanges.NAME]``."""

    type: Literal["direct", "topic", "fanout", "headers"] = "direct"
    durable: bool = True
    auto_delete: bool = False
    internal: bool = False
    alternate_exchange: str | None = None
    arguments: dict[str, Any] = Field(default_factory=dict)


class BindModel(_Strict):
    """One entry of a work queue's ``bind = [...]``."""

    exchange: str
    routing_key: str = ""
    arguments: dict[str, Any] = Field(default_factory=dict)


# The retry ladder of a work queue whose file does not say `retry_delays` (docs/topology.md).
# One tier per retry that the default max_attempts (5) allows, each about 6-10x the one before:
# 1 s absorbs a blip (a lock, a dropped connection), 10 s a dependency restarting, 1 m a
# failover, 5 m a short outage or a deploy. Past ~6 minutes in all, parking and a replay after
# the fix serve better than more waiting. Without it a file that forgot the key parked every
# message on its first transient failure.
DEFAULT_RETRY_DELAYS_MS: tuple[int, ...] = (1_000, 10_000, 60_000, 300_000)


# The largest default delay a queue may ask for: the default delay ladder's reach (rmqkit.delay:
# 100 ms units, 20 rungs, about 29 h). Checked here so that a file cannot promise a delay that
# `publish` would refuse message by message.
MAX_DEFAULT_DELAY_MS = DEFAULT_UNIT_MS * (2**DEFAULT_BITS - 1)
MAX_PARTITIONS = 256


class LaneModel(_Strict):
    """``[queues.NAME.lanes.LANE]``: a lane of a work queue, its own quorum queue
    ``NAME.lane.LANE`` that rmqkit publishers send matching messages to (docs/topology.md).

    ``header``: every given header must have this value; ``body_over``: the body is strictly
    larger than this many bytes. Both given: both must hold. ``prefetch``/``concurrency``: the
    consumer's for this lane (None: the work queue's).
    """

    header: dict[str, str | int | bool] = Field(default_factory=dict)
    body_over: int | None = Field(default=None, ge=0)
    prefetch: int | None = Field(default=None, ge=1, le=65535)
    concurrency: int | None = Field(default=None, ge=1)

    @model_validator(mode="after")
    def _says_what_it_takes(self) -> LaneModel:
        if not self.header and self.body_over is None:
            raise ValueError(
                "a lane needs header = {...} and/or body_over = BYTES (which messages it takes)"
            )
        return self


class QueueModel(_Strict):
    """``[queues.NAME]``: a work queue with its wait queues and parking queue.

    ``retry_delays``: one wait-queue tier per delay, tried in order (attempt 1 → the first tier;
    the last tier repeats while attempts remain). Left out, the default ladder
    ``DEFAULT_RETRY_DELAYS_MS`` applies: 1s, 10s, 1m, 5m (one tier per retry of the default
    ``max_attempts = 5``). An explicit ``retry_delays = []`` means no retries: a transient
    failure parks the message as ``exhausted`` at once.
    """

    bind: list[BindModel] = Field(default_factory=list)
    retry_delays: list[DurationMs] = Field(default_factory=lambda: list(DEFAULT_RETRY_DELAYS_MS))
    max_attempts: int = Field(default=5, ge=1)
    delivery_limit: int = Field(default=10, ge=1)
    max_length: int | None = Field(default=None, ge=1)
    max_length_bytes: int | None = Field(default=None, ge=1)
    prefetch: int = Field(default=200, ge=1, le=65535)
    parking: str | None = None
    # Jitter: each delay tier is split into `jitter_slots` wait queues whose TTLs are spread
    # evenly over [delay * (1 - jitter), delay]; a burst of failures spreads over that window
    # without per-message TTLs (which block each other at the head of one queue).
    # jitter = 1.0 is full jitter: the consumer draws each wait uniformly over [0, delay].
    jitter: float = Field(default=0.5, ge=0.0, le=1.0)
    jitter_slots: int = Field(default=5, ge=1, le=20)
    # Who holds a retry back: rmqkit's wait queues (the default), or the broker itself
    # (RabbitMQ 4.3's delayed retry on the work queue: linear delays, no jitter, no wait
    # queues; rmqkit.topology.retry_engine says which ladders it can express).
    retry_engine: Literal["queues", "broker"] = "queues"
    permanent_errors: list[str] = Field(default_factory=list)
    handler_timeout: DurationMs | None = None
    require_message_id: bool = False
    max_message_bytes: int | None = Field(default=None, ge=1)
    # Retention: a message that has waited this long in the work queue (since it entered it:
    # first publish, or its return from a retry) leaves it into the parking queue with x-death
    # reason "expired", never dropped: the work queue's message-ttl, dead-lettered at-least-once
    # through the same wiring as the delivery limit. None: messages wait as long as it takes.
    retention: RetentionMs | None = None
    # archive = "30d": the parking queue gets an archive queue (``<parking>.archive``) that
    # `parking archive` moves messages to and `parking restore` brings back; each archived
    # message is kept this long (the archive queue's message-ttl), then dropped: that is what
    # archiving is for. None: no archive queue, purge is the only way to clear the lane.
    archive: RetentionMs | None = None
    # Body and header fields masked in every parking view (list, show, export with --redact).
    sensitive_fields: list[str] = Field(default_factory=list)
    # encrypt = true: publish / outbox.add encrypt the sensitive_fields with the key ring
    # (docs/encryption.md); blind_index: those of them that also get an HMAC for --match.
    # Strict: a quoted "no" or 1 is an error, not silently a boolean.
    encrypt: StrictBool = False
    blind_index: list[str] = Field(default_factory=list)
    allow_edit: StrictBool = False  # `parking edit` may change bodies parked from here (audited)
    # The delay publish / outbox.add apply by default to messages routed here (delay ladder).
    delay: DelayMs = None
    # Lanes (file order = match order), a single active consumer, or N partitions by a header
    # (partition_key) or by the routing key (partition_by = "routing_key": x-modulus-hash, built
    # into RabbitMQ from 4.3, so no plugin there).
    lanes: dict[str, LaneModel] = Field(default_factory=dict)
    single_active_consumer: StrictBool = False
    partitions: int | None = Field(default=None, ge=2, le=MAX_PARTITIONS)
    partition_by: Literal["header", "routing_key"] = "header"
    partition_key: str | None = None


class BindingModel(_Strict):
    """``[[bindings]]``: a plain binding between objects of the file."""

    source: str
    destination: str
    destination_type: Literal["queue", "exchange"] = "queue"
    routing_key: str = ""
    arguments: dict[str, Any] = Field(default_factory=dict)


def _pattern(value: Any) -> str:
    """A permission pattern: a regular expression RabbitMQ matches resource names against."""
    if not isinstance(value, str):
        raise ValueError(f'bad pattern {value!r}: write it as a string, e.g. "^orders\\." or ""')
    try:
        re.compile(value)
    except re.error as exc:
        raise ValueError(f"bad pattern {value!r}: not a regular expression ({exc})") from None
    return value


Pattern = Annotated[str, BeforeValidator(_pattern)]
"""A configure/write/read pattern; "" grants nothing, ".*" everything."""


class PermissionModel(_Strict):
    """``[vhost.permissions.USER]``: what ``USER`` may do in the vhost (RabbitMQ's
    configure/write/read patterns). Each left out grants nothing (""), so a table names exactly
    what the user gets."""

    configure: Pattern = ""
    write: Pattern = ""
    read: Pattern = ""


class VhostModel(_Strict):
    """``[vhost]``: the vhost itself. ``permissions``: users (which must exist) and their
    patterns, applied by ``declare``, shown by ``plan``; users not named keep theirs."""

    permissions: dict[str, PermissionModel] = Field(default_factory=dict)


class TopologyModel(_Strict):
    """A whole topology file."""

    policy_priority: int = Field(default=10, ge=0, le=1000)
    vhost: VhostModel = Field(default_factory=VhostModel)
    exchanges: dict[str, ExchangeModel] = Field(default_factory=dict)
    queues: dict[str, QueueModel] = Field(default_factory=dict)
    bindings: list[BindingModel] = Field(default_factory=list)

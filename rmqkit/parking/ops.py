"""Parking lane operations: list, find, stats, purge — each one browse pass (replay: replay.py)."""

from __future__ import annotations

import hashlib
import json
from collections import Counter
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from rmqkit import headers as h
from rmqkit.broker.amqp import amqp_errors_mapped, parse_version
from rmqkit.broker.identity import BrokerIdentity
from rmqkit.broker.management import ManagementClient, management
from rmqkit.broker.session import Session, open_session
from rmqkit.errors import BrokerError, ConfigError
from rmqkit.parking.browse import BrowseStats, Verdict, browse
from rmqkit.parking.guards import check_browsable
from rmqkit.parking.model import ParkedFilter, ParkedMessage
from rmqkit.parking.records import message_to_record
from rmqkit.settings import Settings, mask_url

Progress = Callable[[int, int], None]  # (seen, total at start)
PUBLISH_WINDOW = 1000  # unconfirmed replay copies in flight


@dataclass
class ParkingSession:
    """An open connection to a parking queue that was checked to be safe to browse."""

    amqp: Session
    api: ManagementClient
    queue: str
    info: dict[str, Any]


@asynccontextmanager
async def parking_session(
    settings: Settings, queue: str, *, missing: str | None = None
) -> AsyncIterator[ParkingSession]:
    """Connect, check ``queue`` is browsable (exit 65 if not; ``missing``: the advice if it
    does not exist), and always close.

    The session is typed (rmqkit.broker.codec): headers keep their exact AMQP types. An export
    must keep them, a replay should, and pamqp's own decoder fails the whole connection on some
    values RabbitMQ accepts (a timestamp past year 9999, a non-UTF-8 header key).
    """
    amqp = await open_session(settings, name=f"rmqkit parking {queue}", typed=True)
    try:
        async with management(settings) as api:
            await require_same_broker(settings, api, amqp)
            info = await check_browsable(api, queue, amqp.server_version, missing=missing)
            # A refused basic.get or publish (no read or write permission) is exit 77 with
            # the broker's words, not a traceback.
            with amqp_errors_mapped(f"working on parking queue {queue!r}"):
                yield ParkingSession(amqp, api, queue, info)
    finally:
        await amqp.close()


async def require_same_broker(settings: Settings, api: ManagementClient, amqp: Session) -> None:
    """ConfigError (78) if the management API answers for another cluster than AMQP.

    The parking commands read a queue's settings through the API and its messages over AMQP:
    a stale RMQKIT_MANAGEMENT_URL made them call a full lane "does not exist". Named as
    `status` and `doctor` name it (broker.identity). An API that cannot say passes.
    """
    try:
        overview = await api.overview()
    except BrokerError:
        return  # the queue lookup that follows reports an API out of reach
    identity = BrokerIdentity(
        amqp_url=amqp.display_url,  # masked
        management_url=mask_url(settings.resolved_management_url()),
        amqp_cluster=amqp.cluster_name,
        amqp_version=amqp.server_version,
        management_cluster=str(overview.get("cluster_name") or "") or None,
        management_version=parse_version(str(overview.get("rabbitmq_version") or "0.0.0")),
    )
    if identity.mismatch is not None:
        raise ConfigError(f"{identity.mismatch} — {identity.fix()}")


async def list_parked(
    settings: Settings,
    queue: str,
    flt: ParkedFilter,
    on_message: Callable[[ParkedMessage], None],
    *,
    limit: int | None = None,
    progress: Progress | None = None,
) -> BrowseStats:
    """Call ``on_message`` for each matching parked message; the queue is left as it was."""
    matched = 0
    now = datetime.now(UTC)
    async with parking_session(settings, queue) as session:
        total = 0

        async def visit(message: ParkedMessage) -> Verdict:
            nonlocal matched
            if progress is not None:
                progress(stats_seen(), total)
            if not flt.matches(message, now):
                return Verdict.KEEP
            matched += 1
            on_message(message)
            if limit is not None and matched >= limit:
                return Verdict.STOP
            return Verdict.KEEP

        seen = 0

        def stats_seen() -> int:
            nonlocal seen
            seen += 1
            return seen

        total = await ready_count(session)
        return await browse(session.amqp, queue, visit)


async def ready_count(session: ParkingSession) -> int:
    """Messages ready in the session's parking queue now."""
    return (await session.amqp.queue_depth(session.queue)).ready


async def find_parked(settings: Settings, queue: str, message_id: str) -> ParkedMessage | None:
    """The parked message with ``message_id`` (the first one, if duplicated), left in place."""
    found: list[ParkedMessage] = []
    flt = ParkedFilter(ids=frozenset({message_id}))
    await list_parked(settings, queue, flt, found.append, limit=1)
    return found[0] if found else None


@dataclass
class ParkingStats:
    """Counts of a parking queue's (matching) messages."""

    queue: str
    total: int = 0
    matched: int = 0
    bytes: int = 0
    by_reason: Counter[str] = field(default_factory=Counter)
    by_error_type: Counter[str] = field(default_factory=Counter)
    by_origin: Counter[str] = field(default_factory=Counter)
    oldest_age_s: float | None = None
    publish_rate: float | None = None  # messages/s parked recently (management API rates)
    deliver_rate: float | None = None
    # Messages other consumers (a replay, an export, another browse) held unacked when the
    # browse started: the broker does not deliver them to us, so they are counted from the
    # management API (which lags by up to its stats interval, ~5 s), not inspected.
    other_consumers: int = 0
    held_by_others: int = 0

    def as_dict(self) -> dict[str, Any]:
        return {
            "queue": self.queue,
            "total": self.total,
            "matched": self.matched,
            "bytes": self.bytes,
            "by_reason": dict(self.by_reason.most_common()),
            "by_error_type": dict(self.by_error_type.most_common()),
            "by_origin": dict(self.by_origin.most_common()),
            "oldest_age_s": self.oldest_age_s,
            "publish_rate": self.publish_rate,
            "other_consumers": self.other_consumers,
            "held_by_others": self.held_by_others,
        }


async def parking_stats(settings: Settings, queue: str, flt: ParkedFilter) -> ParkingStats:
    """Counts by reason, error type and origin, oldest age, and growth when rates are known.

    Messages held unacked by other consumers cannot be read; ``held_by_others`` counts them.
    """
    result = ParkingStats(queue)
    now = datetime.now(UTC)
    async with parking_session(settings, queue) as session:

        async def visit(message: ParkedMessage) -> Verdict:
            result.total += 1
            if not flt.matches(message, now):
                return Verdict.KEEP
            result.matched += 1
            result.bytes += message.size
            result.by_reason[message.reason or "unknown"] += 1
            result.by_error_type[message.error_type or "-"] += 1
            result.by_origin[message.origin_queue or "-"] += 1
            age = message.age_s(now)
            if age is not None and (result.oldest_age_s is None or age > result.oldest_age_s):
                result.oldest_age_s = age
            return Verdict.KEEP

        browsed = await browse(session.amqp, queue, visit)
        # The management API's view was read before our browse: its unacked ones are others'.
        result.other_consumers = browsed.other_consumers
        unacked = session.info.get("messages_unacknowledged")
        if browsed.other_consumers and isinstance(unacked, int):
            result.held_by_others = unacked
        details = (session.info.get("message_stats") or {}).get("publish_details") or {}
        rate = details.get("rate")
        result.publish_rate = float(rate) if isinstance(rate, int | float) else None
    return result


def message_identity(message: ParkedMessage) -> str:
    """A digest of everything a parked message carries except what browsing changes.

    Two browses of the same message give the same identity; a message parked later differs
    (its own message_id, body, or failure headers) unless it is an exact copy.
    """
    record = message_to_record(message.properties, message.body, delivery_info={}, strict=False)
    headers = record["properties"].get("headers")
    if isinstance(headers, dict):
        for key in h.DELIVERY_COUNTERS:
            headers.pop(key, None)
    canonical = json.dumps(record, sort_keys=True, ensure_ascii=True, separators=(",", ":"))
    return hashlib.sha256(canonical.encode("ascii")).hexdigest()


@dataclass
class PurgeResult:
    """What a purge removed (or, dry, would remove)."""

    count: int = 0
    identities: Counter[str] = field(default_factory=Counter)  # of those: ``only`` for a purge


async def purge_parked(
    settings: Settings,
    queue: str,
    flt: ParkedFilter,
    *,
    dry_run: bool = False,
    limit: int | None = None,
    only: Counter[str] | None = None,
    result: PurgeResult | None = None,
) -> PurgeResult:
    """Remove matching parked messages (all when the filter is empty), at most ``limit``.

    ``only`` (the ``identities`` of an earlier dry run) restricts the purge to exactly the
    messages that run counted, however many were parked since: what an operator confirmed.
    ``result``: filled in as the purge goes (an interrupted purge's caller reads how many
    it removed); a new one if not given.
    """
    now = datetime.now(UTC)
    result = PurgeResult() if result is None else result
    remaining = Counter(only) if only is not None else None
    async with parking_session(settings, queue) as session:

        async def visit(message: ParkedMessage) -> Verdict:
            if limit is not None and result.count >= limit:
                return Verdict.STOP
            if remaining is not None and remaining.total() <= 0:
                return Verdict.STOP
            if not flt.matches(message, now):
                return Verdict.KEEP
            identity = message_identity(message) if dry_run or remaining is not None else ""
            if remaining is not None:
                if remaining[identity] <= 0:
                    return Verdict.KEEP  # parked after the count: not what was confirmed
                remaining[identity] -= 1
            result.count += 1
            if dry_run:
                result.identities[identity] += 1
                return Verdict.KEEP
            return Verdict.TAKE

        await browse(session.amqp, queue, visit)
    return result

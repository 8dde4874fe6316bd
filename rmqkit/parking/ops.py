"""Parking lane operations: list, find, stats, purge — each one browse pass (replay: replay.py)."""

from __future__ import annotations

from collections import Counter
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import aiormq

from rmqkit.broker.amqp import connect, server_version
from rmqkit.broker.management import ManagementClient, management
from rmqkit.broker.pamqp_hook import typed_decoding
from rmqkit.parking.browse import (
    BrowseStats,
    Verdict,
    browse,
    check_browsable,
)
from rmqkit.parking.model import ParkedFilter, ParkedMessage
from rmqkit.settings import Settings

Progress = Callable[[int, int], None]  # (seen, total at start)
PUBLISH_WINDOW = 1000  # unconfirmed replay copies in flight


@dataclass
class ParkingSession:
    """An open connection to a parking queue that was checked to be safe to browse."""

    raw: aiormq.abc.AbstractConnection
    api: ManagementClient
    queue: str
    info: dict[str, Any]


@asynccontextmanager
async def parking_session(settings: Settings, queue: str) -> AsyncIterator[ParkingSession]:
    """Connect, check ``queue`` is browsable (exit 65 if not), and always close.

    The connection decodes headers with their exact AMQP types (rmqkit.broker.pamqp_hook): an
    export must keep them, a replay should, and pamqp's own decoder fails the whole connection
    on some values RabbitMQ accepts (a timestamp past year 9999, a non-UTF-8 header key).
    """
    with typed_decoding():
        conn = await connect(settings, name=f"rmqkit parking {queue}")
    try:
        async with management(settings) as api:
            info = await check_browsable(api, queue, server_version(conn))
            raw: aiormq.abc.AbstractConnection = conn.transport.connection  # type: ignore[union-attr]
            yield ParkingSession(raw, api, queue, info)
    finally:
        await conn.close()


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
        return await browse(session.raw, queue, visit)


async def ready_count(session: ParkingSession) -> int:
    channel = await session.raw.channel()
    declared = await channel.queue_declare(session.queue, passive=True)
    await channel.close()
    return int(declared.message_count or 0)


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
        }


async def parking_stats(settings: Settings, queue: str, flt: ParkedFilter) -> ParkingStats:
    """Counts by reason, error type and origin, oldest age, and growth when rates are known."""
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

        await browse(session.raw, queue, visit)
        details = (session.info.get("message_stats") or {}).get("publish_details") or {}
        rate = details.get("rate")
        result.publish_rate = float(rate) if isinstance(rate, int | float) else None
    return result


async def purge_parked(
    settings: Settings, queue: str, flt: ParkedFilter, *, dry_run: bool = False
) -> int:
    """Remove matching parked messages (all when the filter is empty); returns how many."""
    now = datetime.now(UTC)
    count = 0
    async with parking_session(settings, queue) as session:

        async def visit(message: ParkedMessage) -> Verdict:
            nonlocal count
            if not flt.matches(message, now):
                return Verdict.KEEP
            count += 1
            return Verdict.KEEP if dry_run else Verdict.TAKE

        await browse(session.raw, queue, visit)
    return count

"""Replay: parked messages back where they failed, each acked only after its copy is confirmed."""

from __future__ import annotations

import asyncio
import functools
import time
from collections import Counter
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from rmqkit import headers as h
from rmqkit.broker.confirms import ConfirmedPublisher, Outcome, outcome_of
from rmqkit.broker.typed_properties import copy_properties
from rmqkit.parking.browse import BrowseIncomplete, Settlement, Verdict, browse
from rmqkit.parking.model import ParkedFilter, ParkedMessage
from rmqkit.parking.ops import PUBLISH_WINDOW, Progress, parking_session, ready_count
from rmqkit.settings import Settings


@dataclass
class ReplayReport:
    """What a replay did (or, with dry_run, would do)."""

    selected: int = 0
    replayed: int = 0
    returned: int = 0  # unroutable: no queue took it; it stays parked
    failed: int = 0  # nacked by the broker (e.g. a full target); it stays parked
    skipped: int = 0  # no origin queue known and no --to-exchange/--routing-key
    plan: list[tuple[str | None, str, str]] = field(default_factory=list)  # dry run targets
    problems: Counter[str] = field(default_factory=Counter)

    @property
    def partial(self) -> bool:
        return self.replayed < self.selected

    def as_dict(self) -> dict[str, Any]:
        return {
            "selected": self.selected,
            "replayed": self.replayed,
            "returned": self.returned,
            "failed": self.failed,
            "skipped": self.skipped,
            "problems": dict(self.problems),
        }


def replay_headers(headers: dict[str, Any], now: datetime) -> dict[str, Any]:
    """Headers of a replayed copy: fresh attempts, one more replay, the failure history kept."""
    out = h.strip_broker_headers(headers)
    out[h.ATTEMPT] = 0
    previous = out.get(h.REPLAY_COUNT)
    out[h.REPLAY_COUNT] = (previous if isinstance(previous, int) else 0) + 1
    out[h.REPLAYED_AT] = h.format_timestamp(now)
    return out


async def replay_parked(
    settings: Settings,
    queue: str,
    flt: ParkedFilter,
    *,
    to_exchange: str | None = None,
    routing_key: str | None = None,
    dry_run: bool = False,
    rate: float | None = None,
    limit: int | None = None,
    progress: Progress | None = None,
) -> ReplayReport:
    """Send matching parked messages back where they failed, each acked after its confirm.

    A crash at any moment leaves each message parked, in its target, or (within the confirm
    window) in both: never in neither. Running the replay again continues with what is left.
    """
    report = ReplayReport()
    now = datetime.now(UTC)
    interval = 1.0 / rate if rate else 0.0
    next_at = time.monotonic()
    async with parking_session(settings, queue) as session:
        total = await ready_count(session)
        channel = await session.raw.channel(publisher_confirms=True)
        publisher = ConfirmedPublisher(channel, window=PUBLISH_WINDOW)
        seen = 0

        def count(exchange: str, key: str, settled: asyncio.Future[Outcome]) -> None:
            outcome = outcome_of(settled)
            if isinstance(outcome, str):
                report.failed += 1
                report.problems[f"publish failed: {outcome}"] += 1
            elif outcome is Outcome.CONFIRMED:
                report.replayed += 1
            elif outcome is Outcome.NACKED:
                report.failed += 1
                report.problems[f"nacked by the broker (target {key!r} full?)"] += 1
            else:
                report.returned += 1
                report.problems[f"unroutable: exchange {exchange!r} key {key!r}"] += 1

        async def visit(message: ParkedMessage) -> Verdict | Settlement:
            nonlocal seen, next_at
            seen += 1
            if progress is not None:
                progress(seen, total)
            if not flt.matches(message, now):
                return Verdict.KEEP
            if limit is not None and report.selected >= limit:
                return Verdict.STOP
            report.selected += 1
            exchange = to_exchange if to_exchange is not None else ""
            key = routing_key if routing_key is not None else message.origin_queue
            if key is None:
                report.skipped += 1
                report.problems["no origin queue (pass --routing-key)"] += 1
                return Verdict.KEEP
            if dry_run:
                report.plan.append((message.message_id, exchange, key))
                return Verdict.KEEP
            if interval:
                delay = next_at - time.monotonic()
                if delay > 0:
                    await asyncio.sleep(delay)
                next_at = max(next_at, time.monotonic()) + interval
            copy = copy_properties(message.properties, replay_headers(message.headers, now))
            try:
                settled = await publisher.publish(
                    message.body, exchange=exchange, routing_key=key, properties=copy
                )
            except Exception as exc:  # the channel is gone: nothing more can be replayed
                report.failed += 1
                report.problems[f"publish failed: {type(exc).__name__}"] += 1
                return Verdict.STOP
            settled.add_done_callback(functools.partial(count, exchange, key))
            return settled

        try:
            await browse(session.raw, queue, visit)
        except BrowseIncomplete as exc:
            raise BrowseIncomplete(
                f"{exc} (before that: replayed {report.replayed} of {report.selected} selected)"
            ) from None
        finally:
            await publisher.close()
            if not channel.is_closed:
                await channel.close()
    return report

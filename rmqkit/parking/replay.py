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
from rmqkit.broker.codec import copy_properties
from rmqkit.broker.session import Outcome, outcome_of
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
    skipped: int = 0  # no target known (see replay_target); it stays parked
    held_back: int = 0  # matched, but replayed max_replays times already: left parked
    plan: list[tuple[str | None, str, str]] = field(default_factory=list)  # dry run targets
    problems: Counter[str] = field(default_factory=Counter)
    queue_total: int = 0  # messages ready in the parking queue when the replay started
    seen: int = 0  # of those, how many the replay has looked at

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
            "held_back": self.held_back,
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


def replay_target(
    message: ParkedMessage,
    parking_queue: str,
    *,
    to_exchange: str | None = None,
    routing_key: str | None = None,
) -> tuple[str, str] | str:
    """Where a replay sends ``message``: ``(exchange, routing key)``, or why it cannot (a problem
    line; the message stays parked). Never a guessed target:

    * no override: the default exchange to the origin queue (the queue it last died in);
    * ``routing_key`` (with or without ``to_exchange``): exactly that key, on ``to_exchange`` or
      the default exchange (where a key is a queue name);
    * ``to_exchange`` alone: the message's original routing key (rmqkit's
      ``rmqkit-original-routing-key``, else the key x-death recorded when it died in its origin
      queue). The origin queue's *name* is not a routing key of a named exchange: routing by it
      sent every message to the wrong place (an alternate exchange's catch-all) or nowhere.
      ``to_exchange=""`` is the default exchange, as with no override.
    """
    exchange = to_exchange or ""
    if routing_key is not None:
        key = routing_key
    elif exchange:
        if message.original_routing_key is None:
            return (
                f"no original routing key known for exchange {exchange!r} "
                "(not parked by rmqkit, no x-death route): pass --routing-key"
            )
        key = message.original_routing_key
    elif message.origin_queue is not None:
        key = message.origin_queue
    else:
        return "no origin queue known: pass --to-exchange and/or --routing-key"
    if exchange == "" and key == parking_queue:
        return f"the target is the parking queue {parking_queue!r} itself"
    return exchange, key


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
    report: ReplayReport | None = None,
    max_replays: int | None = None,
    batch: int | None = None,
    pause_s: float = 0.0,
) -> ReplayReport:
    """Send matching parked messages back where they failed, each acked after its confirm.

    ``rate``: messages per second at most. ``batch``/``pause_s``: after every ``batch``
    replayed, wait until their copies are confirmed, then ``pause_s`` (a downstream that needs
    a breather between waves). ``max_replays``: a message already replayed that many times is
    left parked and counted as ``held_back`` (its fix did not work; not selected, so not a
    partial replay).

    A crash at any moment leaves each message parked, in its target, or (within the confirm
    window) in both: never in neither. Running the replay again continues with what is left.

    ``report``: filled in as the replay goes (pass one to read how far an interrupted replay
    got); a new one if not given.
    """
    report = ReplayReport() if report is None else report
    now = datetime.now(UTC)
    interval = 1.0 / rate if rate else 0.0
    next_at = time.monotonic()
    async with parking_session(settings, queue) as session:
        if to_exchange:
            # Up front, dry run too: publishing to a missing exchange closes the channel (404)
            # part way through, and the dry run is what is meant to catch a typo.
            await session.amqp.require_exchange(to_exchange)
        total = report.queue_total = await ready_count(session)
        channel = await session.amqp.channel(confirms=True, window=PUBLISH_WINDOW)
        publisher = channel.publisher
        wave: list[asyncio.Future[Outcome]] = []

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
            nonlocal next_at
            report.seen += 1
            if progress is not None:
                progress(report.seen, total)
            if not flt.matches(message, now):
                return Verdict.KEEP
            if max_replays is not None and message.replays >= max_replays:
                report.held_back += 1
                return Verdict.KEEP
            if limit is not None and report.selected >= limit:
                return Verdict.STOP
            report.selected += 1
            target = replay_target(message, queue, to_exchange=to_exchange, routing_key=routing_key)
            if isinstance(target, str):
                report.skipped += 1
                report.problems[target] += 1
                return Verdict.KEEP
            exchange, key = target
            if dry_run:
                report.plan.append((message.message_id, exchange, key))
                return Verdict.KEEP
            if batch and len(wave) >= batch:
                # the wave's copies confirmed (or not) before the pause: the pause is real
                await asyncio.wait(wave)
                wave.clear()
                if pause_s:
                    await asyncio.sleep(pause_s)
                next_at = time.monotonic()
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
            if batch:
                wave.append(settled)
            return settled

        try:
            await browse(session.amqp, queue, visit)
        except BrowseIncomplete as exc:
            raise BrowseIncomplete(
                f"{exc} (before that: replayed {report.replayed} of {report.selected} selected)"
            ) from None
        finally:
            await channel.close()  # stops the publisher first
    return report

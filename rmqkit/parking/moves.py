"""Moving parked messages from one queue to another (replay, archive, restore): each copy
published with confirms, and the original acked only once its copy is confirmed."""

from __future__ import annotations

import asyncio
import functools
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from rmqkit.broker.codec import copy_properties
from rmqkit.broker.session import Outcome, outcome_of
from rmqkit.errors import DataError
from rmqkit.parking.browse import BrowseIncomplete, Settlement, Verdict, browse
from rmqkit.parking.model import ParkedFilter, ParkedMessage
from rmqkit.parking.ops import PUBLISH_WINDOW, Progress, parking_session, ready_count
from rmqkit.settings import Settings

Route = Callable[[ParkedMessage], "tuple[str, str] | str"]
"""Where a message goes: ``(exchange, routing key)``, or why it cannot (it stays)."""

Rewrite = Callable[[ParkedMessage, datetime], dict[str, Any]]
"""The copy's headers from the original message and the time the move started."""


@dataclass
class MoveReport:
    """What a move (replay, archive, restore) did, or with a dry run would do."""

    selected: int = 0
    moved: int = 0  # copies confirmed, originals acked
    returned: int = 0  # unroutable: no queue took it; it stays where it was
    failed: int = 0  # nacked by the broker (e.g. a full target); it stays where it was
    skipped: int = 0  # no target known (see the route); it stays where it was
    held_back: int = 0  # matched, but replayed max_replays times already: left where it was
    plan: list[tuple[str | None, str, str]] = field(default_factory=list)  # dry run targets
    problems: Counter[str] = field(default_factory=Counter)
    queue_total: int = 0  # messages ready in the source queue when the move started
    seen: int = 0  # of those, how many the move has looked at

    @property
    def partial(self) -> bool:
        return self.moved < self.selected

    def as_dict(self, verb: str = "moved") -> dict[str, Any]:
        """The counts, ``moved`` under the command's own word (``replayed``, ``archived``)."""
        return {
            "selected": self.selected,
            verb: self.moved,
            "returned": self.returned,
            "failed": self.failed,
            "skipped": self.skipped,
            "held_back": self.held_back,
            "problems": dict(self.problems),
        }


async def move_parked(
    settings: Settings,
    queue: str,
    flt: ParkedFilter,
    *,
    route: Route,
    rewrite: Rewrite,
    require_exchange: str | None = None,
    require_queue: tuple[str, str] | None = None,
    source_missing: str | None = None,
    dry_run: bool = False,
    rate: float | None = None,
    limit: int | None = None,
    progress: Progress | None = None,
    report: MoveReport | None = None,
    max_replays: int | None = None,
    batch: int | None = None,
    pause_s: float = 0.0,
) -> MoveReport:
    """Copy each matching message of ``queue`` to where ``route`` says, headers by ``rewrite``,
    and ack the original once the broker confirmed the copy.

    ``rate``: messages per second at most. ``batch``/``pause_s``: after every ``batch``
    moved, wait until their copies are confirmed, then ``pause_s``. ``max_replays``: a message
    already replayed that many times is left where it is and counted as ``held_back`` (not
    selected, so not a partial move). ``require_exchange``/``require_queue`` (the queue and
    the advice if it is missing): checked before anything moves, dry run too (DataError, 65);
    ``source_missing``: the advice if ``queue`` itself does not exist.

    A crash at any moment leaves each message in ``queue``, in its target, or (within the
    confirm window) in both: never in neither. Running the move again continues with what is
    left. ``report``: filled in as the move goes (pass one to read how far an interrupted move
    got); a new one if not given.
    """
    report = MoveReport() if report is None else report
    now = datetime.now(UTC)
    interval = 1.0 / rate if rate else 0.0
    next_at = time.monotonic()
    async with parking_session(settings, queue, missing=source_missing) as session:
        if require_exchange:
            # Up front, dry run too: publishing to a missing exchange closes the channel (404)
            # part way through, and the dry run is what is meant to catch a typo.
            await session.amqp.require_exchange(require_exchange)
        if require_queue is not None:
            # a fixed target queue (archive, restore): by name it would be unroutable, each
            # message "returned", which says less than this
            target, advice = require_queue
            await session.amqp.require_queue(target, DataError, advice)
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
                report.moved += 1
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
            target = route(message)
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
            copy = copy_properties(message.properties, rewrite(message, now))
            try:
                settled = await publisher.publish(
                    message.body, exchange=exchange, routing_key=key, properties=copy
                )
            except Exception as exc:  # the channel is gone: nothing more can be moved
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
                f"{exc} (before that: moved {report.moved} of {report.selected} selected)"
            ) from None
        finally:
            await channel.close()  # stops the publisher first
    return report

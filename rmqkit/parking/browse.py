"""Browsing a parking queue without losing or disturbing anything.

One pass: consume with a prefetch window as large as the queue (so every message is held
unacked by the broker at once; quorum queues cap an unlimited prefetch at 2,000, an explicit
one is honoured), let a visitor look at each message, then cancel the consumer and return the
untouched ones with a single ``basic.nack(multiple=True, requeue=True)``. Never one at a time:
a message returned singly comes straight back and the loop would see it again.

Returning a message to a quorum queue counts as a delivery attempt, so a parking queue with a
delivery limit would drop or dead-letter messages as they are browsed: ``check_browsable``
(rmqkit/parking/guards.py) refuses such a queue before anything is read.

Completeness: a pass ends when it has seen as many messages as the queue held ready at the
start. A pause in deliveries is not taken for the end: after ``IDLE_CHECK_S`` without one the
browse asks the broker, and waits on unless another consumer is on the queue with nothing
ready left (it holds the rest; the pass ends short and ``missed`` says how many). A quorum
queue that just got a large hold back can take seconds to deliver again; one that delivers
nothing for ``STALL_TIMEOUT_S`` is an error (``BrowseIncomplete``, exit 69), never an empty
result. Messages other consumers held when the browse started are not seen at all
(``other_consumers`` says there were some). At the end the browse waits until the broker has
put back what it returned, so the next command sees the whole queue.

Order: on RabbitMQ 3.x a quorum queue without a delivery limit puts returned messages at the
back, in their order, so after a full pass the queue holds the same messages in the same order,
with any message parked during the pass ahead of them.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from enum import Enum
from typing import Any

from rmqkit import headers as h
from rmqkit.broker.session import Channel, Delivery, Session
from rmqkit.errors import BrokerError
from rmqkit.parking.model import ParkedMessage

MAX_WINDOW = 60_000  # prefetch_count is 16-bit; larger queues are browsed in several passes
IDLE_CHECK_S = 2.0  # no delivery for this long: ask the broker whether more are ready
STALL_TIMEOUT_S = 120.0  # messages ready but none delivered for this long: give up, loudly
SETTLE_BASE_S = 10.0  # waiting for returns to be applied: this, plus 1 s per 1,000 returned
SETTLE_MAX_S = 120.0


class BrowseIncomplete(BrokerError):
    """The broker stopped delivering while the queue still had ready messages (exit 69)."""


class Verdict(Enum):
    """What to do with a message the visitor has looked at."""

    KEEP = "keep"  # return it to the queue at the end of the pass
    TAKE = "take"  # remove it now (ack): purge
    STOP = "stop"  # keep it, and end the browse now


# A visitor may also return a future: the message is removed (acked) when it resolves to a
# truthy value — a replay's Outcome.CONFIRMED, an export's fsync — and kept when it resolves
# falsy or fails.
Settlement = asyncio.Future[Any]
Visitor = Callable[[ParkedMessage], Awaitable["Verdict | Settlement"]]


@dataclass
class BrowseStats:
    """What one browse saw."""

    queue_count: int = 0  # ready messages when the browse started
    other_consumers: int = 0  # consumers on the queue then: what they held is not seen
    seen: int = 0
    kept: int = 0
    taken: int = 0
    stopped_early: bool = False
    settled: bool = True  # the broker had put back everything returned when the browse ended

    @property
    def missed(self) -> int:
        """Messages counted at the start that the browse did not see (another consumer's)."""
        return 0 if self.stopped_early else max(0, self.queue_count - self.seen)


async def browse(
    conn: Session | object,
    queue: str,
    visit: Visitor,
    *,
    settle: Callable[[], Awaitable[None]] | None = None,
    window: int = MAX_WINDOW,
    idle_check_s: float = IDLE_CHECK_S,
    stall_timeout_s: float = STALL_TIMEOUT_S,
) -> BrowseStats:
    """Show every message of ``queue`` (as it was when the browse started) to ``visit``.

    ``conn`` is a ``Session`` (or an open connection, wrapped in one).
    ``settle`` is awaited at the end of each pass, before anything is returned: the visitor
    completes what its futures wait for there (an export's last fsync). Messages whose futures
    are still pending are waited for, never returned while their copy may be unconfirmed.
    """
    stats = BrowseStats()
    # The first count and the settle polls go through the session's probe channel, one for the
    # whole browse: opening a channel right after closing one was seen to get the closed one's
    # Close-Ok (aiormq reuses the number) and fail a replay that had done all its work.
    amqp = Session.of(conn)
    depth = await amqp.queue_depth(queue)
    stats.queue_count = remaining = depth.ready
    stats.other_consumers = depth.consumers
    while remaining > 0 and not stats.stopped_early:
        size = min(remaining, window)
        seen = await _one_pass(
            amqp, queue, visit, settle, size, idle_check_s, stall_timeout_s, stats
        )
        if seen < size:
            break  # the rest was taken by another consumer during the pass
        remaining -= seen
    return stats


async def _one_pass(
    amqp: Session,
    queue: str,
    visit: Visitor,
    settle: Callable[[], Awaitable[None]] | None,
    size: int,
    idle_check_s: float,
    stall_timeout_s: float,
    stats: BrowseStats,
) -> int:
    channel = await amqp.channel()
    inbox: asyncio.Queue[Delivery] = asyncio.Queue()

    async def on_delivery(message: Delivery) -> None:
        inbox.put_nowait(message)

    await channel.qos(size)
    consumer_tag = await channel.consume(queue, on_delivery)
    seen = 0
    # The highest tag kept: the one nack(multiple) below names. Not the last tag delivered:
    # when that one was taken (acked), the broker refuses the nack ("unknown delivery tag",
    # 406), closes the channel, and the close racing ours ended the whole connection.
    last_kept = 0
    pending: set[Settlement] = set()
    owners: dict[Settlement, int] = {}

    def on_settled(tag: int, future: Settlement) -> None:
        nonlocal last_kept
        if future not in pending:
            return  # already counted (the final sweep below ran before this callback)
        pending.discard(future)
        if not future.cancelled() and future.exception() is None and future.result():
            stats.taken += 1
            acks.take(tag)
        else:
            stats.kept += 1
            acks.blocked = True
            last_kept = max(last_kept, tag)

    acks = _Acks(channel)
    try:
        while seen < size:
            if inbox.empty():  # a timeout scope costs a timer per call: only when we must wait
                got = await _next_delivery(channel, queue, inbox, idle_check_s, stall_timeout_s)
                if got is None:
                    break  # nothing ready any more: another consumer holds the rest
                delivered = got
            else:
                delivered = inbox.get_nowait()
            tag = int(delivered.delivery.delivery_tag or 0)
            seen += 1
            stats.seen += 1
            message = ParkedMessage.from_delivery(tag, delivered.header.properties, delivered.body)
            if message.error_type is not None:
                # Older versions stored rmqkit's own errors by module path: show and filter
                # them under the public name (rmqkit.Permanent), as new copies store them.
                public = h.public_type_name(message.error_type)
                if public != message.error_type:
                    message = dataclasses.replace(message, error_type=public)
            verdict = await visit(message)
            if isinstance(verdict, asyncio.Future):
                pending.add(verdict)
                owners[verdict] = tag
                verdict.add_done_callback(functools.partial(on_settled, tag))
            elif verdict is Verdict.TAKE:
                stats.taken += 1
                acks.take(tag)
            else:
                stats.kept += 1
                acks.blocked = True
                last_kept = max(last_kept, tag)
                if verdict is Verdict.STOP:
                    stats.stopped_early = True
                    break
            if acks.due:
                await acks.flush()
    finally:
        # Settle what the visitor took first, while the consumer still exists: on 3.10 acks
        # sent after basic.cancel were seen not to apply to some quorum-queue messages.
        if settle is not None:
            await settle()
        if pending:
            futures = {f: t for f, t in owners.items() if f in pending}
            await asyncio.wait(set(futures))
            for future, tag in futures.items():  # done callbacks may not have run yet
                on_settled(tag, future)
        if not channel.is_closed:
            await acks.flush(final=True)
        # Then stop deliveries, or the returned messages would come straight back to us.
        with contextlib.suppress(Exception):
            await channel.cancel(consumer_tag)
        if last_kept and not channel.is_closed:
            # Every outstanding tag up to last_kept is one we keep (the taken ones are acked);
            # those after it were all taken.
            await channel.nack(last_kept, multiple=True, requeue=True)
        # Anything delivered after the cancel was never seen: closing returns it.
        await channel.close()
    if seen:
        returned = stats.seen - stats.taken  # over all passes: what the broker must put back
        deadline = min(SETTLE_MAX_S, SETTLE_BASE_S + returned / 1000)
        stats.settled = await _await_settled(
            amqp, queue, expected=stats.queue_count - stats.taken, deadline_s=deadline
        )
    return seen


async def _next_delivery(
    channel: Channel,
    queue: str,
    inbox: asyncio.Queue[Delivery],
    idle_check_s: float,
    stall_timeout_s: float,
) -> Delivery | None:
    """The next delivery; None when the queue has nothing ready for us any more.

    A pause is not the end: a quorum queue that just got a large hold back was seen to take
    2 s and more before delivering the first message again. The ready count cannot tell:
    a quorum queue counts messages checked out to our consumer as unacked before they reach
    us. Only another consumer can take what we have not seen; without one, we wait.
    """
    loop = asyncio.get_running_loop()
    stalled_since = loop.time()
    while True:
        # asyncio.timeout, not wait_for: on 3.11 wait_for returns the delivery and drops a
        # Ctrl-C (task cancel) that arrives as the delivery does — the command then ran to
        # its end, exit 0. A timeout scope tells its own cancel from ours (uncancel count).
        try:
            async with asyncio.timeout(idle_check_s):
                return await inbox.get()
        except TimeoutError:
            pass
        # On the consuming channel: deliveries sent before the answer arrive before it.
        depth = await channel.queue_depth(queue)
        if not inbox.empty():
            continue
        ready = depth.ready
        others = (depth.consumers or 1) - 1
        if ready == 0 and others > 0:
            return None
        if loop.time() - stalled_since >= stall_timeout_s:
            raise BrowseIncomplete(
                f"browsing {queue!r}: the broker delivered nothing for {stall_timeout_s:.0f} s "
                f"({ready} message(s) ready, {others} other consumer(s)); nothing was changed "
                "or lost — run the command again (check `rmqkit status` for a stuck queue)"
            )


async def _await_settled(amqp: Session, queue: str, *, expected: int, deadline_s: float) -> bool:
    """Wait (bounded) until the broker has put back what we returned; False on the deadline.

    A quorum queue applies returns asynchronously, and a large one all at once, seconds
    later: a command run right after this one (a replay after a list) would otherwise see
    fewer messages. ``expected`` is the ready count we leave; more is fine (messages parked
    meanwhile), fewer after the deadline means someone else consumed some.
    """
    loop = asyncio.get_running_loop()
    until = loop.time() + deadline_s
    while True:
        if (await amqp.queue_depth(queue)).ready >= expected:
            return True
        if loop.time() >= until:
            return False
        await asyncio.sleep(0.05)


class _Acks:
    """Acks what the visitor took, as few frames as the broker allows.

    Every delivery tag up to ``floor - 1`` is settled. The run of taken tags from ``floor`` on
    goes in one ``basic.ack(multiple=True)`` — one settle command in the quorum queue's log
    instead of one per message, which made a replay 1.1-1.6x faster here. Tags beyond a gap
    wait for it to fill (a copy not confirmed yet), unless a kept message makes the gap
    permanent, the end of the pass is reached, or too many wait: then they are acked one by
    one (a multiple ack would take the kept message with it).
    """

    BATCH = 256

    def __init__(self, channel: Channel) -> None:
        self.channel = channel
        self.floor = 1
        self.blocked = False  # a kept message: the floor cannot pass it
        self._taken: list[int] = []
        self._acked_singly: set[int] = set()

    def take(self, tag: int) -> None:
        self._taken.append(tag)

    @property
    def due(self) -> bool:
        return len(self._taken) >= self.BATCH

    async def flush(self, *, final: bool = False) -> None:
        # Decide everything before the first await: confirms settle during it and call take().
        tags = sorted(self._taken)
        self._taken = []
        i, last = 0, 0
        while True:
            if i < len(tags) and tags[i] == self.floor:
                last = tags[i]
                i += 1
            elif self.floor in self._acked_singly:
                self._acked_singly.discard(self.floor)
            else:
                break
            self.floor += 1
        rest = tags[i:]
        singly: list[int] = []
        if rest and (self.blocked or final or len(rest) >= self.BATCH):
            singly = rest
            self._acked_singly.update(rest)
        else:
            self._taken.extend(rest)
        if last:
            await self.channel.ack(last, multiple=True)
        for tag in singly:
            await self.channel.ack(tag)

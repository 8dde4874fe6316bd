"""Batched acknowledgements for one channel.

Handlers finish out of order; ``basic.ack(multiple=True)`` settles every outstanding tag up to
the one given. So the tracker keeps the delivery tags in arrival order plus the set of finished
ones, and acks the longest finished prefix in one frame. A finished tag *past* an unfinished one
cannot go in that frame (it would ack the unfinished one too): it waits one flush for the
prefix to reach it (handlers finish slightly out of order all the time), and if it is still
past an unfinished tag then and the window is nearly full (or it waited LINGER_MAX_S), it is
acked on its own. So a slow message holds its own slot of the prefetch window, not the
window: every message that finished behind it is acked, and the broker sends the next ones.

Tags are per channel: a tracker dies with its channel, and acks for a dead channel are dropped
(the broker requeues those messages); they are never sent on a new channel.

The tracker also knows since when each delivery is in hand and not yet settled (no ack, retry
or park decided for it), for the dispatcher's watchdog (``unsettled_since``).
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Iterator
from time import monotonic
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from rmqkit.broker.session import Channel

# A finished tag past an unfinished one is acked alone after this long even while the window
# has room (a consumer killed meanwhile would otherwise have it handled again).
LINGER_MAX_S = 0.5


class AckTracker:
    """Which delivery tags of one channel are finished, and which of them can be acked how."""

    __slots__ = (
        "_gone",
        "_lingering",
        "_lingering_since",
        "_open",
        "_order",
        "_ready",
        "alive",
        "named",
        "pending_acks",
    )

    def __init__(self) -> None:
        self._order: deque[int] = deque()  # received, not yet passed by the acked prefix
        self._ready: set[int] = set()  # finished, to be acked
        # Settled without the multiple ack: nacked/rejected on their own, or acked alone. They
        # no longer block the prefix and are never the tag of a multiple ack.
        self._gone: set[int] = set()
        self._lingering: set[int] = set()  # past the prefix at the last take: acked alone next
        self._lingering_since = 0.0
        # tag -> (when received, message id): in hand, nothing decided for it yet
        self._open: dict[int, tuple[float, str | None]] = {}
        self.named: set[int] = set()  # tags the watchdog has already reported
        self.alive = True
        self.pending_acks = 0  # finished but not yet acked

    def received(self, tag: int, message_id: str | None = None) -> None:
        """Record a delivery; tags must arrive in increasing order (they do, per channel)."""
        self._order.append(tag)
        self._open[tag] = (monotonic(), message_id)

    def finished(self, tag: int) -> None:
        """``tag`` may be acked: its handler succeeded or its copy was confirmed."""
        if self._open.pop(tag, None) is None:
            return  # already finished or settled: never acked twice
        self._ready.add(tag)
        self.pending_acks += 1

    def settled_elsewhere(self, tag: int) -> None:
        """The message was nacked or rejected on its own: it no longer blocks the prefix.

        It is never the tag of a multiple ack: the broker closes the channel on an ack of a tag
        it no longer holds (PRECONDITION_FAILED - unknown delivery tag), and every message not
        yet acked on it comes back, including those whose retry copies were confirmed.
        """
        self._open.pop(tag, None)
        self._gone.add(tag)

    def is_open(self, tag: int) -> bool:
        """Whether nothing has been decided for ``tag`` yet (no finish, no nack or reject)."""
        return tag in self._open

    def take_acks(
        self, *, everything: bool = False, window: int | None = None, prefix_only: bool = False
    ) -> tuple[int | None, list[int]]:
        """What to ack now: the tag for one ``multiple=True`` ack (None: the oldest tag is
        unfinished) and the tags to ack one by one, in increasing order.

        A finished tag past an unfinished one is acked alone once it was already waiting at
        the previous take, and only when that frees a slot the consumer needs: the deliveries
        not yet acked fill ``window`` (None: always), or it has waited LINGER_MAX_S. Acks one
        by one cost the quorum queue a command each, and while the window has room nothing
        waits for them. ``everything``: every finished tag now (shutdown); ``prefix_only``:
        none alone.
        """
        order, ready, gone = self._order, self._ready, self._gone
        held = len(order) - len(gone)
        last = None
        while order:
            tag = order[0]
            if tag in ready:
                ready.remove(tag)
                last = tag
            elif tag in gone:
                gone.remove(tag)
            else:
                break
            order.popleft()
        alone: list[int] = []
        if ready:  # finished past the first unfinished tag
            now = monotonic()
            if everything:
                alone = sorted(ready)
            elif prefix_only:
                pass
            elif self._lingering and (
                window is None or held >= window or now - self._lingering_since >= LINGER_MAX_S
            ):
                alone = sorted(self._lingering & ready)
            for tag in alone:
                ready.remove(tag)
                gone.add(tag)
            if alone or not self._lingering:
                self._lingering_since = now
            self._lingering = set(ready)
        elif self._lingering:
            self._lingering = set()
        self.pending_acks = len(ready)
        return last, alone

    def take_ack(self) -> int | None:
        """The tag to ack with ``multiple=True`` now (the finished prefix only), or None;
        tags finished past an unfinished one stay pending (``take_acks`` returns those)."""
        return self.take_acks(prefix_only=True)[0]

    def unsettled_since(self, before: float) -> Iterator[tuple[int, float, str | None]]:
        """(tag, when received, message id) of every delivery in hand since before ``before``
        (a ``time.monotonic()`` value) with nothing decided for it yet."""
        for tag, (since, message_id) in list(self._open.items()):
            if since < before:
                yield tag, since, message_id

    def newly_overdue(self, after_s: float) -> list[tuple[int, str | None, float]]:
        """(tag, message id, age in seconds) of each delivery undecided for more than
        ``after_s`` that was not reported before; forgets the reported ones once settled."""
        now = monotonic()
        overdue = []
        for tag, since, message_id in self.unsettled_since(now - after_s):
            if tag not in self.named:
                self.named.add(tag)
                overdue.append((tag, message_id, now - since))
        self.named.intersection_update(self._open)
        return overdue

    @property
    def outstanding(self) -> int:
        """Deliveries not yet settled (in flight or waiting for the ack flush)."""
        return len(self._order) - len(self._gone)


async def flush_acks(
    channel: Channel, tracker: AckTracker, *, everything: bool = False, window: int | None = None
) -> int:
    """Send the acks ``tracker.take_acks(everything=, window=)`` allows on ``channel`` (the
    tracker's own: tags are per channel); returns how many deliveries they settled. A
    channel that fails them is dead: the tracker is marked so, and those messages come back
    from the broker."""
    if not tracker.alive:
        return 0
    before = tracker.outstanding
    last, alone = tracker.take_acks(everything=everything, window=window)
    if last is None and not alone:
        return 0
    count = before - tracker.outstanding  # now: deliveries during the awaits would add
    try:
        if last is not None:
            await channel.ack(last, multiple=True)
        if alone:
            await asyncio.gather(*[channel.ack(tag) for tag in alone])
    except Exception:
        tracker.alive = False  # tags die with the channel; those messages come back
        return 0
    return count

"""Batched acknowledgements for one channel.

Handlers finish out of order; ``basic.ack(multiple=True)`` settles every outstanding tag up to
the one given. So the tracker keeps the delivery tags in arrival order plus the set of finished
ones, and acks the longest finished prefix in one frame. Tags are per channel: a tracker dies
with its channel, and acks for a dead channel are dropped (the broker requeues those messages).
"""

from __future__ import annotations

from collections import deque


class AckTracker:
    """Which delivery tags of one channel are finished, and up to where they can be acked."""

    __slots__ = ("_done", "_order", "alive", "pending_acks")

    def __init__(self) -> None:
        self._order: deque[int] = deque()
        self._done: set[int] = set()
        self.alive = True
        self.pending_acks = 0  # finished but not yet acked

    def received(self, tag: int) -> None:
        """Record a delivery; tags must arrive in increasing order (they do, per channel)."""
        self._order.append(tag)

    def finished(self, tag: int) -> None:
        """``tag`` may be acked: its handler succeeded or its copy was confirmed."""
        self._done.add(tag)
        self.pending_acks += 1

    def settled_elsewhere(self, tag: int) -> None:
        """The message was nacked or rejected on its own: it no longer blocks the prefix."""
        self._done.add(tag)

    def take_ack(self) -> int | None:
        """The tag to ack with ``multiple=True`` now, or None if the oldest one is unfinished."""
        order, done = self._order, self._done
        last = None
        while order and order[0] in done:
            last = order.popleft()
            done.discard(last)
        if last is not None:
            self.pending_acks = len(done)
        return last

    @property
    def outstanding(self) -> int:
        """Deliveries not yet settled (in flight or waiting for the ack flush)."""
        return len(self._order)

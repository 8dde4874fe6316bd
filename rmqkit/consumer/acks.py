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

    __slots__ = ("_done", "_elsewhere", "_order", "alive", "pending_acks")

    def __init__(self) -> None:
        self._order: deque[int] = deque()
        self._done: set[int] = set()
        self._elsewhere: set[int] = set()  # nacked on their own: in _done, never to be acked
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
        """The message was nacked or rejected on its own: it no longer blocks the prefix.

        It is never the tag of a multiple ack: the broker closes the channel on an ack of a tag
        it no longer holds (PRECONDITION_FAILED - unknown delivery tag), and every message not
        yet acked on it comes back, including those whose retry copies were confirmed.
        """
        self._done.add(tag)
        self._elsewhere.add(tag)

    def take_ack(self) -> int | None:
        """The tag to ack with ``multiple=True`` now, or None if the oldest one is unfinished."""
        order, done, elsewhere = self._order, self._done, self._elsewhere
        last = None
        while order and order[0] in done:
            tag = order.popleft()
            done.discard(tag)
            if tag in elsewhere:
                elsewhere.discard(tag)
            else:
                last = tag
        self.pending_acks = len(done) - len(elsewhere)
        return last

    @property
    def outstanding(self) -> int:
        """Deliveries not yet settled (in flight or waiting for the ack flush)."""
        return len(self._order)

"""Backoff for the consumer: reconnects, and copies the broker refuses.

A retry or parking copy can be refused: a bounded target queue with ``overflow=reject-publish``
nacks it when full, an unroutable one returns it. The copy then does not exist, so the original
must not be acked; it goes back to the work queue. Two things keep that from becoming a hot loop
(issue 9, finding 10: 1,049 handler runs for 50 messages in 40 s on RabbitMQ 4.3, never stopping):

- **Backoff per target queue.** Each refusal holds the original for an exponentially growing,
  jittered delay (``RefusedCopies.refused``) before putting it back; a confirmed copy to that
  target ends the streak. While a target refuses, the held originals fill the prefetch window,
  so consumption slows down by itself instead of hammering the full queue.
- **A bound.** The original is put back with ``basic.reject(requeue=True)``, which counts toward
  a quorum queue's delivery limit on every version (4.3 no longer counts
  ``basic.nack(requeue=True)``). A message whose copy keeps being refused thus reaches the work
  queue's delivery limit, and the broker dead-letters it into the parking queue itself; with
  ``dead-letter-strategy=at-least-once`` (what ``rmqkit declare`` sets) the broker keeps it in
  the work queue (``messages_dlx`` in the management API) until the parking queue has room.

Every refusal is counted (``rmqkit_consumer_copies_refused_total{target}``) and the streak is
logged: once when it starts, at most every ``LOG_EVERY_S`` while it lasts, once when it ends.
"""

from __future__ import annotations

import logging
import random
from dataclasses import dataclass, field
from time import monotonic
from typing import Any

from rmqkit.consumer.metrics import ConsumerMetrics

log = logging.getLogger("rmqkit.consumer")

REFUSAL_BASE_S = 1.0  # the first hold after a refusal
REFUSAL_CAP_S = 15.0  # the longest hold (also kept well below the broker's consumer timeout)
LOG_EVERY_S = 30.0


class Backoff:
    """Exponential backoff with "equal jitter": the n-th delay (n = 0 after a reset) is uniform
    over ``[c/2, c]``, ``c = min(cap, base * 2**n)``. Used for reconnects and refused copies.

    Not seed 001's *full* jitter (uniform over ``[0, c]``, which retries can use: QueuePolicy
    ``full_jitter``): a reconnect after a broker went away, or an original put back while its
    target is full, should never come straight back, so half the ceiling is a floor. With the
    defaults a reconnect waits 0.25-0.5 s, then 0.5-1 s, 1-2 s, … up to 15-30 s.
    """

    def __init__(self, base_s: float = 0.5, cap_s: float = 30.0) -> None:
        self.base_s, self.cap_s, self.failures = base_s, cap_s, 0

    def next_delay(self) -> float:
        ceiling = min(self.cap_s, self.base_s * (2**self.failures))
        self.failures += 1
        return random.uniform(ceiling / 2, ceiling)

    def reset(self) -> None:
        self.failures = 0


@dataclass
class _Streak:
    backoff: Backoff
    started: float = field(default_factory=monotonic)
    refused: int = 0
    logged_at: float = 0.0
    logged_count: int = 0


class RefusedCopies:
    """Per target queue: how long to hold an original whose copy was refused, and the log lines.

    Not thread-safe: called from the consumer's event loop, on the failure path only.
    ``consumer_timeout_s`` caps the hold at a quarter of the work queue's consumer timeout, so a
    held original is never what gets the consumer cancelled (4.3) or its channel closed.
    """

    def __init__(
        self,
        metrics: ConsumerMetrics,
        *,
        consumer_timeout_s: float | None = None,
        base_s: float = REFUSAL_BASE_S,
        cap_s: float = REFUSAL_CAP_S,
    ) -> None:
        self._metrics = metrics
        self._base_s = base_s
        self._cap_s = min(cap_s, consumer_timeout_s / 4) if consumer_timeout_s else cap_s
        self._streaks: dict[str, _Streak] = {}

    def refused(self, target: str, why: str, extra: dict[str, Any]) -> float:
        """Count a refused copy to ``target``; the seconds to hold its original before putting
        it back (grows while the refusals go on)."""
        self._metrics.copy_refused(target)
        streak = self._streaks.get(target)
        if streak is None:
            streak = self._streaks[target] = _Streak(Backoff(self._base_s, self._cap_s))
        streak.refused += 1
        delay = streak.backoff.next_delay()
        now = monotonic()
        if streak.refused == 1:
            streak.logged_at, streak.logged_count = now, 1
            log.error(
                "copy to %s was refused (%s); holding the original %.1fs, then putting it back "
                "(basic.reject requeue: it counts toward the work queue's delivery limit); "
                "copies to %s are refused until further notice",
                target,
                why,
                delay,
                target,
                extra=extra,
            )
        elif now - streak.logged_at >= LOG_EVERY_S:
            log.error(
                "copies to %s still refused (%s): %d refused in the last %.0fs, %d since the "
                "first %.0fs ago; holding each original up to %.1fs",
                target,
                why,
                streak.refused - streak.logged_count,
                now - streak.logged_at,
                streak.refused,
                now - streak.started,
                self._cap_s,
                extra=extra,
            )
            streak.logged_at, streak.logged_count = now, streak.refused
        return delay

    def confirmed(self, target: str) -> None:
        """A copy to ``target`` was confirmed: its refusal streak (if any) is over."""
        if not self._streaks:
            return
        streak = self._streaks.pop(target, None)
        if streak is not None:
            log.warning(
                "copies to %s are accepted again after %d refusal(s) over %.0fs",
                target,
                streak.refused,
                monotonic() - streak.started,
            )

    def refusing(self) -> list[str]:
        """The target queues whose latest copy was refused."""
        return sorted(self._streaks)

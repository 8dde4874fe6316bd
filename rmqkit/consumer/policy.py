"""A work queue's retry settings as the consumer's decision reads them (``QueuePolicy``): attempts,
wait tiers and their jitter slots, parking queue, the error types that park at once."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass


@dataclass(frozen=True)
class QueuePolicy:
    """The consumer-relevant settings of one work queue.

    With no retry tiers there is no wait queue to send a copy to, so every transient failure parks
    the message as ``exhausted`` on its first failure, whatever ``max_attempts`` says
    (``effective_max_attempts`` is then 1); returning it to the work queue instead would be exactly
    the poison loop rmqkit exists to prevent.

    Jitter. By default a retry goes to one of its tier's slot queues picked uniformly, and waits
    that slot's TTL (the topology spreads the TTLs over ``[d*(1-jitter), d]``). With
    ``full_jitter`` (seed 001's "full jitter": the wait uniform over ``[0, d]``) the consumer
    draws ``t`` uniformly from ``[0, d]``, sends the copy to the slot with the smallest TTL
    ``>= t`` (``wait_ttls_ms``) and gives it a per-message ``expiration`` of ``t``. Expiry
    happens at a queue's head only, so a copy may wait behind an earlier one in its slot: its
    wait is within ``[t, the slot's TTL]``, off by less than the gap between two slot TTLs —
    which is why full jitter wants slots spread over ``(0, d]`` (the topology's ``jitter = 1.0``).
    """

    queue: str
    parking_queue: str
    retry_delays_ms: tuple[int, ...]  # nominal delay of each tier, first tier first
    max_attempts: int  # deliveries in total, the first one included
    wait_queues: tuple[tuple[str, ...], ...]  # per tier, its jitter slot queues (slot 0 .. n-1)
    # exception type names, qualified ("pkg.mod.Cls") or bare ("Cls"), that park immediately
    permanent_errors: frozenset[str] = frozenset()
    # per tier, the TTL of each slot queue (aligned with wait_queues); () when not known
    wait_ttls_ms: tuple[tuple[int, ...], ...] = ()
    full_jitter: bool = False  # the wait uniform over [0, d] (see the class docstring)
    # retry_engine = "broker": a retry is a basic.reject(requeue=True) that the work queue's
    # delayed retry holds back (RabbitMQ 4.3); no wait queues, and every return the broker
    # counts (x-delivery-count) is an attempt (rmqkit.topology.retry_engine)
    broker_retry: bool = False

    def __post_init__(self) -> None:
        if self.max_attempts < 1:
            raise ValueError(f"max_attempts must be at least 1, got {self.max_attempts}")
        if self.broker_retry:
            if self.wait_queues:
                raise ValueError("a queue the broker retries has no wait queues")
            return
        if len(self.retry_delays_ms) != len(self.wait_queues):
            raise ValueError(
                f"{len(self.retry_delays_ms)} retry delays but {len(self.wait_queues)} tiers of "
                "wait queues: one tier of slot queues per delay"
            )
        for delay_ms, slots in zip(self.retry_delays_ms, self.wait_queues, strict=True):
            if delay_ms <= 0:
                raise ValueError(f"retry delays must be positive, got {delay_ms} ms")
            if not slots:
                raise ValueError(f"the {delay_ms} ms tier has no wait queue")
        if self.wait_ttls_ms and [len(t) for t in self.wait_ttls_ms] != [
            len(s) for s in self.wait_queues
        ]:
            raise ValueError("wait_ttls_ms must give one TTL per slot queue of every tier")
        if self.full_jitter and not self.wait_ttls_ms and self.wait_queues:
            raise ValueError("full jitter needs the slot queues' TTLs (wait_ttls_ms)")

    @property
    def effective_max_attempts(self) -> int:
        """Deliveries a transiently failing message really gets (1 when there is no tier)."""
        if self.broker_retry:
            return self.max_attempts if self.retry_delays_ms else 1
        return self.max_attempts if self.wait_queues else 1

    @property
    def all_wait_queues(self) -> tuple[str, ...]:
        return tuple(name for slots in self.wait_queues for name in slots)

    def is_permanent(self, type_names: Iterable[str]) -> bool:
        """Whether any of ``type_names`` (an error's type and base types) is listed as permanent."""
        return any(
            _type_matches(name, entry) for name in type_names for entry in self.permanent_errors
        )


def _type_matches(type_name: str, entry: str) -> bool:
    type_name = _unqualify_builtin(type_name)
    entry = _unqualify_builtin(entry.strip())
    return bool(entry) and (type_name == entry or type_name.endswith("." + entry))


def _unqualify_builtin(name: str) -> str:
    return name.removeprefix("builtins.")

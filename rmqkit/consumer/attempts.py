"""Attempt counting, right on RabbitMQ 3.10 through 4.x (x-death is read by ``rmqkit.deaths``).
Pure; no broker.

Where the count comes from:

* ``rmqkit-attempt`` (headers.ATTEMPT) — the attempts already made, written by rmqkit into every
  copy it republishes. It is the source of truth because it survives a client republish on every
  broker version (4.0+ ignores a client-set x-death; see rabbitmq-facts.md).
* x-death ``{queue: <work queue>, reason: rejected}`` — failures of a broker-driven loop
  (``reject(requeue=False)`` → DLX → wait queue → back), e.g. messages that went around a retry loop
  before rmqkit consumed the queue, or a consumer that rejects instead of republishing. Every copy
  rmqkit publishes has x-death stripped, so any such entry happened *after* the last republish and
  adds to the header's count instead of overlapping it.
* x-death ``{queue: <one of the wait queues>, reason: expired}`` — every return from a wait queue
  follows one failure, so their total is a lower bound. It only matters when someone republished
  without stripping x-death on 3.10-3.12 (where the broker keeps a client's x-death).

``x-delivery-count`` is deliberately *not* an attempt: the quorum queue raises it for every return
(connection loss, shutdown handing back prefetched messages that never reached a handler, browsing
with get + nack). Crash loops are caught by the broker's delivery limit instead, which parks the
message with x-death reason ``delivery_limit``.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from typing import Any

from rmqkit import headers as h
from rmqkit.deaths import DeathReason, lenient_count, read_death_history


def recorded_attempts(headers: Mapping[str, Any] | None) -> int:
    """The value of our ATTEMPT header as a non-negative int; 0 when absent or unreadable.

    Lenient because the header may have been typed by hand (the management UI publishes header
    values as strings) or re-encoded by another client.
    """
    if not headers:
        return 0
    return lenient_count(headers.get(h.ATTEMPT)) or 0


def attempts_made(
    headers: Mapping[str, Any] | None, queue: str, *, wait_queues: Collection[str] = ()
) -> int:
    """How many deliveries of this message through ``queue`` have already failed."""
    history = read_death_history(headers)
    rejected_since_republish = history.count(queue=queue, reason=DeathReason.REJECTED)
    returned_from_waiting = sum(
        history.count(queue=wait, reason=DeathReason.EXPIRED) for wait in set(wait_queues)
    )
    made = max(recorded_attempts(headers) + rejected_since_republish, returned_from_waiting)
    # Capped so that the number of the next delivery still fits the header it is written to
    # (a count of 2**63-1 set by hand or by another client must not make the copy unwritable).
    return min(made, h.COUNT_MAX - 1)


def attempt_number(
    headers: Mapping[str, Any] | None,
    queue: str,
    *,
    wait_queues: Collection[str] = (),
    broker_retry: bool = False,
) -> int:
    """1-based number of the current delivery of a message consumed from ``queue``.

    ``wait_queues``: the names of ``queue``'s wait (jitter slot) queues, used as a lower bound (see
    the module docstring); never lower than ATTEMPT + 1. ``broker_retry``: the queue retries
    through the broker's delayed retry, so a retry is a return the broker counts: its
    ``x-delivery-count`` adds to the attempts (a crash's return too: there is no other count a
    requeued message carries).
    """
    made = attempts_made(headers, queue, wait_queues=wait_queues)
    if broker_retry:
        returns = lenient_count((headers or {}).get("x-delivery-count")) or 0
        made = min(made + returns, h.COUNT_MAX - 1)
    return made + 1


def delivery_count(headers: Mapping[str, Any] | None, redelivered: bool = False) -> int:
    """How many times the queue has delivered this message, this delivery included.

    ``x-delivery-count`` (quorum queues: returns before this delivery) + 1. Without the header
    (3.12+ omit it at 0; classic queues never set it) 1, or 2 when the broker flags the
    delivery as ``redelivered`` (a lower bound). Not an attempt (see the module docstring): it
    shows a crash loop, which attempts cannot, since no failure is ever recorded.
    """
    count = lenient_count((headers or {}).get("x-delivery-count"))
    if count is None:
        return 2 if redelivered else 1
    return min(count, h.COUNT_MAX - 1) + 1

"""``retry_engine = "broker"``: the work queue's own delayed retry (RabbitMQ 4.3, quorum queues)
instead of wait queues.

The consumer puts a failed message back with ``basic.reject(requeue=True)``; the broker raises
its ``x-delivery-count`` and holds it for ``min(delayed-retry-min * x-delivery-count,
delayed-retry-max)`` before delivering it again (type ``failed``: only returns that count are
delayed). So the ladder it can express is linear and then flat: ``retry_delays`` of the shape
``d, 2d, 3d, …, M, M`` (``min(d * n, M)``, M the last delay), without jitter. Every return
counts as an attempt there, a consumer's crash or a channel closed with the message unacked
included (the broker's count is the only one a requeued message carries). ``delivery_limit``
must leave rmqkit room to park it as ``exhausted`` first.
"""

from __future__ import annotations

from typing import Any

from rmqkit.durations import format_duration_ms
from rmqkit.topology.schema import QueueModel

# The broker retry's settings, in policy-key form (an x-argument is "x-" + key).
TYPE_KEY, MIN_KEY, MAX_KEY = "delayed-retry-type", "delayed-retry-min", "delayed-retry-max"
KEYS = (TYPE_KEY, MIN_KEY, MAX_KEY)
# Only returns that raise x-delivery-count (basic.reject, a lost channel) are delayed; a
# basic.nack(requeue=True), which 4.3 does not count, comes back at once.
RETRY_TYPE = "failed"
SINCE = (4, 3, 0)


def linear_delays(first_ms: int, last_ms: int, count: int) -> list[int]:
    """The delays the broker gives ``count`` retries: ``min(first * n, last)``, n = 1…count."""
    return [min(first_ms * n, last_ms) for n in range(1, count + 1)]


def broker_retry_problem(spec: QueueModel) -> str | None:
    """Why ``spec``'s retries cannot be the broker's (None: they can)."""
    delays = list(spec.retry_delays)
    if not delays:
        return 'retry_engine = "broker" needs retry_delays (without retries there is no engine)'
    expected = linear_delays(delays[0], delays[-1], len(delays))
    if delays != expected:
        shown = ", ".join(format_duration_ms(d) for d in delays)
        fits = ", ".join(format_duration_ms(d) for d in expected)
        return (
            f"the broker delays linearly, min(first x attempt, last): [{shown}] is not of that "
            f"shape (with these ends it would be [{fits}]); use such a ladder, or "
            'retry_engine = "queues" (wait queues take any ladder)'
        )
    jitter_set = {"jitter", "jitter_slots"} & spec.model_fields_set
    if jitter_set and (spec.jitter > 0 and spec.jitter_slots > 1):
        return (
            "the broker's delayed retry has no jitter: drop jitter/jitter_slots, or "
            'retry_engine = "queues"'
        )
    if spec.delivery_limit < spec.max_attempts:
        return (
            f"delivery_limit {spec.delivery_limit} is below max_attempts {spec.max_attempts}: "
            "every retry is a return the broker counts, so it would dead-letter the message "
            "before rmqkit parks it as exhausted; raise delivery_limit"
        )
    return None


def broker_retry_settings(spec: QueueModel) -> dict[str, Any]:
    """The work queue's delayed-retry settings (policy-key form)."""
    delays = list(spec.retry_delays)
    return {TYPE_KEY: RETRY_TYPE, MIN_KEY: delays[0], MAX_KEY: delays[-1]}

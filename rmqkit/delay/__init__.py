"""Delayed delivery without the delayed-message plugin: a binary ladder of TTL queues.

A message delayed by D is published to the ladder's entry exchange with headers that spell
``ceil(D / unit)`` in binary; it waits in one queue per set bit (TTL ``unit * 2**bit``, highest
first) and leaves into its target exchange with its routing key, properties and headers intact.
Everything happens broker-side: no rmqkit process has to run for a delay to complete.
Never early; late by less than one unit plus the broker's latency per hop (docs/delay.md).

- ``Ladder(prefix, unit_ms, bits, queue_type)``: names, bounds, objects, ``plan(...)``;
  ``Ladder.for_max_delay(ms)`` picks the rungs.
- ``Ladder.plan(delay_ms, exchange, routing_key, headers, expiration=...)`` → ``DelayedPublish``
  (where to publish, the headers to send); ``DelayRangeError`` (65) beyond the maximum.
- ``declare_ladder`` / ``declare_target`` / ``delayed_counts`` (``rmqkit.delay.live``).
"""

from __future__ import annotations

from rmqkit.delay.ladder import (
    DEFAULT_BITS,
    DEFAULT_PREFIX,
    DEFAULT_UNIT_MS,
    DelayedPublish,
    DelayRangeError,
    Ladder,
    RungCount,
    delivered_route,
    strip_delay_headers,
)
from rmqkit.delay.live import declare_ladder, declare_target, delayed_counts
from rmqkit.delay.objects import Binding, Exchange, LadderObjects, Queue

__all__ = [
    "DEFAULT_BITS",
    "DEFAULT_PREFIX",
    "DEFAULT_UNIT_MS",
    "Binding",
    "DelayRangeError",
    "DelayedPublish",
    "Exchange",
    "Ladder",
    "LadderObjects",
    "Queue",
    "RungCount",
    "declare_ladder",
    "declare_target",
    "delayed_counts",
    "delivered_route",
    "strip_delay_headers",
]

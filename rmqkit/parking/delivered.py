"""``delivered`` in the parking views: how many times the broker delivered a parked message from
its work queue before it was parked (issue 14, crash loops).

Attempts count handler *failures*; a handler that kills its worker (``os._exit``, kill -9, an
out-of-memory kill) never records one, so a crash-looping message is parked by the broker's
delivery limit with ``attempts`` 1. Its delivery count says what happened:

* parked by rmqkit (retry exhausted, permanent, ...): the copy's ``rmqkit-delivered`` header
  (x-delivery-count + 1 of the delivery that failed; > 1 when earlier deliveries crashed);
* parked by the broker's delivery limit (x-death reason ``delivery_limit``): the work queue's
  delivery limit + 1. Both 3.10 and 4.3 were seen to dead-letter a message on the return that
  takes its count past the limit (limit 3: four deliveries, four dead workers). The message
  itself cannot say: 3.10 hands it to the parking queue with ``x-delivery-count`` 0, and the
  parking queue's own counter rises with every browse. The limit is the one in effect now
  (argument, policy, operator policy, 4.x default), read through the management API;
* otherwise unknown (None): parked by an older rmqkit, or published there by hand.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Mapping

from rmqkit import headers as h
from rmqkit.broker.amqp import parse_version
from rmqkit.broker.management import management
from rmqkit.broker.policies import resolve_queue
from rmqkit.errors import RmqkitError
from rmqkit.parking.model import ParkedMessage
from rmqkit.settings import Settings

DeliveryLimits = Mapping[str, int | None]  # work queue -> its delivery limit (None: none)


def delivered(message: ParkedMessage, limits: DeliveryLimits) -> int | None:
    """The broker's deliveries of ``message`` before it was parked; None when unknown."""
    if message.reason == h.ParkingReason.DELIVERY_LIMIT:
        limit = limits.get(message.origin_queue or "")
        return None if limit is None else limit + 1
    value = message.headers.get(h.DELIVERED)
    if isinstance(value, int) and not isinstance(value, bool) and value > 0:
        return value
    return None


def needs_limits(messages: Iterable[ParkedMessage]) -> set[str]:
    """The origin queues whose delivery limit ``delivered`` needs for these messages."""
    return {
        m.origin_queue
        for m in messages
        if m.reason == h.ParkingReason.DELIVERY_LIMIT and m.origin_queue
    }


async def delivery_limits(
    settings: Settings, queues: Iterable[str] | None
) -> dict[str, int | None]:
    """The delivery limit in effect on each of ``queues`` (None: all the vhost's queues).

    Best effort: a queue that does not exist, or a management API that does not answer, gives
    no entry, and the views show ``delivered`` as unknown rather than fail a listing over it.
    """
    wanted = None if queues is None else set(queues)
    if wanted is not None and not wanted:
        return {}
    found: dict[str, int | None] = {}
    with contextlib.suppress(RmqkitError):
        async with management(settings) as api:
            overview = await api.overview()
            version = parse_version(str(overview.get("rabbitmq_version") or "0.0.0"))
            policies = await api.policies()
            operator_policies = await api.operator_policies()
            if wanted is None:
                raws = await api.queues()
            else:
                raws = [raw for name in sorted(wanted) if (raw := await api.queue(name))]
            for raw in raws:
                if raw.get("type") != "quorum":
                    continue
                effective = resolve_queue(raw, policies, operator_policies, version)
                found[str(raw.get("name"))] = effective.delivery_limit
    return found

"""What a parking command checks before it browses or imports: nothing it does may drop,
dead-letter or misroute a message.

Returning a message to a quorum queue counts as a delivery attempt, so a parking queue with a
delivery limit would lose messages as they are browsed (``check_browsable`` refuses it, with a
fix that works: rmqkit/parking/hints.py); a work queue named where a parking queue is meant
would have its consumers' messages held back, or get a whole lane imported into it.
"""

from __future__ import annotations

import asyncio
from typing import Any

from rmqkit.broker.management import ManagementClient
from rmqkit.broker.policies import DEFAULT_SOURCE_4X, Effective, as_policy, resolve_queue
from rmqkit.errors import BrokerUnavailable, DataError
from rmqkit.names import is_parking_name
from rmqkit.parking.hints import limit_fix
from rmqkit.topology.desired import policy_name


async def check_browsable(
    api: ManagementClient,
    queue: str,
    broker_version: tuple[int, int, int],
    *,
    missing: str | None = None,
) -> dict[str, Any]:
    """Refuse (DataError, exit 65) a queue that browsing could damage; returns its API object.
    ``missing``: what to do if the queue does not exist (added to that error)."""
    try:
        found = await api.queue(queue)
    except BrokerUnavailable as exc:
        raise BrokerUnavailable(
            f"{exc} (parking commands read the queue's delivery limit through the management API "
            "before browsing, since browsing a queue that has one can drop messages)"
        ) from None
    if found is None:
        raise DataError(
            f"parking queue {queue!r} does not exist in vhost {api.vhost!r}"
            + (f" — {missing}" if missing else "")
        )
    qtype = found.get("type", "classic")
    if qtype == "stream":
        raise DataError(f"{queue!r} is a stream: streams cannot be browsed with acks or replayed")
    policies, operator_policies = await asyncio.gather(api.policies(), api.operator_policies())
    effective = resolve_queue(found, policies, operator_policies, broker_version)
    # A work queue: browsing it would hold back (and, with a delivery limit, spend attempts
    # of) messages its consumers are waiting for.
    refuse_work_queue(queue, effective)
    if qtype != "quorum":
        return dict(found)
    limit, source = _limit_of(effective)
    if limit is not None:
        # rmqkit's own policy for the queue, if declared: a user policy in effect over it is
        # one `rmqkit declare` refuses to compete with.
        ours = next((as_policy(p) for p in policies if p.get("name") == policy_name(queue)), None)
        fix = limit_fix(queue, source, api.vhost, effective.policy, broker_version, ours=ours)
        raise DataError(
            f"parking queue {queue!r} has a delivery limit of {limit} (from {source}): browsing "
            "returns messages to the queue, each return counts as a delivery, and at the limit "
            f"they are dropped or dead-lettered — fix: {fix}"
        )
    return dict(found)


async def _resolved(
    api: ManagementClient, found: dict[str, Any], broker_version: tuple[int, int, int]
) -> Effective:
    policies, operator_policies = await asyncio.gather(api.policies(), api.operator_policies())
    return resolve_queue(found, policies, operator_policies, broker_version)


def refuse_work_queue(queue: str, effective: Effective) -> None:
    """DataError (65) if ``queue`` is a work queue: it dead-letters into its parking queue."""
    parking = effective.settings.get("dead-letter-routing-key")
    if isinstance(parking, str) and parking != queue and is_parking_name(parking):
        raise DataError(
            f"{queue!r} is a work queue (it dead-letters to {parking!r}), not a parking queue — "
            f"did you mean {parking!r}?"
        )


async def check_import_target(
    api: ManagementClient, queue: str, broker_version: tuple[int, int, int]
) -> None:
    """Refuse (DataError, 65) importing parked messages into a work queue: its consumers would
    get the whole lane at once, unselected, park headers and all. A missing queue passes
    (the import's own AMQP check names it)."""
    found = await api.queue(queue)
    if found is not None:
        refuse_work_queue(queue, await _resolved(api, found, broker_version))


def _delivery_limit(
    queue: dict[str, Any],
    policies: list[dict[str, Any]],
    operator_policies: list[dict[str, Any]],
    version: tuple[int, int, int],
) -> tuple[int | None, str]:
    """The delivery limit the broker enforces on ``queue`` (None: none) and where it comes
    from, by the one resolver doctor and plan use (worked out from the policy lists, since the
    management API's ``effective_policy_definition`` lags a policy change)."""
    return _limit_of(resolve_queue(queue, policies, operator_policies, version))


def _limit_of(found: Effective) -> tuple[int | None, str]:
    source = found.delivery_limit_source
    if source == "argument":
        source = "its x-delivery-limit argument"
    elif source == DEFAULT_SOURCE_4X:
        source = "the 4.x default for quorum queues"
    return found.delivery_limit, source


__all__ = ["check_browsable", "check_import_target", "refuse_work_queue"]

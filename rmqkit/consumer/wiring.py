"""What the broker's declared objects say about one work queue, and whether they drop messages.

A consumer relies on wiring it does not own: a wait queue must dead-letter back to the work queue
when its TTL expires, the work queue must dead-letter what it gives up on (delivery limit, TTL,
length limit) into its parking queue, and the parking queue must keep what it holds. Queues can
exist and still be wired wrong: only one user policy applies to a queue (the highest priority), so
a policy that sets only ``message-ttl`` on the wait queues silently removes their way back, and a
message that failed once is dropped when its wait ends (issue 9, finding 13).

``check_wiring`` works this out from the settings *in effect*, with the same resolver `doctor`
and `status` use (``rmqkit.broker.snapshot``: arguments, the applying policy and operator policy by
the broker's precedence rules, and dead-letter targets through exchanges and bindings), and
refuses (ConfigError, exit 78) with one line naming what would drop or misroute messages.
``policy_from_snapshot`` reads a work queue's parking target and retry tiers from the same
snapshot when consume runs without ``--topology``.

``queue_identity`` and ``identity_changes`` compare a queue with itself over time: a consumer
records what each queue it serves was declared as when it started, and a queue deleted and
declared again with other arguments (a classic queue where a quorum one with a delivery limit
was) is not consumed until an operator puts it back or restarts the consumer to accept it.
"""

from __future__ import annotations

import asyncio
import logging

from rmqkit.broker.management import ManagementClient, management
from rmqkit.broker.snapshot import (
    QUORUM_DEFAULT_DELIVERY_LIMIT_4X,
    QueueView,
    Snapshot,
    applying_policy,
    number,
    read_snapshot,
)
from rmqkit.consumer.config import DEFAULT_MAX_ATTEMPTS
from rmqkit.consumer.policy import QueuePolicy
from rmqkit.durations import parse_duration_ms
from rmqkit.errors import ConfigError, RmqkitError
from rmqkit.names import slot_text, wait_delay_ms
from rmqkit.settings import Settings
from rmqkit.topology import retry_engine

log = logging.getLogger("rmqkit.consumer")

QueueIdentity = dict[str, object]
"""What a queue was declared as: type, durable, auto_delete, exclusive and x-arguments."""

__all__ = [
    "QueueIdentity",
    "check_wiring",
    "consumer_timeout_s",
    "identity_changes",
    "policy_from_snapshot",
    "queue_identity",
    "read_identity",
    "read_wiring",
    "wiring_warnings",
]


async def read_wiring(api: ManagementClient) -> Snapshot:
    """The vhost's queues, policies, exchanges and bindings (one management API snapshot)."""
    return await read_snapshot(api)


def policy_from_snapshot(
    snapshot: Snapshot, queue: str, max_attempts: int | None
) -> tuple[QueuePolicy, float | None]:
    """The work queue's parking target and wait tiers as the broker's declared objects say.

    Returns the policy and the queue's consumer timeout in seconds if a policy or argument sets
    one (3.12+). Wait queues are the queues named ``<queue>.wait.<delay>[.slot-<delay>]``; one
    that does not dead-letter back is not a tier, and ``check_wiring`` refuses it.
    """
    work = _work_queue(snapshot, queue)
    parking = work.dead_letter_routing_key
    if work.dead_letter_exchange != "" or not parking:
        raise ConfigError(
            f"queue {queue!r} has no parking queue (it must dead-letter through the default "
            "exchange to one) — declare it with rmqkit declare, or pass --topology"
        )
    broker = _broker_retry_delays(snapshot, queue)
    if broker:
        policy = QueuePolicy(
            queue=queue,
            parking_queue=parking,
            retry_delays_ms=broker,
            max_attempts=max_attempts or DEFAULT_MAX_ATTEMPTS,
            wait_queues=(),
            broker_retry=True,
        )
        return policy, consumer_timeout_s(snapshot, queue)
    tiers: dict[int, list[str]] = {}
    for name, view in snapshot.queues.items():
        delay = wait_tier_of(name, queue)
        if delay is not None and queue in (snapshot.dead_letter_targets(view) or []):
            tiers.setdefault(delay, []).append(name)
    delays = sorted(tiers)
    return (
        QueuePolicy(
            queue=queue,
            parking_queue=parking,
            retry_delays_ms=tuple(delays),
            max_attempts=max_attempts or DEFAULT_MAX_ATTEMPTS,
            wait_queues=tuple(tuple(sorted(tiers[d], key=_slot_order)) for d in delays),
        ),
        consumer_timeout_s(snapshot, queue),
    )


def _broker_retry_delays(snapshot: Snapshot, queue: str) -> tuple[int, ...]:
    """The delays of the work queue's own delayed retry (RabbitMQ 4.3: a policy or argument
    ``delayed-retry-type`` that delays counted returns), up to where they stop growing; ()
    when the broker does not retry it (wait queues, or none)."""
    view = snapshot.queues.get(queue)
    if view is None or view.settings.get(retry_engine.TYPE_KEY) not in ("failed", "all"):
        return ()
    low = number(view.settings.get(retry_engine.MIN_KEY))
    if low is None or low <= 0:
        return ()
    high = number(view.settings.get(retry_engine.MAX_KEY)) or low
    steps = max(1, min(-(-int(high) // int(low)), 100))
    return tuple(retry_engine.linear_delays(int(low), int(max(high, low)), steps))


def consumer_timeout_s(snapshot: Snapshot, queue: str) -> float | None:
    """The work queue's own consumer timeout in seconds (3.12+: the ``x-consumer-timeout``
    argument or a policy's ``consumer-timeout``, the lower one in effect), or None when neither
    sets one. The broker-wide default (``consumer_timeout`` in rabbitmq.conf, 30 min unless
    changed) cannot be read through the management API; callers assume the default then."""
    view = snapshot.queues.get(queue)
    if view is None:
        return None
    value = number(view.settings.get("consumer-timeout"))
    return value / 1000 if value is not None and value > 0 else None


def queue_identity(view: dict[str, object]) -> QueueIdentity:
    """What ``view`` (``GET /api/queues/{vhost}/{name}``) says the queue was declared as: the
    properties fixed at declaration, not the ones a policy changes (policies are checked on
    their own, at start-up, by ``check_wiring``)."""
    arguments = view.get("arguments")
    identity: QueueIdentity = {
        key: view.get(key) for key in ("type", "durable", "auto_delete", "exclusive")
    }
    if isinstance(arguments, dict):
        identity.update({f"argument {k}": v for k, v in sorted(arguments.items())})
    return identity


async def read_identity(settings: Settings, queue: str, timeout_s: float) -> QueueIdentity | None:
    """``queue_identity`` of ``queue`` as the management API shows it now; None when it cannot
    be read within ``timeout_s`` (the API unreachable, the queue gone)."""
    try:
        async with asyncio.timeout(timeout_s):
            async with management(settings) as api:
                view = await api.queue(queue)
    except (RmqkitError, TimeoutError, OSError) as exc:
        log.debug("reading queue %r through the management API: %s", queue, exc)
        return None
    return None if view is None else queue_identity(view)


def identity_changes(before: QueueIdentity, after: QueueIdentity) -> list[str]:
    """What differs between two identities of one queue, one phrase each
    (``x-queue-type quorum → classic``, ``x-delivery-limit 5 → none``)."""
    changes = []
    for key in sorted(set(before) | set(after)):
        old, new = before.get(key), after.get(key)
        if old != new:
            name = key.removeprefix("argument ")
            changes.append(f"{name} {_shown(old)} → {_shown(new)}")
    return changes


def _shown(value: object) -> str:
    if value is None:
        return "none"
    return str(value).lower() if isinstance(value, bool) else str(value)


def wait_tier_of(name: str, queue: str) -> int | None:
    """The tier delay (ms) of ``name`` if it is named as a wait queue of ``queue``, else None."""
    return wait_delay_ms(name, queue)


def _slot_order(name: str) -> tuple[int, str]:
    ttl = slot_text(name)
    if ttl is None:
        return (1 << 62, name)
    try:
        return (parse_duration_ms(ttl), name)
    except ValueError:
        return (1 << 61, name)


def _work_queue(snapshot: Snapshot, queue: str) -> QueueView:
    work = snapshot.queues.get(queue)
    if work is None:
        raise ConfigError(
            f"queue {queue!r} does not exist in vhost {snapshot.vhost!r} — declare it first "
            "(rmqkit declare FILE) or pass --topology"
        )
    return work


def check_wiring(snapshot: Snapshot, policy: QueuePolicy, *, discover_wait: bool = False) -> None:
    """Refuse (ConfigError, exit 78) wiring that would drop or misroute this consumer's messages.

    Checks, on the settings in effect: every wait queue has a TTL and dead-letters back to the
    work queue; the work queue, if it can dead-letter at all (a delivery limit, a TTL, a length
    limit that drops), dead-letters into its parking queue; the parking queue does not drop what
    it holds (a TTL or a dropping length limit with nowhere to dead-letter). ``discover_wait``:
    also check every queue named as a wait queue of the work queue (consume without
    ``--topology``, where those are the tiers; one wired wrong may already hold messages).
    """
    work = _work_queue(snapshot, policy.queue)
    problems: list[str] = []
    waits = list(policy.all_wait_queues)
    if discover_wait:
        waits += sorted(
            n for n in snapshot.queues if n not in waits and wait_tier_of(n, policy.queue)
        )
    for name in waits:
        view = snapshot.queues.get(name)
        if view is None:
            problems.append(f"wait queue {name!r} does not exist (retries would be returned)")
            continue
        problem = _wait_queue_problem(snapshot, view, policy.queue)
        if problem:
            problems.append(problem)
    parking = snapshot.queues.get(policy.parking_queue)
    if parking is None:
        problems.append(f"parking queue {policy.parking_queue!r} does not exist")
    else:
        problem = _parking_problem(snapshot, parking)
        if problem:
            problems.append(problem)
    problem = _work_queue_problem(snapshot, work, policy.parking_queue)
    if problem:
        problems.append(problem)
    if problems:
        more = f"; {len(problems) - 1} more problem(s) like it" if len(problems) > 1 else ""
        raise ConfigError(
            f"refusing to consume {policy.queue!r}: {problems[0]}{more} — fix the policies or "
            "run `rmqkit declare` for the topology, then check with `rmqkit doctor`"
        )


def wiring_warnings(snapshot: Snapshot, policy: QueuePolicy) -> list[str]:
    """Wiring that loses messages only in a pinch, for the start-up warnings (not a refusal).

    A bounded parking queue (``overflow=reject-publish``) refuses when full. The consumer then
    puts the original back counting toward the delivery limit (rmqkit.consumer.refusals), and
    the broker dead-letters it over the limit: at-least-once (quorum, ``dead-letter-strategy``
    ``at-least-once`` and ``overflow`` ``reject-publish`` on the work queue) keeps it until
    parking has room; at-most-once drops it.
    """
    work = snapshot.queues.get(policy.queue)
    parking = snapshot.queues.get(policy.parking_queue)
    if work is None or parking is None:
        return []
    bounded = "max-length" in parking.settings or "max-length-bytes" in parking.settings
    at_least_once = (
        work.type == "quorum"
        and work.settings.get("dead-letter-strategy") == "at-least-once"
        and work.settings.get("overflow") == "reject-publish"
    )
    if not bounded or at_least_once:
        return []
    return [
        f"parking queue {parking.name!r} is bounded and work queue {work.name!r} dead-letters "
        "at-most-once: while parking is full, a message the broker dead-letters (delivery "
        "limit) is dropped — give the work queue dead-letter-strategy at-least-once with "
        "overflow reject-publish (rmqkit declare does), or unbound the parking queue"
    ]


def _policy_note(snapshot: Snapshot, view: QueueView) -> str:
    """Which user policy is in effect on the queue (only one applies: the highest priority)."""
    found = applying_policy(snapshot.policies, view.name, view.type)
    if found is None:
        return "no policy applies to it"
    return (
        f"the one policy in effect on it is {found.get('name')!r}, priority "
        f"{found.get('priority', 0)}"
    )


def _targets_text(targets: list[str]) -> str:
    return ", ".join(repr(t) for t in targets)


def _wait_queue_problem(snapshot: Snapshot, view: QueueView, work: str) -> str | None:
    targets = snapshot.dead_letter_targets(view)
    if targets is None:
        return (
            f"wait queue {view.name!r} would drop its messages when their wait expires: it has "
            f"no dead-letter exchange ({_policy_note(snapshot, view)})"
        )
    if not targets:
        return (
            f"wait queue {view.name!r} would drop its messages when their wait expires: its "
            f"dead-letter exchange {view.dead_letter_exchange!r} routes them to no queue "
            f"({_policy_note(snapshot, view)})"
        )
    if work not in targets:
        return (
            f"wait queue {view.name!r} dead-letters to {_targets_text(targets)}, not back to "
            f"{work!r}: retried messages would not come back ({_policy_note(snapshot, view)})"
        )
    if "message-ttl" not in view.settings:
        return (
            f"wait queue {view.name!r} has no message TTL: retried messages would never come "
            f"back ({_policy_note(snapshot, view)})"
        )
    return None


def _drops_over_length(view: QueueView) -> bool:
    limited = "max-length" in view.settings or "max-length-bytes" in view.settings
    return limited and view.settings.get("overflow", "drop-head") == "drop-head"


def _work_queue_problem(snapshot: Snapshot, view: QueueView, parking: str) -> str | None:
    limit = view.settings.get("delivery-limit")
    if limit is None and view.type == "quorum" and snapshot.version >= (4, 0, 0):
        limit = QUORUM_DEFAULT_DELIVERY_LIMIT_4X
    reasons = []
    if isinstance(limit, int) and limit >= 0:
        reasons.append(f"over its delivery limit {limit}")
    if "message-ttl" in view.settings:
        reasons.append(f"older than its message TTL {view.settings['message-ttl']} ms")
    if _drops_over_length(view):
        reasons.append("over its length limit")
    if not reasons:
        return None  # it never dead-letters: nothing to route
    what = " or ".join(reasons)
    targets = snapshot.dead_letter_targets(view)
    if targets is None:
        return (
            f"work queue {view.name!r} would drop messages {what}: it has no dead-letter "
            f"exchange ({_policy_note(snapshot, view)})"
        )
    if not targets:
        return (
            f"work queue {view.name!r} would drop messages {what}: its dead-letter exchange "
            f"{view.dead_letter_exchange!r} routes them to no queue "
            f"({_policy_note(snapshot, view)})"
        )
    if parking not in targets:
        return (
            f"work queue {view.name!r} dead-letters messages {what} to {_targets_text(targets)}, "
            f"not to its parking queue {parking!r} ({_policy_note(snapshot, view)})"
        )
    return None


def _parking_problem(snapshot: Snapshot, view: QueueView) -> str | None:
    reasons = []
    if "message-ttl" in view.settings:
        reasons.append(f"after its message TTL {view.settings['message-ttl']} ms")
    if _drops_over_length(view):
        reasons.append("over its length limit (overflow drop-head)")
    if not reasons or snapshot.dead_letter_targets(view):
        return None
    return (
        f"parking queue {view.name!r} would drop parked messages "
        f"{' or '.join(reasons)} ({_policy_note(snapshot, view)})"
    )

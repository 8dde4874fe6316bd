"""check_wiring and policy_from_snapshot over management API snapshots (no broker; the real
broker cases are in tests/integration/test_consume_safety.py)."""

from __future__ import annotations

from typing import Any

import pytest

from rmqkit.broker.snapshot import Snapshot, effective_queue
from rmqkit.consumer.policy import QueuePolicy
from rmqkit.consumer.wiring import check_wiring, policy_from_snapshot, wait_tier_of
from rmqkit.errors import ConfigError, ExitCode

WORK, PARKING, WAIT = "jobs.work", "jobs.work.parking", "jobs.work.wait.1s"


def _policy(
    name: str, pattern: str, definition: dict[str, Any], priority: int = 10
) -> dict[str, Any]:
    return {
        "name": name,
        "pattern": pattern,
        "apply-to": "queues",
        "priority": priority,
        "definition": definition,
    }


RMQKIT_POLICIES = [
    _policy(
        "rmqkit.jobs.work",
        r"^jobs\.work$",
        {"dead-letter-exchange": "", "dead-letter-routing-key": PARKING, "delivery-limit": 3},
    ),
    _policy(
        "rmqkit.jobs.work.wait.1s",
        r"^jobs\.work\.wait\.1s$",
        {"dead-letter-exchange": "", "dead-letter-routing-key": WORK, "message-ttl": 1000},
    ),
    _policy("rmqkit.jobs.work.parking", r"^jobs\.work\.parking$", {"overflow": "reject-publish"}),
]


def snapshot(
    policies: list[dict[str, Any]],
    *,
    extra: tuple[str, ...] = (),
    version: tuple[int, int, int] = (3, 10, 8),
) -> Snapshot:
    names = (WORK, PARKING, WAIT, *extra)
    raws = [{"name": n, "type": "quorum", "arguments": {"x-queue-type": "quorum"}} for n in names]
    return Snapshot(
        vhost="/",
        version=version,
        queues={str(r["name"]): effective_queue(r, policies, [], version) for r in raws},
        exchanges={},
        bindings=[],
        policies=policies,
        operator_policies=[],
        vhost_stats=None,
    )


POLICY = QueuePolicy(
    queue=WORK,
    parking_queue=PARKING,
    retry_delays_ms=(1000,),
    max_attempts=4,
    wait_queues=((WAIT,),),
)


def refusal(snap: Snapshot, *, discover_wait: bool = False) -> str:
    with pytest.raises(ConfigError) as caught:
        check_wiring(snap, POLICY, discover_wait=discover_wait)
    assert caught.value.exit_code == ExitCode.CONFIG
    message = str(caught.value)
    assert "\n" not in message
    return message


def test_the_declared_wiring_passes_and_gives_the_tiers() -> None:
    snap = snapshot(RMQKIT_POLICIES)
    check_wiring(snap, POLICY, discover_wait=True)
    policy, timeout = policy_from_snapshot(snap, WORK, None)
    assert policy.parking_queue == PARKING
    assert policy.wait_queues == ((WAIT,),) and policy.retry_delays_ms == (1000,)
    assert timeout is None


def test_a_higher_priority_ttl_only_policy_on_the_wait_queues_is_refused() -> None:
    ttl_only = _policy("ttl-only", r"^jobs\.work\.wait\.", {"message-ttl": 1000}, priority=20)
    snap = snapshot([*RMQKIT_POLICIES, ttl_only])
    message = refusal(snap)
    assert f"wait queue {WAIT!r} would drop its messages when their wait expires" in message
    assert "'ttl-only', priority 20" in message
    # Without --topology the broken queue is no tier, but it is refused all the same.
    policy, _ = policy_from_snapshot(snap, WORK, None)
    assert policy.wait_queues == ()
    assert WAIT in refusal(snap, discover_wait=True)


def test_a_wait_queue_routing_elsewhere_or_without_ttl_is_refused() -> None:
    elsewhere = _policy(
        "elsewhere",
        r"^jobs\.work\.wait\.",
        {"dead-letter-exchange": "", "dead-letter-routing-key": PARKING, "message-ttl": 1000},
        priority=20,
    )
    assert "not back to 'jobs.work'" in refusal(snapshot([*RMQKIT_POLICIES, elsewhere]))
    no_ttl = _policy(
        "no-ttl",
        r"^jobs\.work\.wait\.",
        {"dead-letter-exchange": "", "dead-letter-routing-key": WORK},
        priority=20,
    )
    assert "has no message TTL" in refusal(snapshot([*RMQKIT_POLICIES, no_ttl]))


def test_a_work_queue_that_would_drop_over_its_delivery_limit_is_refused() -> None:
    limit_only = _policy("limit-only", r"^jobs\.work$", {"delivery-limit": 3}, priority=20)
    message = refusal(snapshot([*RMQKIT_POLICIES, limit_only]))
    assert "work queue 'jobs.work' would drop messages over its delivery limit 3" in message
    # On 4.x a quorum queue has a delivery limit (20) even when nothing sets one.
    bare = _policy("bare", r"^jobs\.work$", {"max-length": 10, "overflow": "reject-publish"}, 20)
    check_wiring(snapshot([*RMQKIT_POLICIES, bare]), POLICY)
    assert "delivery limit 20" in refusal(snapshot([*RMQKIT_POLICIES, bare], version=(4, 3, 6)))


def test_a_parking_queue_that_drops_is_refused_and_a_missing_one_too() -> None:
    ttl = _policy("parking-ttl", r"^jobs\.work\.parking$", {"message-ttl": 60000}, priority=20)
    assert "parking queue 'jobs.work.parking' would drop parked messages after its message TTL" in (
        refusal(snapshot([*RMQKIT_POLICIES, ttl]))
    )
    snap = snapshot(RMQKIT_POLICIES)
    del snap.queues[PARKING]
    assert "parking queue 'jobs.work.parking' does not exist" in refusal(snap)


def test_wait_tier_names() -> None:
    assert wait_tier_of("jobs.work.wait.1s", WORK) == 1000
    assert wait_tier_of("jobs.work.wait.2s.slot-1500ms", WORK) == 2000
    assert wait_tier_of("jobs.work.wait.soon", WORK) is None
    assert wait_tier_of("jobs.work.parking", WORK) is None

"""The one resolver of a queue's effective settings (``rmqkit.broker.policies``), row by row.

Rows marked "seen" were compared with the broker's ``effective_policy_definition`` and 4.x's
``delivery_limit`` on 3.10.8, 4.0.5 and 4.3.6 (``tests/integration/test_policies_live.py``
re-checks them). ``test_plan_and_doctor_agree`` is the property of issue 11: plan and doctor
(and the parking commands' delivery-limit check) see the same settings for the same queue,
arguments, policies and version. On the old code (7cb9a46) this file fails to import (no
``rmqkit.broker.policies``); the rows that show the old rules' disagreement through their
public functions are in test_plan.py and test_doctor_checks.py.
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from rmqkit.broker.policies import Policy, applying_policy, resolve, resolve_queue
from rmqkit.broker.snapshot import effective_queue
from rmqkit.parking.guards import _delivery_limit
from rmqkit.topology.desired import MANAGED_KEYS
from rmqkit.topology.plan import LiveState, queue_settings

V310, V40, V43 = (3, 10, 8), (4, 0, 5), (4, 3, 6)


def pol(name: str, **definition: Any) -> Policy:
    return Policy(name, ".*", {k.replace("_", "-"): v for k, v in definition.items()})


# (id, queue type, version, arguments, policy, operator policy, expected settings,
#  expected sources for some keys, enforced delivery limit)
ROWS: list[tuple[str, str, Any, dict[str, Any], Any, Any, dict[str, Any], dict[str, str], Any]] = [
    (
        "numbers: the operator's lower ttl wins (seen)",
        "quorum",
        V310,
        {"x-message-ttl": 1000},
        pol("p", message_ttl=500),
        pol("op", message_ttl=300),
        {"message-ttl": 300},
        {"message-ttl": "operator policy 'op'"},
        None,
    ),
    (
        "numbers: a lower argument wins",
        "classic",
        V43,
        {"x-max-length": 5},
        pol("p", max_length=10),
        pol("op", max_length=20),
        {"max-length": 5},
        {"max-length": "argument"},
        None,
    ),
    (
        "dead-letter keys: the argument wins over the policy",
        "quorum",
        V310,
        {"x-dead-letter-exchange": "a", "x-dead-letter-routing-key": "k"},
        pol("p", dead_letter_exchange="b", dead_letter_routing_key="j", dead_letter_strategy="x"),
        None,
        {"dead-letter-exchange": "a", "dead-letter-routing-key": "k", "dead-letter-strategy": "x"},
        {"dead-letter-exchange": "argument", "dead-letter-strategy": "policy 'p'"},
        None,
    ),
    (
        "overflow on quorum: the policy wins",
        "quorum",
        V310,
        {"x-overflow": "reject-publish"},
        pol("p", overflow="drop-head"),
        None,
        {"overflow": "drop-head"},
        {"overflow": "policy 'p'"},
        None,
    ),
    (
        "overflow on classic: the argument wins",
        "classic",
        V43,
        {"x-overflow": "reject-publish"},
        pol("p", overflow="drop-head"),
        None,
        {"overflow": "reject-publish"},
        {"overflow": "argument"},
        None,
    ),
    (
        "overflow on 4.x: the operator's value over the policy, then over the argument (seen)",
        "quorum",
        V43,
        {"x-overflow": "reject-publish"},
        pol("p", overflow="drop-head"),
        pol("op", overflow="reject-publish"),
        {"overflow": "reject-publish"},
        {"overflow": "operator policy 'op'"},
        20,
    ),
    ("4.x default limit for quorum queues (seen)", "quorum", V40, {}, None, None, {}, {}, 20),
    ("3.x has no default limit", "quorum", V310, {}, None, None, {}, {}, None),
    ("no limit on classic queues", "classic", V43, {}, None, None, {}, {}, None),
    (
        "4.x: argument -1 loses to policy 5 (seen)",
        "quorum",
        V43,
        {"x-delivery-limit": -1},
        pol("p", delivery_limit=5),
        None,
        {"delivery-limit": 5},
        {},
        5,
    ),
    (
        "4.x: policy -1 loses to operator 5 in the merge (seen)",
        "quorum",
        V40,
        {},
        pol("p", delivery_limit=-1),
        pol("op", delivery_limit=5),
        {"delivery-limit": 5},
        {"delivery-limit": "operator policy 'op'"},
        5,
    ),
    (
        "4.x: operator -1 loses to policy 5 in the merge (seen)",
        "quorum",
        V43,
        {},
        pol("p", delivery_limit=5),
        pol("op", delivery_limit=-1),
        {"delivery-limit": 5},
        {"delivery-limit": "policy 'p'"},
        5,
    ),
    (
        "4.x: argument 3 beats policy -1 (seen)",
        "quorum",
        V43,
        {"x-delivery-limit": 3},
        pol("p", delivery_limit=-1),
        None,
        {"delivery-limit": 3},
        {"delivery-limit": "argument"},
        3,
    ),
    (
        "4.x: argument 3, policy -1, operator 5: 3 (old view: 5, old plan: -1; seen)",
        "quorum",
        V43,
        {"x-delivery-limit": 3},
        pol("p", delivery_limit=-1),
        pol("op", delivery_limit=5),
        {"delivery-limit": 3},
        {"delivery-limit": "argument"},
        3,
    ),
    (
        "lowest of argument 7, policy 4, operator 6 (seen)",
        "quorum",
        V43,
        {"x-delivery-limit": 7},
        pol("p", delivery_limit=4),
        pol("op", delivery_limit=6),
        {"delivery-limit": 4},
        {"delivery-limit": "policy 'p'"},
        4,
    ),
    (
        "4.x: -1 alone means no limit",
        "quorum",
        V43,
        {},
        pol("p", delivery_limit=-1),
        None,
        {"delivery-limit": -1},
        {},
        None,
    ),
    (
        "3.x: the lower limit, as min",
        "quorum",
        V310,
        {"x-delivery-limit": 7},
        pol("p", delivery_limit=4),
        None,
        {"delivery-limit": 4},
        {},
        4,
    ),
    (
        "argument-only keys: queue type dropped, single-active-consumer from the argument",
        "quorum",
        V310,
        {"x-queue-type": "quorum", "x-single-active-consumer": True},
        pol("p", single_active_consumer=False, queue_type="classic"),
        None,
        {"single-active-consumer": True},
        {"single-active-consumer": "argument"},
        None,
    ),
    (
        "streams: the policy wins",
        "stream",
        V43,
        {"x-max-length-bytes": 100},
        pol("p", max_length_bytes=1000),
        None,
        {"max-length-bytes": 1000},
        {},
        None,
    ),
    (
        "consumer-timeout: the lower (seen: 4.3 shows the policy's)",
        "quorum",
        V43,
        {"x-consumer-timeout": 60000},
        pol("p", consumer_timeout=30000),
        None,
        {"consumer-timeout": 30000},
        {"consumer-timeout": "policy 'p'"},
        20,
    ),
]


@pytest.mark.parametrize(
    ("qtype", "version", "args", "policy", "operator", "expected", "sources", "limit"),
    [row[1:] for row in ROWS],
    ids=[row[0] for row in ROWS],
)
def test_resolve(
    qtype: str,
    version: tuple[int, int, int],
    args: dict[str, Any],
    policy: Policy | None,
    operator: Policy | None,
    expected: dict[str, Any],
    sources: dict[str, str],
    limit: int | None,
) -> None:
    found = resolve(qtype, args, policy, operator, version)
    assert found.settings == expected
    assert {k: found.sources[k] for k in sources} == sources
    assert found.delivery_limit == limit


def test_only_the_highest_priority_matching_policy_applies() -> None:
    policies = [
        {"name": "broad", "pattern": ".*", "priority": 1, "definition": {"message-ttl": 5}},
        {"name": "narrow", "pattern": "^orders", "priority": 2, "definition": {"max-length": 9}},
        {"name": "exchanges-only", "pattern": ".*", "priority": 9, "apply-to": "exchanges"},
        {
            "name": "classic-only",
            "pattern": ".*",
            "priority": 9,
            "apply-to": "classic_queues",
        },
        {"name": "bad-regex", "pattern": "(", "priority": 99},
    ]
    found = applying_policy(policies, "orders.work", "quorum")
    assert found is not None and found.name == "narrow"
    assert applying_policy(policies, "orders.work", "classic").name == "classic-only"  # type: ignore[union-attr]
    assert applying_policy(policies, "other", "quorum").name == "broad"  # type: ignore[union-attr]
    assert applying_policy(policies, "other", None).name == "exchanges-only"  # type: ignore[union-attr]
    # Equal priorities: the broker picks either; the resolver the greater name, every time.
    tie = [{"name": n, "pattern": ".*", "priority": 1} for n in ("b", "c", "a")]
    assert applying_policy(tie, "q", "quorum").name == "c"  # type: ignore[union-attr]


def test_operator_policies_are_picked_like_user_policies_not_merged() -> None:
    """Only the highest-priority operator policy applies (rabbit_policy:match_op); the old plan
    merged every matching one with dict.update."""
    ops = [
        {"name": "low", "pattern": ".*", "priority": 0, "definition": {"message-ttl": 100}},
        {"name": "high", "pattern": ".*", "priority": 5, "definition": {"max-length": 10}},
    ]
    raw = {"name": "q", "type": "quorum", "arguments": {}}
    found = resolve_queue(raw, [], ops, V310)
    assert found.settings == {"max-length": 10}
    assert found.operator_policy is not None and found.operator_policy.name == "high"


# --- plan and doctor agree ------------------------------------------------------------------
NAMES = ["orders.work", "orders.work.wait.5s", "orders.parking", "other"]
PATTERNS = ["^orders\\.", "work$", ".*", "^other$", "parking", "("]
NUMERIC = {"message-ttl", "max-length", "max-length-bytes", "expires"}
STRINGS = {
    "dead-letter-exchange": ["", "dlx", "orders"],
    "dead-letter-routing-key": ["orders.parking", "x"],
    "dead-letter-strategy": ["at-least-once", "at-most-once"],
    "overflow": ["drop-head", "reject-publish"],
    "delayed-retry-type": ["failed", "returned"],
}
DELAYS = {"delayed-retry-min", "delayed-retry-max"}  # retry_engine = "broker" (ms)


def _value(key: str) -> st.SearchStrategy[Any]:
    if key in NUMERIC:
        return st.integers(min_value=0, max_value=5)
    if key in DELAYS:
        return st.integers(min_value=1, max_value=5)
    if key == "delivery-limit":
        return st.integers(min_value=-1, max_value=5)
    return st.sampled_from(STRINGS[key])


def _definition(keys: list[str]) -> st.SearchStrategy[dict[str, Any]]:
    return st.dictionaries(st.sampled_from(keys), st.none(), max_size=4).flatmap(
        lambda chosen: st.fixed_dictionaries({k: _value(k) for k in chosen})
    )


def _policies(keys: list[str], prefix: str) -> st.SearchStrategy[list[dict[str, Any]]]:
    one = st.fixed_dictionaries(
        {
            "pattern": st.sampled_from(PATTERNS),
            "priority": st.integers(min_value=0, max_value=3),
            "apply-to": st.sampled_from(["all", "queues", "quorum_queues", "classic_queues"]),
            "definition": _definition(keys),
        }
    )
    return st.lists(one, max_size=4).map(
        lambda items: [{"name": f"{prefix}{i}", **p} for i, p in enumerate(items)]
    )


OPERATOR_KEYS = sorted(NUMERIC | {"delivery-limit"})


@settings(max_examples=300, deadline=None)
@given(
    name=st.sampled_from(NAMES),
    qtype=st.sampled_from(["quorum", "classic"]),
    arguments=_definition(list(MANAGED_KEYS)),
    policies=_policies(list(MANAGED_KEYS), "p"),
    operator=_policies(OPERATOR_KEYS, "op"),
    version=st.sampled_from([V310, V40, V43]),
)
def test_plan_and_doctor_agree(
    name: str,
    qtype: str,
    arguments: dict[str, Any],
    policies: list[dict[str, Any]],
    operator: list[dict[str, Any]],
    version: tuple[int, int, int],
) -> None:
    raw = {
        "name": name,
        "type": qtype,
        "arguments": {"x-queue-type": qtype, **{"x-" + k: v for k, v in arguments.items()}},
    }
    view = effective_queue(raw, policies, operator, version)
    doctor = view.settings
    # Parking's browse check sees the same enforced limit as doctor.
    assert _delivery_limit(raw, policies, operator, version)[0] == view.delivery_limit
    live = LiveState(
        queues={name: raw},
        exchanges={},
        bindings=[],
        policies={p["name"]: p for p in policies},
        operator_policies=operator,
        version=version,
    )
    plan = queue_settings(live, name)
    assert plan == {k: v for k, v in doctor.items() if k in MANAGED_KEYS}

"""compute_plan over hand-built live states: each conflict rule, without a broker."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rmqkit.topology.expand import expand
from rmqkit.topology.model import load_topology
from rmqkit.topology.plan import Change, LiveState, compute_plan, queue_settings

ROOT = Path(__file__).resolve().parents[2]
ORDERS = load_topology(ROOT / "topologies" / "orders.toml")


def _live(**kwargs: Any) -> LiveState:
    base: dict[str, Any] = {"queues": {}, "exchanges": {}, "bindings": [], "policies": {}}
    base.update(kwargs)
    return LiveState(**base)


def _find(changes: list[Change], kind: str, name: str) -> Change:
    return next(c for c in changes if c.kind == kind and c.name == name)


def _quorum(name: str, args: dict[str, Any] | None = None) -> dict[str, Any]:
    return {
        "name": name,
        "type": "quorum",
        "durable": True,
        "arguments": {"x-queue-type": "quorum", **(args or {})},
    }


def test_empty_broker_means_create_everything() -> None:
    plan = compute_plan(expand(ORDERS), _live(), source="f", vhost="/")
    assert plan.summary()["create"] == 46 and not plan.conflicts


def test_classic_queue_of_the_same_name_is_a_conflict() -> None:
    live = _live(
        queues={
            "orders.work": {
                "name": "orders.work",
                "type": "classic",
                "durable": True,
                "arguments": {},
            }
        }
    )
    change = _find(
        compute_plan(expand(ORDERS), live, source="f", vhost="/").changes, "queue", "orders.work"
    )
    assert change.action == "conflict" and "classic" in change.detail and change.fix


def test_dead_letter_argument_beats_our_policy() -> None:
    live = _live(
        queues={"orders.work": _quorum("orders.work", {"x-dead-letter-exchange": "elsewhere"})}
    )
    change = _find(
        compute_plan(expand(ORDERS), live, source="f", vhost="/").changes, "queue", "orders.work"
    )
    assert change.action == "conflict"
    assert "dead-letter-exchange would be 'elsewhere'" in change.detail
    assert "does not exist" in change.detail  # 'elsewhere' is no exchange


def test_a_higher_limit_argument_is_harmless_a_lower_one_is_not() -> None:
    harmless = _live(queues={"orders.work": _quorum("orders.work", {"x-delivery-limit": 50})})
    plan = compute_plan(expand(ORDERS), harmless, source="f", vhost="/")
    assert _find(plan.changes, "queue", "orders.work").action == "in-sync"
    lower = _live(queues={"orders.work": _quorum("orders.work", {"x-max-length": 10})})
    plan = compute_plan(expand(ORDERS), lower, source="f", vhost="/")
    assert _find(plan.changes, "queue", "orders.work").action == "conflict"


def test_a_policy_with_higher_priority_shadows_ours() -> None:
    other = {
        "name": "ops",
        "pattern": "^orders\\.",
        "apply-to": "queues",
        "priority": 50,
        "definition": {"message-ttl": 1},
    }
    plan = compute_plan(expand(ORDERS), _live(policies={"ops": other}), source="f", vhost="/")
    shadowed = [c for c in plan.conflicts if c.kind == "queue"]
    assert len(shadowed) == 22
    assert "'ops'" in shadowed[0].detail and "policy_priority" in shadowed[0].fix
    # A policy for exchanges only does not matter.
    exchanges_only = {**other, "apply-to": "exchanges"}
    plan = compute_plan(
        expand(ORDERS), _live(policies={"ops": exchanges_only}), source="f", vhost="/"
    )
    assert not plan.conflicts


def test_arguments_mode_mismatch_is_the_406_conflict() -> None:
    live = _live(queues={"orders.work": _quorum("orders.work", {"x-delivery-limit": 3})})
    plan = compute_plan(expand(ORDERS, via="arguments"), live, source="f", vhost="/")
    change = _find(plan.changes, "queue", "orders.work")
    assert change.action == "conflict" and "406" in change.detail


def test_policy_change_and_orphans() -> None:
    desired = expand(ORDERS)
    ours = desired.policies[0]
    live = _live(
        policies={
            ours.name: {
                "name": ours.name,
                "pattern": ours.pattern,
                "apply-to": "queues",
                "priority": 10,
                "definition": {**ours.definition, "max-length": 5},
            },
            "rmqkit.orders.work.wait.9s": {"name": "rmqkit.orders.work.wait.9s"},
        },
        queues={"orders.work.wait.9s": _quorum("orders.work.wait.9s") | {"messages": 4}},
    )
    plan = compute_plan(desired, live, source="f", vhost="/")
    assert _find(plan.changes, "policy", ours.name).action == "change"
    orphan = _find(plan.changes, "queue", "orders.work.wait.9s")
    assert orphan.action == "orphan" and "4 message(s)" in orphan.detail
    assert _find(plan.changes, "policy", "rmqkit.orders.work.wait.9s").action == "orphan"


def test_exchange_type_mismatch() -> None:
    live = _live(
        exchanges={
            "orders": {
                "name": "orders",
                "type": "direct",
                "durable": True,
                "auto_delete": False,
                "internal": False,
                "arguments": {},
            }
        }
    )
    change = _find(
        compute_plan(expand(ORDERS), live, source="f", vhost="/").changes, "exchange", "orders"
    )
    assert change.action == "conflict" and "type is 'direct'" in change.detail


def test_precedence_rules() -> None:
    # numeric: lower wins; dead-letter keys: argument wins; overflow: policy wins (quorum)
    args = {"x-max-length": 5, "x-dead-letter-exchange": "a", "x-overflow": "drop-head"}
    definition = {"max-length": 9, "dead-letter-exchange": "b", "overflow": "reject-publish"}
    live = _live(
        queues={"q": _quorum("q", args)},
        policies={"p": {"name": "p", "pattern": "^q$", "definition": definition}},
        operator_policies=[{"name": "op", "pattern": "^q$", "definition": {"max-length": 3}}],
    )
    assert queue_settings(live, "q") == {
        "max-length": 3,
        "dead-letter-exchange": "a",
        "overflow": "reject-publish",
    }


def _operator(name: str, pattern: str, priority: int, **definition: Any) -> dict[str, Any]:
    return {
        "name": name,
        "pattern": pattern,
        "priority": priority,
        "apply-to": "queues",
        "definition": {k.replace("_", "-"): v for k, v in definition.items()},
    }


def test_only_the_highest_priority_operator_policy_applies() -> None:
    """The broker applies one operator policy (rabbit_policy:match_op), here the one that only
    raises nothing (delivery-limit 1000 > the file's 10). The old plan merged every matching
    operator policy with dict.update, so the lower-priority one's message-ttl 100 made a
    conflict that does not exist (old code: 'conflict')."""
    live = _live(
        operator_policies=[
            _operator("low", "^orders\\.work$", 0, message_ttl=100),
            _operator("high", "^orders\\.work$", 5, delivery_limit=1000),
        ]
    )
    change = _find(
        compute_plan(expand(ORDERS), live, source="f", vhost="/").changes, "queue", "orders.work"
    )
    assert change.action == "create", change.detail


def test_on_4x_an_operator_delivery_limit_beats_the_parking_queues_minus_one() -> None:
    """4.x resolves a negative limit against a positive one with max (policy -1 + operator 5
    gives 5, seen on 4.0.5 and 4.3.6), so a parking queue would get a limit of 5 and rmqkit
    would refuse to browse it. The old plan took min(-1, 5) = -1 and called it in sync (old
    code: LiveState has no version; with the min rule the change was 'create')."""
    desired = expand(ORDERS, broker_version=(4, 3, 6))
    live = _live(
        operator_policies=[_operator("cap", "parking$", 0, delivery_limit=5)],
        version=(4, 3, 6),
    )
    change = _find(
        compute_plan(desired, live, source="f", vhost="/").changes, "queue", "orders.work.parking"
    )
    assert change.action == "conflict"
    assert "delivery-limit would be 5 (set by an operator policy), not -1" in change.detail


def test_on_4x_an_operator_overflow_wins_over_our_policy() -> None:
    """4.x operator policies may set overflow and win over the user policy (docs: "operator
    policy value"; seen on 4.0.5 and 4.3.6); the old plan ignored the operator's overflow."""
    live = _live(
        operator_policies=[_operator("dh", "^orders\\.work$", 0, overflow="drop-head")],
        version=(4, 3, 6),
    )
    desired = expand(ORDERS, broker_version=(4, 3, 6))
    change = _find(
        compute_plan(desired, live, source="f", vhost="/").changes, "queue", "orders.work"
    )
    assert change.action == "conflict"
    assert "overflow would be 'drop-head' (set by an operator policy)" in change.detail


def test_objects_of_another_work_queue_are_not_orphans() -> None:
    """Two topology files in one vhost: the other file's policies and wait queues belong to its
    work queue, not to this file (issue 14)."""
    live = _live(
        policies={
            name: {"name": name}
            for name in (
                "rmqkit.billing.work",
                "rmqkit.billing.work.wait.1s",
                "rmqkit.billing.work.parking",
            )
        },
        queues={"billing.work.wait.1s": _quorum("billing.work.wait.1s")},
    )
    plan = compute_plan(expand(ORDERS), live, source="f", vhost="/")
    assert plan.summary()["orphan"] == 0

"""compute_plan over hand-built live states: each conflict rule, without a broker."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rmqkit.topology.expand import expand
from rmqkit.topology.model import load_topology
from rmqkit.topology.plan import Change, LiveState, compute_plan, effective_settings

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
    # numeric: lower wins; dead-letter keys: argument wins; overflow: policy wins
    assert effective_settings(
        {"max-length": 5, "dead-letter-exchange": "a", "overflow": "drop-head"},
        {"max-length": 9, "dead-letter-exchange": "b", "overflow": "reject-publish"},
        {"max-length": 3},
    ) == {"max-length": 3, "dead-letter-exchange": "a", "overflow": "reject-publish"}

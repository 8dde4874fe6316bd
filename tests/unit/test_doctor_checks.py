"""The doctor's checks and the vhost view they read, over hand-made management API JSON."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from rmqkit.broker.snapshot import Snapshot, effective_queue
from rmqkit.health.checks import CHECKS, DoctorInput, Finding
from rmqkit.health.doctor import DoctorReport, run_checks
from rmqkit.health.roles import classify
from rmqkit.health.status import build_status
from rmqkit.topology import load_topology
from rmqkit.topology.expand import expand
from rmqkit.topology.plan import Change, Plan

ROOT = Path(__file__).resolve().parents[2]
V3: tuple[int, int, int] = (3, 10, 8)
V4: tuple[int, int, int] = (4, 1, 0)


def queue(name: str, qtype: str = "quorum", **raw: Any) -> dict[str, Any]:
    args = dict(raw.pop("args", {}))
    args.setdefault("x-queue-type", qtype)
    return {
        "name": name,
        "type": qtype,
        "durable": True,
        "arguments": args,
        "consumers": 0,
        "messages": 0,
        "messages_ready": 0,
        **raw,
    }


def policy(name: str, pattern: str, priority: int = 0, **definition: Any) -> dict[str, Any]:
    return {
        "name": name,
        "pattern": pattern,
        "priority": priority,
        "apply-to": "queues",
        "definition": {k.replace("_", "-"): v for k, v in definition.items()},
    }


def snapshot(
    queues: list[dict[str, Any]],
    *,
    policies: list[dict[str, Any]] | None = None,
    operator: list[dict[str, Any]] | None = None,
    exchanges: list[dict[str, Any]] | None = None,
    bindings: list[dict[str, Any]] | None = None,
    version: tuple[int, int, int] = V3,
    vhost_stats: dict[str, Any] | None = None,
    rates_mode: str = "basic",
) -> Snapshot:
    pols, ops = policies or [], operator or []
    return Snapshot(
        vhost="v",
        version=version,
        queues={q["name"]: effective_queue(q, pols, ops, version) for q in queues},
        exchanges={"": {"name": ""}, **{e["name"]: e for e in exchanges or []}},
        bindings=bindings or [],
        policies=pols,
        operator_policies=ops,
        vhost_stats=vhost_stats,
        rates_mode=rates_mode,
    )


def check(snap: Snapshot, check_id: str, **kwargs: Any) -> list[Finding]:
    inp = DoctorInput(snapshot=snap, roles=classify(snap), **kwargs)
    (found,) = [c for c in CHECKS if c.id == check_id]
    return found.run(inp)


def fired(snap: Snapshot, **kwargs: Any) -> set[str]:
    inp = DoctorInput(snapshot=snap, roles=classify(snap), **kwargs)
    return {f.check for r in run_checks(inp) for f in r.findings}


PARKED = {
    "x-dead-letter-exchange": "",
    "x-dead-letter-routing-key": "w.parking",
    "x-dead-letter-strategy": "at-least-once",
    "x-overflow": "reject-publish",
    "x-max-length": 1000,
}


def work_and_parking(**work_args: Any) -> list[dict[str, Any]]:
    return [queue("w", args={**PARKED, **work_args}), queue("w.parking")]


# --- the view ---------------------------------------------------------------------------------
def test_precedence_numbers_lowest_dead_letter_argument_overflow_policy_on_quorum() -> None:
    snap = snapshot(
        [
            queue(
                "q",
                args={
                    "x-max-length": 50,
                    "x-dead-letter-exchange": "from-arg",
                    "x-overflow": "drop-head",
                },
            ),
            queue("c", "classic", args={"x-overflow": "drop-head"}),
        ],
        policies=[
            policy(
                "p",
                ".*",
                max_length=10,
                dead_letter_exchange="from-policy",
                overflow="reject-publish",
            )
        ],
        operator=[policy("op", "^q$", max_length=5)],
    )
    q = snap.queues["q"]
    assert q.settings["max-length"] == 5 and q.source("max-length") == "operator policy 'op'"
    assert q.dead_letter_exchange == "from-arg"
    assert q.settings["overflow"] == "reject-publish"  # quorum: the policy wins
    assert snap.queues["c"].settings["overflow"] == "drop-head"  # classic: the argument wins


def test_only_the_highest_priority_policy_applies_and_apply_to_is_respected() -> None:
    snap = snapshot(
        [queue("q"), queue("c", "classic")],
        policies=[
            policy("low", ".*", 1, message_ttl=1000),
            policy("high", ".*", 5, max_length=3),
            {**policy("qq-only", "^c$", 9, expires=5), "apply-to": "quorum_queues"},
        ],
    )
    assert snap.queues["q"].settings == {"max-length": 3}
    assert snap.queues["c"].settings == {"max-length": 3}


def test_delivery_limit_negative_loses_to_a_positive_one_on_4x() -> None:
    pols = [policy("p", ".*", delivery_limit=7)]
    snap = snapshot([queue("q", args={"x-delivery-limit": -1})], policies=pols, version=V4)
    assert snap.queues["q"].settings["delivery-limit"] == 7


def test_delivery_limit_negative_policy_then_the_lowest_positive_on_4x() -> None:
    """Argument 3, policy -1, operator policy 5: 4.x merges policy and operator first (-1
    loses: 5), then 5 against the argument 3 → 3, as 4.0.5 and 4.3.6 report in
    ``delivery_limit``. The old view took max(3, -1, 5) = 5 whenever a value was negative
    (old code: 5), so doctor showed a limit the broker does not enforce."""
    snap = snapshot(
        [queue("q", args={"x-delivery-limit": 3})],
        policies=[policy("p", ".*", delivery_limit=-1)],
        operator=[policy("op", ".*", delivery_limit=5)],
        version=V4,
    )
    assert snap.queues["q"].settings["delivery-limit"] == 3
    assert snap.queues["q"].source("delivery-limit") == "argument"


def test_classify_work_wait_parking_from_dead_letter_wiring() -> None:
    wait_args = {
        "x-message-ttl": 1000,
        "x-dead-letter-exchange": "",
        "x-dead-letter-routing-key": "w",
    }
    snap = snapshot([*work_and_parking(), queue("w.wait.1s", args=wait_args), queue("other")])
    roles = classify(snap)
    assert roles["w"] == ("work", "w")
    assert roles["w.wait.1s"] == ("wait", "w")
    assert roles["w.parking"] == ("parking", "w")
    assert roles["other"] == ("other", "other")


def test_dead_letter_targets_through_a_named_exchange_and_its_bindings() -> None:
    snap = snapshot(
        [queue("w", args={"x-dead-letter-exchange": "dlx"}), queue("dead")],
        exchanges=[{"name": "dlx", "type": "fanout"}, {"name": "dlx2", "type": "fanout"}],
        bindings=[
            {"source": "dlx", "destination": "dlx2", "destination_type": "exchange"},
            {"source": "dlx2", "destination": "dead", "destination_type": "queue"},
        ],
    )
    assert snap.dead_letter_targets(snap.queues["w"]) == ["dead"]
    assert classify(snap)["dead"] == ("parking", "w")  # a target that dead-letters nowhere


# --- the checks, each with a case that fires and one that does not --------------------------
def test_quorum_without_dead_letter_depends_on_version_and_limit() -> None:
    limited = snapshot([queue("q", args={"x-delivery-limit": 5})])
    assert [f.severity for f in check(limited, "quorum-no-dead-letter")] == ["critical"]
    assert check(snapshot([queue("q")]), "quorum-no-dead-letter") == []  # 3.x: no limit
    (finding,) = check(snapshot([queue("q")], version=V4), "quorum-no-dead-letter")
    assert "20 (the 4.x default)" in finding.evidence
    unlimited = snapshot([queue("q", args={"x-delivery-limit": -1})], version=V4)
    assert check(unlimited, "quorum-no-dead-letter") == []
    assert check(snapshot([queue("c", "classic")], version=V4), "quorum-no-dead-letter") == []


def test_dead_letter_target_missing_exchange_queue_and_unbound() -> None:
    missing = snapshot([queue("q", args={"x-dead-letter-exchange": "nope"})])
    (finding,) = check(missing, "dead-letter-target-missing")
    assert finding.severity == "critical" and "'nope'" in finding.evidence
    to_missing_queue = snapshot(
        [queue("q", args={"x-dead-letter-exchange": "", "x-dead-letter-routing-key": "gone"})]
    )
    assert check(to_missing_queue, "dead-letter-target-missing")[0].severity == "critical"
    unbound = snapshot(
        [queue("q", args={"x-dead-letter-exchange": "dlx"})],
        exchanges=[{"name": "dlx", "type": "direct"}],
    )
    assert check(unbound, "dead-letter-target-missing")[0].object == "q"
    no_key = snapshot([queue("q", args={"x-dead-letter-exchange": ""})])
    assert check(no_key, "dead-letter-target-missing")[0].severity == "warning"
    assert check(snapshot(work_and_parking()), "dead-letter-target-missing") == []


def test_at_least_once_needs_reject_publish_and_a_quorum_queue() -> None:
    args = {**PARKED}
    del args["x-overflow"]
    (finding,) = check(
        snapshot([queue("w", args=args), queue("w.parking")]),
        "at-least-once-without-reject-publish",
    )
    assert "drop-head (default)" in finding.evidence
    # On a quorum queue a policy's overflow beats the argument: fixed by the policy.
    fixed = snapshot(
        [queue("w", args={**PARKED, "x-overflow": "drop-head"}), queue("w.parking")],
        policies=[policy("p", "^w$", overflow="reject-publish")],
    )
    assert check(fixed, "at-least-once-without-reject-publish") == []
    classic = snapshot([queue("w", "classic", args=PARKED), queue("w.parking")])
    assert len(check(classic, "at-least-once-without-reject-publish")) == 1


def test_parking_with_ttl_expiry_limit_or_drop_head() -> None:
    for args in (
        {"x-message-ttl": 1000},
        {"x-expires": 60000},
        {"x-delivery-limit": 3},
        {"x-max-length": 10},
    ):
        found = check(snapshot([queue("jobs.parking", args=args)]), "parking-limit-or-ttl")
        assert [f.severity for f in found] == ["critical"], args
    bounded_safely = {"x-max-length": 10, "x-overflow": "reject-publish"}
    assert check(snapshot([queue("p.parking", args=bounded_safely)]), "parking-limit-or-ttl") == []
    # 4.x: no explicit limit means the default 20; -1 is the fix.
    assert check(snapshot([queue("p.parking")], version=V4), "parking-limit-or-ttl")
    fixed = snapshot([queue("p.parking", args={"x-delivery-limit": -1})], version=V4)
    assert check(fixed, "parking-limit-or-ttl") == []


def test_classic_mirrored_policies_user_and_operator() -> None:
    snap = snapshot(
        [], policies=[policy("ha", ".*", ha_mode="all")], operator=[policy("op", ".*", ha_x=1)]
    )
    found = check(snap, "classic-mirrored-policy")
    assert [(f.kind, f.object) for f in found] == [("policy", "ha"), ("operator-policy", "op")]


def test_transient_messages_only_when_counts_say_so() -> None:
    transient = queue("c", "classic", messages=4, messages_persistent=1)
    (finding,) = check(snapshot([transient]), "transient-messages")
    assert finding.evidence.startswith("3 of 4")
    assert check(snapshot([queue("c", "classic", messages=4)]), "transient-messages") == []
    non_durable = {**transient, "durable": False}
    assert check(snapshot([non_durable]), "transient-messages") == []
    blind = replace(snapshot([transient]), stats_disabled=True)
    (result,) = [r for r in run_checks(DoctorInput(blind, {})) if r.id == "transient-messages"]
    assert (result.status, result.findings) == ("skipped", [])


def test_unroutable_dropped_names_the_exchange_without_alternate() -> None:
    exchanges = [
        {"name": "events", "type": "topic", "message_stats": {"publish_in": 9, "publish_out": 4}},
        {
            "name": "guarded",
            "type": "topic",
            "arguments": {"alternate-exchange": "ae"},
            "message_stats": {"publish_in": 9},
        },
    ]
    snap = snapshot([], exchanges=exchanges, vhost_stats={"drop_unroutable": 5})
    (finding,) = check(snap, "unroutable-dropped")
    assert finding.object == "events" and "dropped 5" in finding.evidence
    returned_only = snapshot([], exchanges=exchanges, vhost_stats={"return_unroutable": 5})
    assert check(returned_only, "unroutable-dropped") == []
    no_stats = snapshot([], exchanges=exchanges, rates_mode="none")
    inp = DoctorInput(snapshot=no_stats, roles={})
    (result,) = [r for r in run_checks(inp) if r.id == "unroutable-dropped"]
    assert result.status == "skipped"


def test_growing_without_consumers_from_rates_or_samples_never_wait_or_parking() -> None:
    idle = queue("q", messages_ready=3, messages=3)
    publishing = {**idle, "message_stats": {"publish_details": {"rate": 2.0}}}
    assert check(snapshot([publishing]), "growing-without-consumers")
    assert check(snapshot([idle]), "growing-without-consumers") == []
    grew = check(
        snapshot([idle]),
        "growing-without-consumers",
        ready_samples={"q": (3, 8)},
        sample_interval_s=1.0,
    )
    assert "3 → 8" in grew[0].evidence
    consumed = {**publishing, "consumers": 1}
    assert check(snapshot([consumed]), "growing-without-consumers") == []
    parked = {**publishing, "name": "w.parking"}
    assert check(snapshot([parked]), "growing-without-consumers") == []


def test_unbounded_work_queue() -> None:
    args = {**PARKED}
    del args["x-max-length"]
    (finding,) = check(
        snapshot([queue("w", args=args), queue("w.parking")]), "unbounded-work-queue"
    )
    assert finding.object == "w"
    bytes_bound = {**args, "x-max-length-bytes": 10_000}
    assert check(snapshot(work_and_parking(**bytes_bound)), "unbounded-work-queue") == []


def test_handler_timeout_against_default_and_per_queue_consumer_timeout() -> None:
    snap = snapshot(work_and_parking())
    assert check(snap, "handler-timeout-above-consumer-timeout") == []
    (finding,) = check(snap, "handler-timeout-above-consumer-timeout", handler_timeout_s=1800.0)
    assert "30m" in finding.evidence
    # 3.12+ reads a per-queue consumer-timeout; earlier brokers ignore it.
    pols = [policy("ct", "^w$", consumer_timeout=60_000)]
    newer = snapshot(work_and_parking(), policies=pols, version=(3, 12, 0))
    assert check(newer, "handler-timeout-above-consumer-timeout", handler_timeout_s=90.0)
    older = snapshot(work_and_parking(), policies=pols)
    assert check(older, "handler-timeout-above-consumer-timeout", handler_timeout_s=90.0) == []
    per_queue = {"w": (2000.0, "topology handler_timeout")}
    assert check(snap, "handler-timeout-above-consumer-timeout", handler_timeouts=per_queue)
    # 4.3: the consumer passes a timeout of its own (x-consumer-timeout), above the handler's.
    newest = snapshot(work_and_parking(), policies=pols, version=(4, 3, 0))
    assert check(newest, "handler-timeout-above-consumer-timeout", handler_timeout_s=90.0) == []


def test_topology_out_of_sync_pending_warns_conflict_is_critical() -> None:
    desired = expand(load_topology(ROOT / "topologies" / "orders.toml"))
    plan = Plan(
        "orders.toml",
        "v",
        desired,
        [
            Change("queue", "a", "create", "quorum queue"),
            Change("queue", "b", "conflict", "exists as a classic queue", "rename it"),
            Change("queue", "c", "in-sync"),
            Change("queue", "d", "orphan", "left in place"),
        ],
    )
    found = check(snapshot([]), "topology-out-of-sync", plan=plan)
    assert [(f.object, f.severity) for f in found] == [("a", "warning"), ("b", "critical")]
    inp = DoctorInput(snapshot=snapshot([]), roles={})
    (result,) = [r for r in run_checks(inp) if r.id == "topology-out-of-sync"]
    assert result.status == "skipped"


# --- rmqkit's own topology is clean, on 3.x and 4.x ------------------------------------------
@pytest.mark.parametrize("version", [V3, V4])
@pytest.mark.parametrize("file", ["topologies/orders.toml", "tests/topologies/parking_lanes.toml"])
def test_a_declared_rmqkit_topology_is_clean(version: tuple[int, int, int], file: str) -> None:
    desired = expand(load_topology(ROOT / file), broker_version=version)
    policies = [
        {
            "name": p.name,
            "pattern": p.pattern,
            "priority": p.priority,
            "apply-to": p.apply_to,
            "definition": p.definition,
        }
        for p in desired.policies
    ]
    snap = snapshot(
        [queue(q.name) for q in desired.queues],
        policies=policies,
        exchanges=[{"name": e.name, "type": e.type} for e in desired.exchanges],
        version=version,
    )
    roles = classify(snap)
    assert {roles[q.name][0] for q in desired.queues} == {"work", "wait", "parking"}
    assert all(roles[q.name] == (q.role, q.owner) for q in desired.queues)
    found = fired(snap)
    if file.endswith("lanes.toml"):  # parking_lanes.toml sets no max_length: rightly a warning
        assert found == {"unbounded-work-queue"}
    else:
        assert found == set()


# --- the report -------------------------------------------------------------------------------
def test_report_status_and_exit_code_follow_nagios() -> None:
    clean = DoctorReport("v", V3, datetime.now(UTC), run_checks(DoctorInput(snapshot([]), {})))
    assert (clean.status, clean.exit_code) == ("ok", 0)
    snap = snapshot([queue("q", args={"x-delivery-limit": 5})], policies=[policy("h", "x", ha_a=1)])
    bad = DoctorReport("v", V3, datetime.now(UTC), run_checks(DoctorInput(snap, classify(snap))))
    assert (bad.status, bad.exit_code) == ("critical", 2)
    assert bad.counts() == {"critical": 1, "warning": 1}
    assert bad.findings[0].severity == "critical"
    assert bad.as_dict()["findings"][0]["check"] == "quorum-no-dead-letter"


def test_status_groups_per_work_queue_and_tolerates_missing_stats() -> None:
    wait_args = {
        "x-message-ttl": 1000,
        "x-dead-letter-exchange": "",
        "x-dead-letter-routing-key": "w",
    }
    raw = [
        queue("w", args=PARKED, messages=5, messages_ready=4, messages_unacknowledged=1),
        queue("w.wait.1s", args=wait_args, messages=2),
        queue("w.parking", messages=3),
        {"name": "bare", "type": "classic"},  # no counts at all
    ]
    report = build_status(snapshot(raw))
    (group,) = [g.as_dict() for g in report.groups]
    assert group["work"] == "w"
    assert (group["ready"], group["unacked"], group["waiting"], group["parked"]) == (4, 1, 2, 3)
    bare = next(q for q in report.queues if q.name == "bare")
    assert (bare.ready, bare.publish_rate) == (None, None)


def test_doctors_topology_plan_uses_the_brokers_version() -> None:
    """doctor --topology runs plan on its snapshot; on 4.x an operator delivery-limit 5 beats
    the parking queue's -1 (seen on 4.0.5 and 4.3.6), so plan must see 4.x rules there too
    (before: the LiveState doctor built had no version, and plan took min(-1, 5))."""
    from rmqkit.health.doctor import topology_plan

    topology = load_topology(ROOT / "topologies" / "orders.toml")
    cap = {**policy("cap", "parking$", delivery_limit=5)}
    snap = snapshot([], operator=[cap], version=V4)
    plan = topology_plan(snap, topology, "policy")
    parking = next(c for c in plan.changes if c.name == "orders.work.parking")
    assert parking.action == "conflict" and "delivery-limit would be 5" in parking.detail


# --- the cluster's nodes: alarms --------------------------------------------------------------
def _node(name: str, **raw: Any) -> dict[str, Any]:
    return {"name": name, "running": True, "mem_used": 10**8, "mem_limit": 10**9, **raw}


def test_broker_alarm_names_each_node_and_resource_and_is_skipped_without_nodes() -> None:
    from rmqkit.broker.snapshot import NodeView
    from rmqkit.health.checks import CheckSkipped

    quiet = snapshot([])
    with pytest.raises(CheckSkipped, match="monitoring tag"):
        check(quiet, "broker-alarm")  # /api/nodes not readable: skipped, not passed
    nodes = [
        NodeView.of(_node("rabbit@a")),
        NodeView.of(_node("rabbit@b", mem_alarm=True, mem_used=2 * 10**9, mem_limit=10**9)),
        NodeView.of(
            _node("rabbit@c", disk_free_alarm=True, disk_free=4 * 10**7, disk_free_limit=5 * 10**7)
        ),
    ]
    found = check(replace(quiet, nodes=nodes), "broker-alarm")
    assert [(f.severity, f.kind, f.object) for f in found] == [
        ("critical", "node", "rabbit@b"),
        ("critical", "node", "rabbit@c"),
    ]
    assert "memory alarm on node rabbit@b (2.0 GB used, limit 1.0 GB)" in found[0].evidence
    assert "disk alarm on node rabbit@c (40.0 MB free, limit 50.0 MB)" in found[1].evidence
    assert "-n rabbit@c alarms" in found[1].fix
    assert check(replace(quiet, nodes=nodes[:1]), "broker-alarm") == []
    report = build_status(replace(quiet, nodes=nodes)).as_dict()
    assert [(a["node"], a["resource"]) for a in report["alarms"]] == [
        ("rabbit@b", "memory"),
        ("rabbit@c", "disk"),
    ]
    assert build_status(quiet).as_dict()["alarms"] is None  # unknown, not "none"


# --- quorum queues: leader and members -----------------------------------------------------------
A, B, C = "rabbit@a", "rabbit@b", "rabbit@c"


def _members(name: str, members: list[str], online: list[str], **raw: Any) -> dict[str, Any]:
    leader = online[0] if len(online) > len(members) // 2 else None
    return queue(name, members=members, online=online, leader=leader, **raw)


def _three_nodes(snap: Snapshot) -> Snapshot:
    from rmqkit.broker.snapshot import NodeView

    return replace(snap, nodes=[NodeView.of(_node(n)) for n in (A, B, C)])


def test_quorum_members_critical_without_a_majority_warning_with_a_member_down() -> None:
    snap = _three_nodes(
        snapshot(
            [
                _members("healthy", [A, B, C], [A, B, C]),
                _members("one-down", [A, B, C], [A, C]),
                _members("no-majority", [A, B, C], [C]),
                _members("lonely", [A], [A]),
                _members("meant-small", [A], [A], args={"x-quorum-initial-group-size": 1}),
                queue("classic", "classic"),
            ]
        )
    )
    found = {(f.object, f.severity): f for f in check(snap, "quorum-members")}
    assert sorted(found) == [
        ("lonely", "warning"),
        ("no-majority", "critical"),
        ("one-down", "warning"),
    ]
    lost = found["no-majority", "critical"]
    assert "1 of 3 members online (offline: rabbit@a, rabbit@b), a majority is 2" in lost.evidence
    assert "do not delete" in lost.fix
    assert "member(s) offline: rabbit@b" in found["one-down", "warning"].evidence
    lonely = found["lonely", "warning"]
    assert "members on 1 of the cluster's 3 nodes (rabbit@a), meant to have 3" in lonely.evidence
    assert "add_member --vhost 'v' 'lonely' 'rabbit@b'" in lonely.fix
    assert "'rabbit@c'" in lonely.fix
    # status: per queue leader/members, and the queue without a majority flagged
    report = build_status(snap)
    rows = {q.name: q.as_dict() for q in report.queues}
    assert rows["no-majority"]["majority"] is False and rows["no-majority"]["leader"] is None
    assert rows["one-down"]["offline"] == [B] and rows["one-down"]["majority"] is True
    assert rows["classic"]["members"] is None
    assert report.as_dict()["without_majority"] == ["no-majority"]


def test_quorum_members_without_nodes_or_members_data() -> None:
    from rmqkit.health.checks import CheckSkipped

    # /api/nodes unreadable: judged on members alone (no cluster size to compare with)
    snap = snapshot([_members("lonely", [A], [A]), _members("no-majority", [A, B, C], [C])])
    assert [f.object for f in check(snap, "quorum-members")] == ["no-majority"]
    # a 5-node cluster: the default group size is 3, so 3 members are as meant
    from rmqkit.broker.snapshot import NodeView

    five = [NodeView.of(_node(f"rabbit@{n}")) for n in "abcde"]
    assert (
        check(
            replace(snapshot([_members("q", [A, B, C], [A, B, C])]), nodes=five), "quorum-members"
        )
        == []
    )
    with pytest.raises(CheckSkipped):  # stats off: members not reported
        check(snapshot([queue("q")]), "quorum-members")


def test_transient_messages_never_in_a_quorum_queue() -> None:
    """A quorum queue persists every message: its counters' gap (they lag while a publish runs:
    "40 of 160 … transient … or use a quorum queue" was seen with every message persistent) is
    no finding, and a quorum queue is never told to be one."""
    lagging = queue("q", "quorum", messages=160, messages_persistent=120)
    assert check(snapshot([lagging]), "transient-messages") == []
    assert check(snapshot([lagging]), "transient-messages", transient_reread={}) == []


def test_transient_messages_must_hold_on_the_second_read() -> None:
    first = queue("c", "classic", messages=160, messages_persistent=120)
    caught_up = {"c": (160, 160)}
    assert check(snapshot([first]), "transient-messages", transient_reread=caught_up) == []
    assert check(snapshot([first]), "transient-messages", transient_reread={}) == []  # gone
    (finding,) = check(snapshot([first]), "transient-messages", transient_reread={"c": (170, 130)})
    assert finding.evidence == (
        "40 of 170 message(s) in this durable classic queue are transient (delivery_mode 1) on "
        "two reads of the counters: they are lost when the node restarts"
    )
    assert finding.fix == (
        "publish with delivery_mode 2 (persistent; `rmqkit publish` does), or use a quorum "
        "queue, which persists every message"
    )

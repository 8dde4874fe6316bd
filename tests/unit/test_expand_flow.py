"""What lanes, partitions, single active consumer and a default delay expand into, and what
``plan`` says about them — over hand-built live states, without a broker (the real broker's
view is tests/integration/test_topology_flow.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rmqkit.delay import Ladder
from rmqkit.topology.expand import expand, expand_all
from rmqkit.topology.export import export_definitions
from rmqkit.topology.model import load_topology, parse_topology
from rmqkit.topology.plan import Change, LiveState, compute_plan

ROOT = Path(__file__).resolve().parents[2]
FLOW = load_topology(ROOT / "topologies" / "flow.toml")


def _live(**kwargs: Any) -> LiveState:
    base: dict[str, Any] = {"queues": {}, "exchanges": {}, "bindings": [], "policies": {}}
    base.update(kwargs)
    return LiveState(**base)


def _find(changes: list[Change], kind: str, name: str) -> Change:
    return next(c for c in changes if c.kind == kind and c.name == name)


def _quorum(name: str, args: dict[str, Any] | None = None) -> dict[str, Any]:
    return {"name": name, "type": "quorum", "durable": True, "arguments": args or {}}


def test_lanes_are_work_queues_with_own_waits_parking_in_the_parents() -> None:
    state = expand(FLOW)
    queues = {q.name: q for q in state.queues}
    lane = queues["media.work.lane.large"]
    assert (lane.role, lane.owner) == ("work", "media.work.lane.large")
    assert lane.settings["dead-letter-routing-key"] == "media.work.parking"
    assert lane.settings == queues["media.work"].settings  # the parent's settings
    wait = queues["media.work.lane.large.wait.10s"]
    assert wait.role == "wait" and wait.settings["dead-letter-routing-key"] == (
        "media.work.lane.large"
    )
    assert "media.work.lane.bulk.wait.1s.slot-500ms" in queues
    assert [q for q in queues if q.endswith(".parking") and q.startswith("media")] == [
        "media.work.parking"
    ]
    # not bound to the parent's exchanges: only rmqkit publishers put messages in a lane
    assert [b.destination for b in state.bindings if b.source == "media"] == ["media.work"]


def test_partitions_hash_exchange_sac_queues_and_e2e_binds() -> None:
    state = expand(FLOW)
    queues = {q.name: q for q in state.queues}
    assert "accounts.work" not in queues  # the parent is no queue
    parts = [f"accounts.work.p{i}" for i in range(4)]
    for name in parts:
        assert queues[name].single_active_consumer
        assert queues[name].arguments("policy") == {
            "x-queue-type": "quorum",
            "x-single-active-consumer": True,
        }
        assert queues[name].settings["dead-letter-routing-key"] == "accounts.work.parking"
        assert queues[f"{name}.wait.1s"].settings["dead-letter-routing-key"] == name
        assert not queues[f"{name}.wait.1s"].single_active_consumer
    [hashing] = [e for e in state.exchanges if e.name == "accounts.work.partition"]
    assert (hashing.type, hashing.arguments) == ("x-consistent-hash", {"hash-header": "account_id"})
    weights = [(b.destination, b.routing_key) for b in state.bindings if b.source == hashing.name]
    assert weights == [(name, "1") for name in parts]
    [e2e] = [b for b in state.bindings if b.source == "accounts"]
    assert (e2e.destination, e2e.destination_type, e2e.routing_key) == (
        "accounts.work.partition",
        "exchange",
        "account.updated",
    )


def test_single_active_consumer_in_arguments_whatever_via() -> None:
    ledger = {q.name: q for q in expand(FLOW, via="arguments").queues}["ledger.work"]
    args = ledger.arguments("arguments")
    assert args["x-dead-letter-routing-key"] == "ledger.work.parking"
    assert args["x-single-active-consumer"] is True
    assert "x-single-active-consumer" not in {q.name: q for q in expand(FLOW).queues}[
        "media.work"
    ].arguments("policy")


def test_a_delay_brings_the_default_ladder_with_its_exits() -> None:
    state = expand(FLOW)
    ladder = Ladder()
    assert state.ladder == ladder.base
    assert [q.name for q in state.fixed_queues] == ladder.queue_names
    rung = state.fixed_queues[3]
    assert rung.arguments("policy") == ladder.queue_arguments(3)  # x-arguments, no policy
    assert not any(p.queue.startswith(ladder.base) for p in state.policies)
    assert state.ladder_targets == [("", "ledger.work")]
    objects = ladder.objects([("", "ledger.work")])
    assert {e.name for e in objects.exchanges} <= {e.name for e in state.exchanges}
    assert len([b for b in state.bindings if b.source.startswith(ladder.base)]) == len(
        objects.bindings
    )
    exits = [b for b in state.bindings if b.source == ladder.out and b.destination == "ledger.work"]
    assert exits and exits[0].label.startswith(f"{ladder.out} → ledger.work (")
    doc = export_definitions(FLOW, vhost="v", broker_version=(3, 10, 8))
    assert ladder.queue_name(0) in {q["name"] for q in doc["queues"]}


def test_delay_targets_are_binds_the_queue_and_its_lanes() -> None:
    topology = parse_topology(
        '[exchanges.e]\n[queues.w]\nbind = [{ exchange = "e", routing_key = "k" }]\n'
        'delay = "5s"\n[queues.w.lanes.big]\nbody_over = 10\n'
        '[queues.p]\nbind = [{ exchange = "e", routing_key = "p" }]\ndelay = "1s"\n'
        'partitions = 2\npartition_key = "k"\n[queues.n]\n',
        "t.toml",
    )
    assert expand(topology).ladder_targets == [
        ("e", ""),
        ("", "w"),
        ("", "w.lane.big"),
        ("p.partition", ""),
    ]
    no_delay = parse_topology("[queues.n]\n", "t.toml")
    state = expand(no_delay)
    assert state.fixed_queues == [] and state.ladder is None


def test_expand_all_declares_one_ladder_with_every_files_exits() -> None:
    a = parse_topology('[queues.a]\ndelay = "1s"\n', "a.toml")
    b = parse_topology('[queues.b]\ndelay = "2s"\n', "b.toml")
    merged = expand_all([a, b])
    assert merged.ladder_targets == [("", "a"), ("", "b")]
    assert len(merged.fixed_queues) == Ladder().bits
    assert len({e.name for e in merged.exchanges}) == len(merged.exchanges)


def test_plan_summary_lines_state_the_flow_keys() -> None:
    lines = {w.name: w.text() for w in expand(FLOW).work_queues}
    assert (
        "lanes media.work.lane.large (body over 262144 bytes), media.work.lane.bulk "
        in (lines["media.work"])
    )
    assert (
        "4 partitions accounts.work.p0…accounts.work.p3 by header account_id"
        in (lines["accounts.work"])
    )
    assert "single active consumer; default delay 30s (delay ladder)" in lines["ledger.work"]
    encrypted = parse_topology(
        "[queues.w]\nsensitive_fields = ['a', 'b']\nblind_index = ['b']\nencrypt = true\n", "t"
    )
    [work] = expand(encrypted).work_queues
    assert work.text().endswith("; encrypts a, b (blind index b)")
    assert work.as_dict()["encrypt"] == ["a", "b"]
    # a file without the new keys reads as before
    plain = parse_topology("[queues.w]\n", "t")
    assert expand(plain).work_queues[0].text().endswith("; parks in w.parking")


def test_empty_broker_plan_creates_everything_no_conflict() -> None:
    plan = compute_plan(
        expand(FLOW),
        _live(
            exchange_types=frozenset({"direct", "topic", "fanout", "headers", "x-consistent-hash"})
        ),
        source="f",
        vhost="/",
    )
    assert not plan.conflicts
    assert _find(plan.changes, "queue", Ladder().queue_name(0)).detail == "delay ladder rung"


def test_missing_consistent_hash_plugin_is_a_conflict_naming_it() -> None:
    plan = compute_plan(
        expand(FLOW),
        _live(exchange_types=frozenset({"direct", "topic", "fanout", "headers"})),
        source="f",
        vhost="/",
    )
    [conflict] = plan.conflicts
    assert conflict.name == "accounts.work.partition"
    assert "rabbitmq_consistent_hash_exchange" in conflict.detail
    assert conflict.fix == "rabbitmq-plugins enable rabbitmq_consistent_hash_exchange"


def test_single_active_consumer_differing_on_a_live_queue_is_a_conflict() -> None:
    live = _live(queues={"ledger.work": _quorum("ledger.work", {"x-queue-type": "quorum"})})
    change = _find(
        compute_plan(expand(FLOW), live, source="f", vhost="/").changes, "queue", "ledger.work"
    )
    assert change.action == "conflict" and "x-single-active-consumer" in change.detail
    live = _live(
        queues={
            "media.work": _quorum(
                "media.work", {"x-queue-type": "quorum", "x-single-active-consumer": True}
            )
        }
    )
    change = _find(
        compute_plan(expand(FLOW), live, source="f", vhost="/").changes, "queue", "media.work"
    )
    assert change.action == "conflict"


def test_a_rung_with_other_arguments_is_a_conflict() -> None:
    ladder = Ladder()
    name = ladder.queue_name(2)
    live = _live(queues={name: _quorum(name, {**ladder.queue_arguments(2), "x-message-ttl": 1})})
    change = _find(compute_plan(expand(FLOW), live, source="f", vhost="/").changes, "queue", name)
    assert change.action == "conflict" and "x-message-ttl" in change.detail
    same = _live(queues={name: _quorum(name, ladder.queue_arguments(2))})
    change = _find(compute_plan(expand(FLOW), same, source="f", vhost="/").changes, "queue", name)
    assert change.action == "in-sync"


def _orphans(live: LiveState, text: str) -> set[str]:
    plan = compute_plan(expand(parse_topology(text, "t")), live, source="t", vhost="/")
    return {c.name for c in plan.changes if c.action == "orphan"}


def test_removed_lanes_and_partitions_are_the_files_orphans() -> None:
    names = [
        "w.lane.big",
        "w.lane.big.wait.1s",
        "w.p3",
        "w.p3.wait.1s.slot-500ms",
        "w.partition",
        "other.lane.x",
        "w.px",
        "w.p1x",
    ]
    live = _live(
        queues={n: _quorum(n) for n in names if n != "w.partition"},
        exchanges={"w.partition": {"name": "w.partition", "type": "x-consistent-hash"}},
        policies={"rmqkit.w.lane.big": {"name": "rmqkit.w.lane.big", "definition": {}}},
    )
    found = _orphans(live, '[queues.w]\nretry_delays = ["1s"]\n')
    assert found == {
        "w.lane.big",
        "w.lane.big.wait.1s",
        "w.p3",
        "w.p3.wait.1s.slot-500ms",
        "w.partition",
        "rmqkit.w.lane.big",
    }
    # still declared: not orphans
    assert "w.p3" not in _orphans(
        live, '[queues.w]\nretry_delays = ["1s"]\npartitions = 4\npartition_key = "k"\n'
    )


def test_another_files_work_queue_named_like_a_derived_one_is_not_an_orphan() -> None:
    """A work queue `orders.wait.list` of another file (finding 9 of test_oncall_adversarial):
    it, its wait and parking queues and their policies are not `orders`' — `list` is no delay,
    and their dead-lettering leads into `orders.wait.list`'s family, not `orders`'."""
    policies = {
        "rmqkit.orders.wait.list": {
            "name": "rmqkit.orders.wait.list",
            "pattern": "^orders\\.wait\\.list$",
            "apply-to": "queues",
            "priority": 10,
            "definition": {"dead-letter-routing-key": "orders.wait.list.parking"},
        },
        "rmqkit.orders.wait.list.wait.2s": {
            "name": "rmqkit.orders.wait.list.wait.2s",
            "pattern": "^orders\\.wait\\.list\\.wait\\.2s$",
            "apply-to": "queues",
            "priority": 10,
            "definition": {"dead-letter-routing-key": "orders.wait.list", "message-ttl": 2000},
        },
        "rmqkit.orders.wait.5s": {
            "name": "rmqkit.orders.wait.5s",
            "pattern": "^orders\\.wait\\.5s$",
            "apply-to": "queues",
            "priority": 10,
            "definition": {"dead-letter-routing-key": "orders", "message-ttl": 5000},
        },
    }
    queues = {
        n: _quorum(n)
        for n in (
            "orders.wait.list",
            "orders.wait.list.wait.2s",
            "orders.wait.list.parking",  # no dead-lettering: the name's shape decides
            "orders.wait.5s",
        )
    }
    policies["rmqkit.orders.wait.list.parking"] = {
        "name": "rmqkit.orders.wait.list.parking",
        "definition": {"overflow": "reject-publish"},
    }
    found = _orphans(
        _live(queues=queues, policies=policies), '[queues.orders]\nretry_delays = ["1s"]\n'
    )
    assert found == {"orders.wait.5s", "rmqkit.orders.wait.5s"}


def test_a_queue_that_became_partitioned_is_an_orphan() -> None:
    live = _live(queues={"w": {**_quorum("w"), "messages": 3}})
    plan = compute_plan(
        expand(parse_topology("[queues.w]\npartitions = 2\npartition_key = 'k'\n", "t")),
        live,
        source="t",
        vhost="v",
    )
    change = _find(plan.changes, "queue", "w")
    assert change.action == "orphan" and "partitioned now" in change.detail
    assert "3 message(s)" in change.detail and "delete_queue -p v w" in change.fix

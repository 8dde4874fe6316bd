from __future__ import annotations

from pathlib import Path

from rmqkit.topology.expand import expand, jitter_slot_delays, wait_queue_names
from rmqkit.topology.export import export_definitions
from rmqkit.topology.model import load_topology, parse_topology

ROOT = Path(__file__).resolve().parents[2]
ORDERS = load_topology(ROOT / "topologies" / "orders.toml")


def test_jitter_slots_spread_over_the_window_and_end_at_the_delay() -> None:
    assert jitter_slot_delays(1000, 0.5, 5) == [500, 625, 750, 875, 1000]
    assert jitter_slot_delays(1000, 0.0, 5) == [1000]
    assert jitter_slot_delays(1000, 0.5, 1) == [1000]
    assert max(jitter_slot_delays(7, 0.9, 20)) == 7


def test_wait_queue_names() -> None:
    tiers = wait_queue_names(ORDERS, "orders.work")
    assert [t[-1] for t in tiers] == [
        ("orders.work.wait.1s", 1000),
        ("orders.work.wait.5s", 5000),
        ("orders.work.wait.30s", 30000),
        ("orders.work.wait.2m", 120000),
    ]
    assert tiers[0][0] == ("orders.work.wait.1s.slot-500ms", 500)


def test_policy_mode_keeps_arguments_minimal() -> None:
    desired = expand(ORDERS)
    assert {q.role for q in desired.queues} == {"work", "wait", "parking"}
    assert all(q.arguments("policy") == {"x-queue-type": "quorum"} for q in desired.queues)
    assert len(desired.policies) == len(desired.queues) == 22
    work = desired.policies[0]
    assert work.name == "rmqkit.orders.work" and work.pattern == r"^orders\.work$"
    assert work.definition["dead-letter-strategy"] == "at-least-once"
    assert work.definition["overflow"] == "reject-publish"


def test_parking_has_no_limit_on_3x_and_unlimited_on_4x() -> None:
    parking_3 = next(q for q in expand(ORDERS).queues if q.role == "parking")
    assert parking_3.settings == {"overflow": "reject-publish"}
    parking_4 = next(
        q for q in expand(ORDERS, broker_version=(4, 1, 0)).queues if q.role == "parking"
    )
    assert parking_4.settings["delivery-limit"] == -1


def test_arguments_mode() -> None:
    desired = expand(ORDERS, via="arguments")
    assert desired.policies == []
    wait = next(q for q in desired.queues if q.name == "orders.work.wait.5s")
    assert wait.arguments("arguments") == {
        "x-queue-type": "quorum",
        "x-message-ttl": 5000,
        "x-dead-letter-exchange": "",
        "x-dead-letter-routing-key": "orders.work",
        "x-dead-letter-strategy": "at-least-once",
        "x-overflow": "reject-publish",
    }


def test_lanes_may_share_a_parking_queue() -> None:
    text = """
[exchanges.jobs]
type = "direct"
[queues."jobs.small"]
bind = [{ exchange = "jobs", routing_key = "small" }]
parking = "jobs.parking"
[queues."jobs.large"]
bind = [{ exchange = "jobs", routing_key = "large" }]
parking = "jobs.parking"
"""
    desired = expand(parse_topology(text, "t.toml"))
    assert [q.name for q in desired.queues if q.role == "parking"] == ["jobs.parking"]


def test_export_document_shape() -> None:
    doc = export_definitions(ORDERS, vhost="v", broker_version=(3, 10, 8))
    assert {"queues", "exchanges", "bindings", "policies"} <= set(doc)
    assert all(q["vhost"] == "v" for q in doc["queues"])
    assert doc["bindings"] == [
        {
            "source": "orders",
            "vhost": "v",
            "destination": "orders.work",
            "destination_type": "queue",
            "routing_key": "order.*",
            "arguments": {},
        }
    ]


def test_expand_all_is_the_union_and_shares_identical_objects() -> None:
    from rmqkit.topology.expand import expand_all

    a = parse_topology('[exchanges.x]\n[queues."a.work"]\nretry_delays = ["1s"]\n', "a.toml")
    b = parse_topology('[exchanges.x]\n[queues."b.work"]\nretry_delays = []\n', "b.toml")
    merged = expand_all([a, b])
    assert [e.name for e in merged.exchanges] == ["x"]
    names = {q.name for q in merged.queues}
    assert {"a.work", "a.work.parking", "b.work", "b.work.parking"} <= names
    assert {p.name for p in merged.policies} >= {"rmqkit.a.work", "rmqkit.b.work"}


def test_expand_all_refuses_files_that_disagree() -> None:
    import pytest

    from rmqkit.errors import TopologyFileError
    from rmqkit.topology.expand import expand_all

    a = parse_topology('[queues."a.work"]\nmax_length = 5\n', "a.toml")
    other = parse_topology('[queues."a.work"]\nmax_length = 6\n', "c.toml")
    with pytest.raises(TopologyFileError, match=r"c\.toml: queue 'a\.work' is also in a\.toml"):
        expand_all([a, other])


def test_retention_is_the_work_queues_message_ttl_only() -> None:
    topology = parse_topology(
        '[queues."w"]\nretention = "4d"\nretry_delays = ["1s"]\njitter_slots = 1\n', "t.toml"
    )
    desired = expand(topology)
    settings = {q.name: q.settings for q in desired.queues}
    assert settings["w"]["message-ttl"] == 4 * 24 * 3600 * 1000
    assert "message-ttl" not in settings["w.parking"]
    assert settings["w.wait.1s"]["message-ttl"] == 1000  # the tier's own TTL, unchanged
    [work] = desired.work_queues
    assert work.retention_ms == 4 * 24 * 3600 * 1000
    assert "retention 4d, then parked as expired" in work.text()
    assert "message-ttl" not in {q.name: q.settings for q in expand(ORDERS).queues}["orders.work"]

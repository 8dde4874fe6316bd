"""Which queues one `consume --queue W` serves (rmqkit.consumer.lanes) and their settings."""

from __future__ import annotations

from pathlib import Path

from rmqkit.consumer.config import ConsumerFlags, build_config, policy_from_topology
from rmqkit.consumer.lanes import Served, served_from_names, served_from_topology
from rmqkit.topology import load_topology

TOPOLOGIES = Path(__file__).resolve().parents[1] / "topologies"


def test_a_work_queue_is_served_with_its_lanes_with_their_own_prefetch() -> None:
    topology = load_topology(TOPOLOGIES / "lanes.toml")
    served = served_from_topology(topology, "media.work")
    assert served == [Served("media.work"), Served("media.work.lane.slow", 2, None)]
    lane = policy_from_topology(topology, "media.work.lane.slow", None)
    # the lane's own wait queues, the parent's parking queue
    assert lane.queue == "media.work.lane.slow"
    assert lane.parking_queue == "media.work.parking"
    assert all(q.startswith("media.work.lane.slow.wait.1s") for q in lane.all_wait_queues)
    config = build_config("m:f", lane.queue, lane, ConsumerFlags(prefetch=2), topology)
    assert config.prefetch == 2
    main = build_config(
        "m:f",
        "media.work",
        policy_from_topology(topology, "media.work", None),
        ConsumerFlags(),
        topology,
    )
    assert main.prefetch == 20 and main.queues == ("media.work",)


def test_a_partitioned_work_queue_is_served_as_its_partitions() -> None:
    topology = load_topology(TOPOLOGIES / "partitions.toml")
    served = served_from_topology(topology, "orders.work")
    assert [s.queue for s in served] == [f"orders.work.p{i}" for i in range(4)]
    part = policy_from_topology(topology, "orders.work.p2", None)
    assert part.parking_queue == "orders.work.parking"
    assert part.all_wait_queues[-1] == "orders.work.p2.wait.200ms"
    # a lane or partition queue named on its own is served alone
    assert served_from_topology(topology, "orders.work.p1") == [Served("orders.work.p1")]


def test_without_a_topology_the_served_queues_come_from_the_brokers_names() -> None:
    names = [
        "media.work",
        "media.work.lane.slow",
        "media.work.lane.slow.wait.1s",
        "media.work.lane.big",
        "media.work.parking",
        "media.workers",
        "orders.work.p10",
        "orders.work.p2",
        "orders.work.p2.wait.1s",
        "orders.work.parking",
    ]
    assert [s.queue for s in served_from_names(names, "media.work")] == [
        "media.work",
        "media.work.lane.big",
        "media.work.lane.slow",
    ]
    assert [s.queue for s in served_from_names(names, "orders.work")] == [
        "orders.work.p2",
        "orders.work.p10",
    ]
    assert served_from_names(names, "other") == [Served("other")]


def test_readiness_needs_every_served_queue_connected_and_consuming() -> None:
    from rmqkit.consumer.metrics import ConsumerMetrics

    metrics = ConsumerMetrics("media.work")
    for queue in ("media.work", "media.work.lane.slow"):
        metrics.set_connected(True, queue)
        metrics.set_consuming(True, queue)
    assert metrics.not_ready_reason() is None
    metrics.cancelled_by_broker("media.work.lane.slow")
    assert metrics.not_ready_reason() == "connected but not consuming (media.work.lane.slow)"
    metrics.set_consuming(True, "media.work.lane.slow")
    metrics.set_connected(False, "media.work")
    assert metrics.not_ready_reason() == "not connected to the broker (media.work)"

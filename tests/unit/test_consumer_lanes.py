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


def test_a_served_queue_that_waits_for_a_missing_queue_is_named_first() -> None:
    from rmqkit.consumer.metrics import ConsumerMetrics

    metrics = ConsumerMetrics("media.work")
    for queue in ("media.work", "media.work.lane.slow"):
        metrics.set_connected(True, queue)
        metrics.set_consuming(True, queue)
    reason = "queue 'media.work.lane.slow' does not exist (deleted?): not consuming it"
    metrics.set_consuming(False, "media.work.lane.slow")
    metrics.set_waiting("media.work.lane.slow", reason)
    assert metrics.not_ready_reason() == reason
    assert b'rmqkit_consumer_queues_waiting{queue="media.work"} 1.0' in metrics.render()
    metrics.set_waiting("media.work.lane.slow", None)
    metrics.set_consuming(True, "media.work.lane.slow")
    assert metrics.not_ready_reason() is None
    assert b'rmqkit_consumer_queues_waiting{queue="media.work"} 0.0' in metrics.render()


def test_a_queue_declared_again_with_other_arguments_shows_each_difference() -> None:
    from rmqkit.consumer.wiring import identity_changes, queue_identity

    quorum = {
        "name": "media.work.lane.slow",
        "type": "quorum",
        "durable": True,
        "auto_delete": False,
        "exclusive": False,
        "arguments": {"x-queue-type": "quorum", "x-delivery-limit": 5},
        "messages": 3,  # counters and policies are not part of what it was declared as
        "policy": "p",
    }
    same = {**quorum, "messages": 0, "policy": None}
    assert identity_changes(queue_identity(quorum), queue_identity(same)) == []
    classic = {**quorum, "type": "classic", "arguments": {}}
    assert identity_changes(queue_identity(quorum), queue_identity(classic)) == [
        "x-delivery-limit 5 \u2192 none",
        "x-queue-type quorum \u2192 none",
        "type quorum \u2192 classic",
    ]


def test_a_worker_stops_once_its_supervisors_pipe_ends() -> None:
    """The lifeline: end-of-file on the read end (the supervisor's end closed, as its death
    closes it) calls the graceful stop once; nothing before that."""
    import asyncio
    import multiprocessing

    from rmqkit.consumer.worker import _watch_lifeline

    async def main() -> list[str]:
        read, write = multiprocessing.Pipe(duplex=False)
        calls: list[str] = []
        _watch_lifeline(asyncio.get_running_loop(), read, lambda: calls.append("stop"), 1.0)
        await asyncio.sleep(0.05)
        assert calls == []
        write.close()
        for _ in range(100):
            if calls:
                break
            await asyncio.sleep(0.01)
        await asyncio.sleep(0.05)  # and only once
        read.close()
        return calls

    assert asyncio.run(main()) == ["stop"]

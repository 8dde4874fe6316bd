"""Lanes (issue 15) through `rmqkit consume`, on the real broker.

One ``consume --queue media.work`` serves the work queue and its lane ``media.work.lane.slow``
(tests/topologies/lanes.toml), each with its own channel, prefetch and handler slots. With the
lane saturated by slow jobs, the small jobs of the work queue are all handled while the lane is
still busy: the lane can hold only its own window (the bench, bench/lanes.py, measures the
latency; this test checks the order of events, not a wall-clock threshold).
"""

from __future__ import annotations

import json
import time
import uuid
from pathlib import Path
from typing import Any

from rmqkit.topology import load_topology
from rmqkit.topology.apply import declare_topology
from tests import broker
from tests.consumer_harness import ROOT, ConsumerProcess, wait_until
from tests.flow_handlers import read_rows
from tests.ports import free_port
from tests.supervision import (
    CLIPS,
    CLIPS_PARKING,
    LARGE,
    SERVED,
    TWO_LANES,
    consumer_count,
    declare_two_lanes,
    delete_queue,
    jobs,
    readyz,
)
from tests.supervision import SLOW as SLOW_LANE

TOPOLOGY = str(ROOT / "tests" / "topologies" / "lanes.toml")
WORK, LANE, PARKING = "media.work", "media.work.lane.slow", "media.work.parking"
SLOW, SMALL = 8, 100


def declare_lanes(vhost: str) -> None:
    """Declare lanes.toml: the work queue, its lane queue, their wait queues, one parking."""
    broker.run(declare_topology(broker.settings_for(vhost), load_topology(TOPOLOGY)))
    assert LANE in broker.queue_names(vhost)


def bodies(kind: str, count: int, sleep: float) -> list[tuple[str, bytes]]:
    return [
        (
            f"{kind}-{i:03d}-{uuid.uuid4().hex[:4]}",
            json.dumps({"kind": kind, "sleep": sleep, "sent": time.time()}).encode(),
        )
        for i in range(count)
    ]


def consumers_of(vhost: str, queue: str) -> list[dict[str, Any]]:
    found = broker.mgmt_queue(vhost, queue) or {}
    details: list[dict[str, Any]] = found.get("consumer_details") or []
    return details


def test_a_saturated_slow_lane_does_not_hold_up_the_work_queue(
    fresh_vhost: Any, tmp_path: Path
) -> None:
    vhost = fresh_vhost()
    declare_lanes(vhost)
    ledger = tmp_path / "ledger.db"
    out = f"{ledger}.jsonl"
    consumer = ConsumerProcess(
        vhost, ledger, handler="tests.flow_handlers:timed", queue=WORK, topology=TOPOLOGY
    )
    try:
        # one consumer on each queue, each channel with its own prefetch (the lane's is 2)
        assert broker.wait_for(
            lambda: consumers_of(vhost, WORK) and consumers_of(vhost, LANE), timeout_s=20
        ), consumer.output()
        assert [c["prefetch_count"] for c in consumers_of(vhost, LANE)] == [2]
        assert [c["prefetch_count"] for c in consumers_of(vhost, WORK)] == [20]
        # the lane first, saturated (8 jobs of 0.5 s, 2 at a time: 2 s of work), then the small
        # jobs into the work queue
        broker.publish_with_ids(vhost, "", LANE, bodies("slow", SLOW, 0.5))
        assert wait_until(lambda: broker.depths(vhost, [LANE])[LANE] == SLOW - 2, 10)
        broker.publish_with_ids(vhost, "media", "job", bodies("small", SMALL, 0.002))
        assert wait_until(lambda: len(read_rows(out)) == SLOW + SMALL, 30), consumer.output()
        assert wait_until(lambda: _empty(vhost), 10), broker.depths(vhost, [WORK, LANE, PARKING])
    finally:
        assert consumer.stop() == 0
    rows = read_rows(out)
    slow = sorted((r for r in rows if r["kind"] == "slow"), key=lambda r: r["start"])
    small = [r for r in rows if r["kind"] == "small"]
    assert len(slow) == SLOW and len(small) == SMALL
    # the lane never ran more than its 2 slots at once
    assert max(_overlap(slow, r["start"]) for r in slow) <= 2
    # every small job finished while the lane still had slow jobs waiting to start: the last
    # two slow jobs started after the last small one ended
    last_small_end = max(r["end"] for r in small)
    assert sum(r["start"] > last_small_end for r in slow) >= 2, (last_small_end, slow)
    # each message handled once, everything acked
    assert len({r["id"] for r in rows}) == SLOW + SMALL
    assert "parked" not in consumer.output()


def _overlap(rows: list[dict[str, Any]], at: float) -> int:
    return sum(r["start"] <= at < r["end"] for r in rows)


def _empty(vhost: str) -> bool:
    depths = broker.depths(vhost, [WORK, LANE, PARKING])
    return all(v == 0 for v in depths.values())


def test_consume_without_a_topology_finds_the_lanes_on_the_broker(
    fresh_vhost: Any, tmp_path: Path
) -> None:
    vhost = fresh_vhost()
    declare_lanes(vhost)
    ledger = tmp_path / "ledger.db"
    consumer = ConsumerProcess(
        vhost,
        ledger,
        "--no-topology",
        handler="tests.flow_handlers:timed",
        queue=WORK,
        topology=None,
    )
    try:
        broker.publish_with_ids(vhost, "", LANE, bodies("slow", 3, 0.0))
        broker.publish_with_ids(vhost, "media", "job", bodies("small", 3, 0.0))
        assert wait_until(lambda: len(read_rows(f"{ledger}.jsonl")) == 6, 30), consumer.output()
        assert wait_until(lambda: _empty(vhost), 10)
    finally:
        assert consumer.stop() == 0


def test_a_deleted_lane_queue_leaves_the_other_queues_consumed_until_it_is_back(
    fresh_vhost: Any, tmp_path: Path
) -> None:
    """Deleting one lane queue under the consumer: the work queue and the other lane are still
    consumed, the log and /readyz name the missing queue, and once the queue is declared again
    (the topology's declare, same arguments) its messages are consumed too."""
    vhost = fresh_vhost()
    declare_two_lanes(vhost)
    ledger = tmp_path / "ledger.db"
    out = f"{ledger}.jsonl"
    port = free_port()
    consumer = ConsumerProcess(
        vhost,
        ledger,
        "--metrics-port",
        str(port),
        handler="tests.flow_handlers:timed",
        queue=CLIPS,
        topology=TWO_LANES,
    )
    try:
        assert broker.wait_for(
            lambda: all(consumer_count(vhost, q) == 1 for q in SERVED), timeout_s=20
        ), consumer.output()
        delete_queue(vhost, LARGE)
        # /readyz: not ready, naming the missing queue (and only it)
        assert wait_until(lambda: _names_missing(port, LARGE), 15), (
            readyz(port),
            consumer.output(),
        )
        status, text = readyz(port)
        assert status == 503, text
        assert CLIPS not in text.replace(LARGE, ""), text
        # the work queue and the other lane are still consumed
        broker.publish_with_ids(vhost, "clips", "job", jobs("main", 5))
        broker.publish_with_ids(vhost, "", SLOW_LANE, jobs("slow", 3))
        assert wait_until(lambda: len(read_rows(out)) == 8, 20), consumer.output()
        assert wait_until(lambda: _all_empty(vhost, [CLIPS, SLOW_LANE]), 10)
        assert consumer.proc.poll() is None, consumer.output()
        assert f"queue {LARGE!r}" in consumer.output() and "does not exist" in consumer.output()
        # declared again: consumed again, and ready
        declare_two_lanes(vhost)
        broker.publish_with_ids(vhost, "", LARGE, jobs("large", 4))
        assert wait_until(lambda: len(read_rows(out)) == 12, 30), consumer.output()
        assert wait_until(lambda: _all_empty(vhost, [*SERVED, CLIPS_PARKING]), 10)
        assert wait_until(lambda: readyz(port)[0] == 200, 15), readyz(port)
        assert wait_until(lambda: consumer_count(vhost, LARGE) == 1, 15)  # stats lag
    finally:
        assert consumer.stop() == 0, consumer.output()
    kinds = sorted(r["id"].split("-")[0] for r in read_rows(out))
    assert kinds == ["large"] * 4 + ["main"] * 5 + ["slow"] * 3


def _names_missing(port: int, queue: str) -> bool:
    status, text = readyz(port)
    return status == 503 and f"queue {queue!r} does not exist" in text


def _all_empty(vhost: str, names: list[str]) -> bool:
    return all(v == 0 for v in broker.depths(vhost, names).values())

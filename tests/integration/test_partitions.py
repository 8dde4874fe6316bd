"""Partitioned ordering (issue 15 acceptance) through `rmqkit consume`, on the real broker.

``orders.work`` is 4 partition queues behind a consistent-hash exchange on the header ``key``
(tests/topologies/partitions.toml), each single-active-consumer. Two ``consume --queue
orders.work`` processes each consume every partition; the broker keeps one of them active per
partition. 100 keys x 100 versions are published in order; the handler fails the first attempt
of every version ≡ 3 (mod 7), so those come back from their wait queue after newer versions of
their key; the ordering guard (``--dedupe`` on PostgreSQL with ``--order-key-header`` /
``--order-version-header``) skips them as stale. Midway one consumer is killed (-9): the other
takes over its partitions. Per key the applied versions are strictly increasing, the last one
is 99, and every queue ends empty.
"""

from __future__ import annotations

import uuid
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from rmqkit.idempotency import init_store
from rmqkit.topology import load_topology
from rmqkit.topology.apply import declare_topology
from tests import broker
from tests.consumer_harness import ROOT, ConsumerProcess, wait_until
from tests.dedupe_harness import pg_schema_dsn, query

TOPOLOGY = str(ROOT / "tests" / "topologies" / "partitions.toml")
WORK, PARKING = "orders.work", "orders.work.parking"
PARTS = [f"{WORK}.p{i}" for i in range(4)]
KEYS, VERSIONS = 100, 100


@pytest.fixture
def dsn() -> Iterator[str]:
    with pg_schema_dsn("rmqkit_partitions") as made:
        init_store(made)
        query(made, "CREATE TABLE applied (seq BIGSERIAL, k TEXT, version INT, pid INT)")
        yield made


def consumers_of(vhost: str, queue: str) -> list[dict[str, Any]]:
    found = broker.mgmt_queue(vhost, queue) or {}
    details: list[dict[str, Any]] = found.get("consumer_details") or []
    return details


def test_partitioned_versions_apply_in_order_with_two_consumers_and_a_takeover(
    fresh_vhost: Any, tmp_path: Path, dsn: str
) -> None:
    vhost = fresh_vhost()
    broker.run(declare_topology(broker.settings_for(vhost), load_topology(TOPOLOGY)))
    assert set(PARTS) <= broker.queue_names(vhost)
    args = ["--dedupe", dsn, "--order-key-header", "key", "--order-version-header", "version"]

    def start(name: str) -> ConsumerProcess:
        return ConsumerProcess(
            vhost,
            tmp_path / f"{name}.db",
            *args,
            handler="tests.flow_handlers:apply_version",
            queue=WORK,
            topology=TOPOLOGY,
        )

    first, second = start("a"), start("b")
    try:
        # both consume every partition; the broker lets one consumer per partition be active
        assert broker.wait_for(
            lambda: all(len(consumers_of(vhost, p)) == 2 for p in PARTS), timeout_s=30
        ), first.output() + second.output()
        for part in PARTS:
            assert sorted(c["active"] for c in consumers_of(vhost, part)) == [False, True]
        keys = [f"acct-{k:03d}-{uuid.uuid4().hex[:4]}" for k in range(KEYS)]
        messages = [(f"{k}/v{v}", b"{}") for v in range(VERSIONS) for k in keys]
        broker.publish_with_ids(
            vhost,
            "orders",
            "order",
            messages,
            lambda i: {"key": keys[i % KEYS], "version": i // KEYS},
        )
        # kill one consumer while its partitions are busy: the other takes them over
        assert wait_until(lambda: _applied_count(dsn) >= 1500, 60), first.output()
        first.kill()
        assert wait_until(lambda: _done(vhost, dsn), 90), (
            broker.depths(vhost, _all_queues(vhost)),
            second.output()[-3000:],
        )
    finally:
        first.kill()
        assert second.stop() == 0
    rows = query(dsn, "SELECT k, version FROM applied ORDER BY seq")
    applied: dict[str, list[int]] = defaultdict(list)
    for key, version in rows:
        applied[key].append(version)
    assert set(applied) == set(keys)
    for key, versions in applied.items():
        assert versions == sorted(set(versions)), (key, versions)  # strictly increasing
        assert versions[-1] == VERSIONS - 1, key
    # the injected failures came back after newer versions and were skipped, not applied
    assert sum(len(v) for v in applied.values()) < KEYS * VERSIONS
    assert broker.depths(vhost, _all_queues(vhost)) == dict.fromkeys(_all_queues(vhost), 0)


def _applied_count(dsn: str) -> int:
    return int(query(dsn, "SELECT count(*) FROM applied")[0][0])


def _all_queues(vhost: str) -> list[str]:
    return sorted(n for n in broker.queue_names(vhost) if n.startswith(WORK))


def _done(vhost: str, dsn: str) -> bool:
    latest = query(dsn, "SELECT count(*) FROM applied WHERE version = %s", (VERSIONS - 1,))
    if int(latest[0][0]) < KEYS:
        return False
    return all(v == 0 for v in broker.depths(vhost, _all_queues(vhost)).values())

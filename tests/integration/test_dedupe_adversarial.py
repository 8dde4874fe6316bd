"""On-call attacks on `rmqkit consume --dedupe` (issue 13): try to lose, duplicate or misroute
a message, with the real broker and a real store (PostgreSQL schema, SQLite file); every effect
is counted in the database (business rows per id) and every queue's depth on the broker.
"""

from __future__ import annotations

import json
import sqlite3
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from rmqkit.idempotency import init_store
from tests import broker
from tests.consumer_harness import ConsumerProcess, wait_until
from tests.dedupe_harness import business_tables, pg_schema_dsn, query, store_dsn

WORK, WAIT, PARKING = "dda.work", "dda.work.wait.1s", "dda.work.parking"
TOPOLOGY = """
[exchanges.dda]
type = "direct"

[queues."dda.work"]
bind = [{ exchange = "dda", routing_key = "dda" }]
retry_delays = ["1s"]
max_attempts = 3
delivery_limit = 50
prefetch = 100
"""
HANDLERS = "tests.dedupe_handlers"


@pytest.fixture
def topology(tmp_path: Path) -> str:
    path = tmp_path / "dda.toml"
    path.write_text(TOPOLOGY)
    return str(path)


@pytest.fixture
def vhost(fresh_vhost: object, topology: str) -> str:
    made: str = fresh_vhost()  # type: ignore[operator]
    result = broker.cli("declare", topology, vhost=made)
    assert result.returncode == 0, result.stderr
    return made


@pytest.fixture(params=["postgresql", "sqlite"])
def dsn(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    with store_dsn(request.param, tmp_path) as made:
        init_store(made)
        business_tables(made)
        yield made


def _consumer(
    vhost: str, tmp_path: Path, topology: str, dsn: str, handler: str, *args: str
) -> ConsumerProcess:
    ledger = tmp_path / f"c-{uuid.uuid4().hex[:6]}.db"
    return ConsumerProcess(
        vhost,
        ledger,
        "--dedupe",
        dsn,
        *args,
        handler=f"{HANDLERS}:{handler}",
        queue=WORK,
        topology=topology,
    )


def _depths(vhost: str) -> dict[str, int | None]:
    return broker.depths(vhost, broker.queue_names(vhost))


def _empty(vhost: str) -> bool:
    return all(v == 0 for v in _depths(vhost).values())


def _per_id(dsn: str) -> dict[str, int]:
    return dict(query(dsn, "SELECT message_id, count(*) FROM business GROUP BY message_id"))


@pytest.mark.parametrize("end", ["commit", "rollback", "swallow", "sync-commit"])
def test_a_handler_ending_the_transaction_itself_loses_no_other_message(
    end: str,
    dsn: str,
    vhost: str,
    topology: str,
    tmp_path: Path,
    consumers: list[ConsumerProcess],
) -> None:
    """A careless handler runs COMMIT (or ROLLBACK) on the given Transaction in the middle of
    a batch. The ids of the batch's other messages were recorded up front: a COMMIT made them
    permanent before their handlers ran. Each id must still end with exactly one business row
    (the rogue one included, if its COMMIT kept it), and nothing left on the broker."""
    ids = [f"m{i:03d}" for i in range(60)]
    rogue = {ids[5], ids[30]}
    body = {m: json.dumps({end: m in rogue}).encode() for m in ids}
    broker.publish_with_ids(vhost, "dda", "dda", [(m, body[m]) for m in ids])
    handler = "apply_sync_may_commit" if end == "sync-commit" else "apply_may_end_tx"
    consumer = _consumer(vhost, tmp_path, topology, dsn, handler)
    consumers.append(consumer)
    # A handler that always rolls back never takes effect: it ends parked (its own failure),
    # and it takes nobody else with it. One that commits: its COMMIT kept its row and id.
    # A caught SQL error aborts a PostgreSQL transaction (that handler can never commit), not
    # a SQLite one.
    kept = end.endswith("commit") or (end == "swallow" and dsn.startswith("sqlite"))
    parked = 0 if kept else len(rogue)
    expected = {name: 0 for name in broker.queue_names(vhost)} | {PARKING: parked}
    assert wait_until(lambda: _depths(vhost) == expected, 40), (
        _depths(vhost),
        consumer.output()[-3000:],
    )
    assert consumer.stop() == 0
    per_id = _per_id(dsn)
    assert {m: per_id.get(m, 0) for m in ids} == {m: int(m not in rogue or kept) for m in ids}, (
        consumer.output()[-3000:]
    )
    processed = {row[0] for row in query(dsn, "SELECT message_id FROM rmqkit_processed")}
    assert processed >= set(ids) - rogue


def test_ordering_guard_bad_headers_are_parked_with_a_reason_not_looped(
    dsn: str, vhost: str, topology: str, tmp_path: Path, consumers: list[ConsumerProcess]
) -> None:
    """Equal versions: the second is stale (acked, no effect). A missing, non-integer or
    out-of-range (beyond 64 bits) version: parked at once as undecodable with a reason that
    names the header — not retried through the wait queue until exhausted."""
    cases: list[tuple[str, dict[str, object]]] = [
        ("v1", {"k": "a", "v": 1}),
        ("v1-again", {"k": "a", "v": 1}),  # another message, the same version
        ("v2-text", {"k": "a", "v": "2"}),  # a number as text is fine
        ("no-version", {"k": "a"}),
        ("not-int", {"k": "a", "v": "abc"}),
        ("float", {"k": "a", "v": 3.5}),
        ("huge", {"k": "a", "v": str(2**70)}),
        ("min", {"k": "a", "v": str(-(2**63))}),
    ]
    broker.publish_with_ids(
        vhost, "dda", "dda", [(m, b"{}") for m, _ in cases], headers=lambda i: cases[i][1]
    )
    consumer = _consumer(
        vhost,
        tmp_path,
        topology,
        dsn,
        "set_state",
        "--order-key-header",
        "k",
        "--order-version-header",
        "v",
    )
    consumers.append(consumer)
    bad = {"no-version", "not-int", "float", "huge", "min"}
    expected = {name: 0 for name in broker.queue_names(vhost)} | {PARKING: len(bad)}
    assert wait_until(lambda: _depths(vhost) == expected, 20), (
        _depths(vhost),
        consumer.output()[-3000:],
    )
    assert consumer.stop() == 0
    parked = {p["message_id"]: p["headers"] for p in broker.drain(vhost, PARKING)}
    assert set(parked) == bad
    for headers in parked.values():
        assert headers["rmqkit-park-reason"] == "undecodable"
        assert headers["rmqkit-attempt"] == 1 if "rmqkit-attempt" in headers else True
        assert "'v'" in str(headers.get("rmqkit-error-message", "")), headers
    assert query(dsn, "SELECT k, version FROM applied ORDER BY version") == [("a", 1), ("a", 2)]
    assert dict(query(dsn, "SELECT key, version FROM rmqkit_versions")) == {b"a": 2}


def _close_broker_connections(vhost: str) -> int:
    """rabbitmqctl close_all_connections -p VHOST (the management API's list lags behind)."""
    done = broker.rabbitmqctl("close_all_connections", "-p", vhost, "xatk: on-call closed it")
    return int(done.returncode == 0)


def test_store_backends_terminated_and_broker_connections_closed_mid_run(
    vhost: str, topology: str, tmp_path: Path, consumers: list[ConsumerProcess]
) -> None:
    """PostgreSQL: the consumer's backends are terminated (pg_terminate_backend) every 0.3 s —
    before a commit, mid-batch, between commit and ack — and the broker closes its connections
    every 0.8 s (after a commit, before its ack: the redelivery must be a duplicate). At the end
    every id has exactly one business row and no queue holds anything."""
    app = f"xatk_{uuid.uuid4().hex[:8]}"
    with pg_schema_dsn() as base:
        dsn = f"{base}&application_name={app}"  # the consumer's; the test reads via base
        init_store(dsn)
        business_tables(dsn)
        ids = [f"t{i:05d}" for i in range(1000)]
        broker.publish_with_ids(vhost, "dda", "dda", [(m, b"{}") for m in ids])
        consumer = _consumer(vhost, tmp_path, topology, dsn, "apply_slow")
        consumers.append(consumer)
        stop = threading.Event()
        hits = {"pg": 0, "amqp": 0}

        def attack() -> None:
            tick = 0
            while not stop.wait(0.3):
                tick += 1
                hits["pg"] += len(
                    query(
                        base,
                        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                        "WHERE application_name = %s",
                        (app,),
                    )
                )
                if tick % 4 == 0:
                    hits["amqp"] += _close_broker_connections(vhost)

        # Attacks begin once it consumes (a backend cut during its start-up check exits 69).
        assert wait_until(lambda: len(_per_id(base)) > 0, 30), consumer.output()[-3000:]
        attacker = threading.Thread(target=attack, daemon=True)
        attacker.start()
        try:
            wait_until(lambda: len(_per_id(base)) >= len(ids) * 0.8, 6)  # attacks: 6 s at most
        finally:
            stop.set()
            attacker.join()
        assert wait_until(lambda: _empty(vhost), 60), (_depths(vhost), consumer.output()[-3000:])
        assert wait_until(lambda: len(_per_id(base)) == len(ids), 30)
        assert consumer.stop() == 0
        per_id = _per_id(base)
        assert set(per_id) == set(ids) and set(per_id.values()) == {1}, "an effect twice"
        assert hits["pg"] >= 3 and hits["amqp"] >= 1, hits
        logs = consumer.output()
        print(f"\n{hits}, duplicates logged: {logs.count('duplicate: already')}")


def test_a_sync_handler_hanging_past_its_timeout_with_a_write_rolls_back_and_blocks_no_one(
    dsn: str, vhost: str, topology: str, tmp_path: Path, consumers: list[ConsumerProcess]
) -> None:
    """A plain def handler writes, then hangs past --handler-timeout holding the lock (its
    thread cannot be stopped) and writes again when it wakes. The timeout must roll back its
    write and its id (the retry applies it once) and the other messages must not wait for it."""
    ids = [f"h{i:03d}" for i in range(100)]
    body = {m: json.dumps({"hang": m == "h000"}).encode() for m in ids}
    broker.publish_with_ids(vhost, "dda", "dda", [(m, body[m]) for m in ids])
    consumer = _consumer(
        vhost, tmp_path, topology, dsn, "hang_once_sync", "--handler-timeout", "1s"
    )
    consumers.append(consumer)
    others = set(ids) - {"h000"}
    assert wait_until(lambda: others <= set(_per_id(dsn)), 20), consumer.output()[-3000:]
    assert wait_until(lambda: _empty(vhost), 30), (_depths(vhost), consumer.output()[-3000:])
    time.sleep(1.5)  # the hung thread wakes and tries its second write
    assert consumer.stop() == 0
    rows = query(dsn, "SELECT message_id, attempt FROM business")
    assert sorted(rows) == sorted([(m, 1) for m in others] + [("h000", 2)]), rows


def test_retried_and_parked_then_replayed_messages_are_applied_not_swallowed(
    dsn: str, vhost: str, topology: str, tmp_path: Path, consumers: list[ConsumerProcess]
) -> None:
    """While downstream is broken every attempt writes and fails: the id must not be recorded
    (or the retry copy, then the replayed one, would be dropped as a duplicate). After
    `rmqkit parking replay` each message is applied exactly once."""
    query(dsn, "INSERT INTO state (k, version) VALUES ('broken', 1)")
    ids = [f"r{i:02d}" for i in range(10)]
    broker.publish_with_ids(vhost, "dda", "dda", [(m, b"{}") for m in ids])
    consumer = _consumer(vhost, tmp_path, topology, dsn, "apply_unless_switched_off")
    consumers.append(consumer)
    parked = {name: 0 for name in broker.queue_names(vhost)} | {PARKING: len(ids)}
    assert wait_until(lambda: _depths(vhost) == parked, 30), consumer.output()[-3000:]
    assert query(dsn, "SELECT count(*) FROM business")[0][0] == 0
    assert query(dsn, "SELECT count(*) FROM rmqkit_processed")[0][0] == 0
    query(dsn, "DELETE FROM state WHERE k = 'broken'")
    replay = broker.cli("parking", "replay", PARKING, vhost=vhost)
    assert replay.returncode == 0, replay.stderr
    assert wait_until(lambda: _empty(vhost), 20), (_depths(vhost), consumer.output()[-3000:])
    assert consumer.stop() == 0
    assert _per_id(dsn) == {m: 1 for m in ids}


def test_sqlite_two_consumers_of_two_processes_while_pruning(
    vhost: str, topology: str, tmp_path: Path, consumers: list[ConsumerProcess]
) -> None:
    """One SQLite file, two consumers of --processes 2 --concurrency 20 each (four writers),
    the publisher re-sending 10% of ids, and `dedupe prune --batch 500` deleting 40,000 old
    ids in a loop meanwhile: 'database is locked' must neither lose nor loop a message. Then a
    prune shorter than the window is done but warned about."""
    with store_dsn("sqlite", tmp_path) as dsn:
        init_store(dsn)
        business_tables(dsn)
        old = time.time() - 30 * 86400
        query(dsn, "SELECT 1")
        db = sqlite3.connect(dsn.removeprefix("sqlite:///"))
        with db:
            db.executemany(
                "INSERT INTO rmqkit_processed (message_id, queue, processed_at) VALUES (?, ?, ?)",
                ((f"old-{i}", WORK, old) for i in range(40_000)),
            )
        db.close()
        ids = [f"s{i:04d}" for i in range(4000)]
        messages = [(m, b"{}") for m in ids] + [(m, b"{}") for m in ids[::10]]
        broker.publish_with_ids(vhost, "dda", "dda", messages)
        flags = ("--processes", "2", "--concurrency", "20")
        for handler in ("apply", "apply_sync"):
            consumers.append(_consumer(vhost, tmp_path, topology, dsn, handler, *flags))
        prunes = []
        while len(_per_id(dsn)) < len(ids) and len(prunes) < 20:
            prunes.append(broker.cli("dedupe", "prune", "--dsn", dsn, "--batch", "500"))
        assert all(p.returncode == 0 for p in prunes), [p.stderr for p in prunes]
        assert wait_until(lambda: _empty(vhost), 60), (
            _depths(vhost),
            consumers[0].output()[-2000:],
        )
        assert all(c.stop() == 0 for c in consumers)
        logs = "".join(c.output() for c in consumers)
        print(f"\nstore failures logged: {logs.count('dedupe store failed')}")
        assert _per_id(dsn) == {m: 1 for m in ids}
        if prunes:  # the loop ran while the consumers worked
            assert query(dsn, "SELECT count(*) FROM rmqkit_processed")[0][0] == len(ids)
        print(f"\n{len(prunes)} prunes: {[p.stdout.strip()[:80] for p in prunes]}")
        short = broker.cli("dedupe", "prune", "--dsn", dsn, "--older-than", "1s")
        assert short.returncode == 0 and "younger than the window" in short.stderr, short


def test_an_empty_message_id_is_parked_and_a_reused_one_is_a_duplicate(
    dsn: str, vhost: str, topology: str, tmp_path: Path, consumers: list[ConsumerProcess]
) -> None:
    """'' is no id: parked missing_message_id, not recorded. A message_id reused by a
    different message is a duplicate (the documented consequence): acked, never applied."""
    broker.publish_exact(
        vhost,
        "dda",
        [
            ("dda", "", b"{}", {}),
            ("dda", "same", b'{"n": 1}', {}),
            ("dda", "same", b'{"n": 2}', {}),
        ],
    )
    consumer = _consumer(vhost, tmp_path, topology, dsn, "apply")
    consumers.append(consumer)
    expected = {name: 0 for name in broker.queue_names(vhost)} | {PARKING: 1}
    assert wait_until(lambda: _depths(vhost) == expected, 20), consumer.output()[-3000:]
    assert consumer.stop() == 0
    [parked] = broker.drain(vhost, PARKING)
    assert parked["headers"]["rmqkit-park-reason"] == "missing_message_id"
    assert _per_id(dsn) == {"same": 1}
    assert query(dsn, "SELECT message_id FROM rmqkit_processed") == [("same",)]

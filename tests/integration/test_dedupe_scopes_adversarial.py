"""On-call attacks on dedupe scopes and exact ordering keys, one variant beyond each defect
(tests/integration/test_dedupe_scopes.py has the defects themselves), with the real broker and
real stores; assertions on queue depths, each consumer's ledger of effects and the store's rows.

* the same queue name in two vhosts, one store: two consumers, two scopes, every message
  applied by both;
* a scope shared on purpose (``--dedupe-scope``) by the consumers of two queues: every message
  applied exactly once between them, versions shared too; an empty scope is refused;
* prune with one id in two scopes at different ages deletes only the old row;
* keys that differ in one byte (a NUL included) are two keys; bytes and the same text (UTF-8)
  are one key; integer keys, negative and at the 64-bit limits, are keys (``-1`` and ``"-1"``
  one key), a boolean or a float key is parked with a reason.
"""

from __future__ import annotations

import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest

from rmqkit.idempotency import init_store, prune, record
from rmqkit.store import connect, transaction
from rmqkit.topology import declare_topology, load_topology
from tests import broker
from tests.consumer_harness import ConsumerProcess, effects, wait_until
from tests.dedupe_harness import query, store_dsn

TOPOLOGY = """
[exchanges."adv"]
type = "direct"

[queues."adv-a.work"]
bind = [{ exchange = "adv", routing_key = "orders" }]
retry_delays = ["1s"]
max_attempts = 3
delivery_limit = 50

[queues."adv-b.work"]
bind = [{ exchange = "adv", routing_key = "orders" }]
retry_delays = ["1s"]
max_attempts = 3
delivery_limit = 50

[queues."adv-keys.work"]
bind = [{ exchange = "adv", routing_key = "keys" }]
retry_delays = ["1s"]
max_attempts = 3
delivery_limit = 50
"""
A, B, KEYS = "adv-a.work", "adv-b.work", "adv-keys.work"
GUARD = ("--order-key-header", "k", "--order-version-header", "v")


@pytest.fixture(scope="module")
def topology(tmp_path_factory: pytest.TempPathFactory) -> str:
    path = tmp_path_factory.mktemp("adv") / "adv.toml"
    path.write_text(TOPOLOGY)
    return str(path)


def _declare(vhost: str, topology: str) -> str:
    broker.run(declare_topology(broker.settings_for(vhost), load_topology(topology)))
    return vhost


@pytest.fixture(scope="module")
def adv_vhost(vhost: str, topology: str) -> str:
    return _declare(vhost, topology)


@pytest.fixture
def sqlite_dsn(tmp_path: Path) -> Iterator[str]:
    with store_dsn("sqlite", tmp_path) as made:
        init_store(made)
        yield made


def start(
    vhost: str, tmp_path: Path, topology: str, dsn: str, queue: str, *args: str
) -> ConsumerProcess:
    return ConsumerProcess(
        vhost,
        tmp_path / f"{queue}-{uuid.uuid4().hex[:6]}.db",
        "--dedupe",
        dsn,
        *args,
        handler="tests.dedupe_handlers:effect_outside",
        queue=queue,
        topology=topology,
    )


def ledger(consumer: ConsumerProcess) -> Counter[str]:
    return effects(consumer.log_path.with_suffix(".db"))


def _total(running: list[ConsumerProcess]) -> int:
    return sum(sum(ledger(c).values()) for c in running)


def stop_and_check_empty(vhost: str, running: list[ConsumerProcess], queues: list[str]) -> None:
    for consumer in running:
        assert consumer.stop() == 0, consumer.output()[-2000:]
    names = [*queues, *(f"{q}.parking" for q in queues)]
    assert broker.depths(vhost, names) == dict.fromkeys(names, 0)


def test_the_same_queue_name_in_two_vhosts_sharing_one_store(
    fresh_vhost: Any, topology: str, tmp_path: Path, consumers: list[ConsumerProcess]
) -> None:
    """Two environments (vhosts) on one broker, one application database: the queue names
    are the same, the scopes are not — each environment applies its own copy."""
    first, second = _declare(fresh_vhost(), topology), _declare(fresh_vhost(), topology)
    with store_dsn("postgresql", tmp_path) as dsn:
        init_store(dsn)
        running = [start(v, tmp_path, topology, dsn, A) for v in (first, second)]
        consumers.extend(running)
        ids = [uuid.uuid4().hex for _ in range(100)]
        for vhost in (first, second):  # the same ids in both: a replayed environment
            broker.publish_with_ids(vhost, "adv", "orders", [(m, b"{}") for m in ids])
        wait_until(lambda: _total(running) >= 200, 30)
        for vhost, consumer in zip((first, second), running, strict=True):
            stop_and_check_empty(vhost, [consumer], [A])
            assert ledger(consumer) == Counter(ids), vhost
        per_scope = dict(query(dsn, "SELECT scope, count(*) FROM rmqkit_processed GROUP BY scope"))
        assert per_scope == {f"{quote(v, safe='')}/{A}": 100 for v in (first, second)}
        # the vhost is encoded: no vhost name can make its scope another's
        assert all(scope.count("/") == 1 for scope in per_scope)


def test_a_scope_shared_on_purpose_applies_each_message_once_between_two_queues(
    adv_vhost: str,
    topology: str,
    tmp_path: Path,
    sqlite_dsn: str,
    consumers: list[ConsumerProcess],
) -> None:
    """Two queues bound alike (each message arrives in both), consumed as one service: with
    one --dedupe-scope each id takes effect once in all, and the versions are shared too."""
    shared = ("--dedupe-scope", "orders-once", *GUARD)
    running = [start(adv_vhost, tmp_path, topology, sqlite_dsn, q, *shared) for q in (A, B)]
    consumers.extend(running)
    ids = [uuid.uuid4().hex for _ in range(100)]
    broker.publish_with_ids(
        adv_vhost,
        "adv",
        "orders",
        [(m, b"{}") for m in ids],
        headers=lambda i: {"k": f"acct-{i}", "v": 1},
    )
    # every copy handled (200 deliveries) shows as 100 rows: wait for the queues to drain
    wait_until(
        lambda: broker.depths(adv_vhost, [A, B]) == {A: 0, B: 0} and _total(running) >= 100, 30
    )
    stop_and_check_empty(adv_vhost, running, [A, B])
    applied = ledger(running[0]) + ledger(running[1])
    assert applied == Counter(ids), "an id took effect twice, or not at all"
    assert query(sqlite_dsn, "SELECT DISTINCT scope FROM rmqkit_processed") == [("orders-once",)]
    assert query(
        sqlite_dsn, "SELECT count(*) FROM rmqkit_versions WHERE scope = 'orders-once'"
    ) == [(100,)]

    empty = broker.cli(
        "consume", "tests.dedupe_handlers:noop", "--queue", A, "--topology", topology,
        "--dedupe", sqlite_dsn, "--dedupe-scope", " ", vhost=adv_vhost,
    )  # fmt: skip
    assert empty.returncode == 64 and "--dedupe-scope" in empty.stderr, empty.stderr


def test_prune_deletes_only_the_old_row_of_an_id_recorded_in_two_scopes(tmp_path: Path) -> None:
    with store_dsn("postgresql", tmp_path) as dsn:
        init_store(dsn)
        with connect(dsn) as conn, transaction(conn):
            assert record(conn, "same", scope="a") and record(conn, "same", scope="b")
        query(dsn, "UPDATE rmqkit_processed SET processed_at = %s WHERE scope = 'a'", (0.0,))
        assert prune(dsn, older_than_s=3600).deleted == 1
        assert query(dsn, "SELECT scope, message_id FROM rmqkit_processed") == [("b", "same")]


def _run_keys(vhost: str, dsn: str, phases: list[list[tuple[Any, int]]]) -> list[list[str]]:
    """Publish each phase's (key, version) messages and wait until the consumer has settled
    them (the queue drained, and its ledger stable) before the next: the order is the test's."""
    ids: list[list[str]] = []
    for phase in phases:
        made = [uuid.uuid4().hex for _ in phase]
        ids.append(made)
        broker.publish_with_ids(
            vhost,
            "adv",
            "keys",
            [(m, b"{}") for m in made],
            headers=lambda i, p=phase: {"k": p[i][0], "v": p[i][1]},  # type: ignore[misc]
        )
        done = sum(len(p) for p in ids)
        wait_until(
            lambda d=done: _settled(vhost, dsn) >= d,  # type: ignore[misc]
            20,
        )
    return ids


def _settled(vhost: str, dsn: str) -> int:
    """Messages the keys consumer is done with, applied or acked stale (their ids are
    recorded either way: the store's processed ids) or parked (the parking depth)."""
    parked = broker.depths(vhost, [f"{KEYS}.parking"])[f"{KEYS}.parking"] or 0
    return int(query(dsn, "SELECT count(*) FROM rmqkit_processed")[0][0]) + parked


def _keys_consumer(
    vhost: str, tmp_path: Path, topology: str, dsn: str, consumers: list[ConsumerProcess]
) -> ConsumerProcess:
    consumer = start(vhost, tmp_path, topology, dsn, KEYS, *GUARD)
    consumers.append(consumer)
    return consumer


def test_keys_one_byte_apart_are_two_keys_and_bytes_equal_to_text_are_one(
    adv_vhost: str,
    topology: str,
    tmp_path: Path,
    sqlite_dsn: str,
    consumers: list[ConsumerProcess],
) -> None:
    consumer = _keys_consumer(adv_vhost, tmp_path, topology, sqlite_dsn, consumers)
    apart = [b"acct-\x00", b"acct-\x01", b"acct-\x00\x00", b"\xff\xfe", b"\xff\xfd", b"\xff"]
    phases: list[list[tuple[Any, int]]] = [
        [(bytearray(k), 1) for k in apart],  # six keys: every one new
        [("acct-9", 2), ("é", 2)],  # text keys
        [(bytearray(b"acct-9"), 1), (bytearray("é".encode()), 2)],  # the same bytes: not newer
        [(bytearray(b"acct-9"), 3)],  # newer, whichever form it came in
    ]
    ids = _run_keys(adv_vhost, sqlite_dsn, phases)
    stop_and_check_empty(adv_vhost, [consumer], [KEYS])
    applied = ledger(consumer)
    assert applied == Counter([*ids[0], *ids[1], *ids[3]]), "bytes and their text are one key"
    stored = {bytes(k): v for k, v in query(sqlite_dsn, "SELECT key, version FROM rmqkit_versions")}
    assert stored == {**dict.fromkeys(apart, 1), b"acct-9": 3, "é".encode(): 2}


def test_integer_keys_negative_and_at_the_limits_and_what_is_not_a_key(
    adv_vhost: str,
    topology: str,
    tmp_path: Path,
    sqlite_dsn: str,
    consumers: list[ConsumerProcess],
) -> None:
    consumer = _keys_consumer(adv_vhost, tmp_path, topology, sqlite_dsn, consumers)
    limits = [-1, 1, 0, -(2**63), 2**63 - 1, 2**31, -(2**15)]
    phases: list[list[tuple[Any, int]]] = [
        [(k, 1) for k in limits],  # seven keys (AMQP integers of every width)
        [("-1", 1), ("9223372036854775807", 2)],  # the same keys as text: equal, then newer
        [(True, 1), (1.5, 1)],  # not keys: parked with the reason
    ]
    ids = _run_keys(adv_vhost, sqlite_dsn, phases)
    assert consumer.stop() == 0, consumer.output()[-2000:]
    parked = {p["message_id"]: p["headers"] for p in broker.drain(adv_vhost, f"{KEYS}.parking")}
    assert set(parked) == set(ids[2])
    for headers in parked.values():
        assert headers["rmqkit-park-reason"] == "undecodable"
        assert "'k'" in str(headers.get("rmqkit-error-message", "")), headers
    assert broker.depths(adv_vhost, [KEYS]) == {KEYS: 0}
    assert ledger(consumer) == Counter([*ids[0], ids[1][1]])
    stored = {bytes(k): v for k, v in query(sqlite_dsn, "SELECT key, version FROM rmqkit_versions")}
    expected = {str(k).encode(): 1 for k in limits} | {b"9223372036854775807": 2}
    assert stored == expected

"""Dedupe scopes and exact ordering keys, with the real broker and real stores.

* One store shared by the consumers of two queues bound to one exchange (two services, one
  application database), on PostgreSQL and SQLite: each consumer applies every message — ids
  and the ordering guard's versions are per consumer scope (by default vhost and work queue),
  not global to the store.
* Byte-array ordering keys (what Java clients send for ``byte[]``) that are not UTF-8 are
  distinct keys, compared by their bytes; an integer key header is a key, not "missing".
* A consumer refuses (78) a store still in the schema without scopes; ``dedupe init`` upgrades
  it (tests/unit/test_idempotency_upgrade.py covers the upgrade itself).

Assertions are on what the broker and the store hold: queue depths, each consumer's ledger of
effects, rows per scope.
"""

from __future__ import annotations

import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest

from rmqkit.idempotency import init_store
from tests import broker
from tests.consumer_harness import ConsumerProcess, effects, wait_until
from tests.dedupe_harness import BACKENDS, old_store, query, store_dsn

COUNT = 200


def _topology() -> str:
    # Per backend one exchange bound to two work queues (the two services); one queue for
    # the key tests.
    parts = []
    for backend in BACKENDS:
        parts.append(f'[exchanges."sc-{backend}"]\ntype = "direct"\n')
        for service in ("ship", "bill"):
            parts.append(
                f'[queues."{service}-{backend}.work"]\n'
                f'bind = [{{ exchange = "sc-{backend}", routing_key = "orders" }}]\n'
                'retry_delays = ["1s"]\nmax_attempts = 3\ndelivery_limit = 50\n'
            )
    parts.append('[exchanges."sc-keys"]\ntype = "direct"\n')
    for backend in BACKENDS:
        parts.append(
            f'[queues."keys-{backend}.work"]\n'
            f'bind = [{{ exchange = "sc-keys", routing_key = "{backend}" }}]\n'
            'retry_delays = ["1s"]\nmax_attempts = 3\ndelivery_limit = 50\n'
        )
    return "\n".join(parts)


@pytest.fixture(scope="module")
def topology(tmp_path_factory: pytest.TempPathFactory) -> str:
    path = tmp_path_factory.mktemp("scopes") / "scopes.toml"
    path.write_text(_topology())
    return str(path)


@pytest.fixture(scope="module")
def sc_vhost(vhost: str, topology: str) -> str:
    result = broker.cli("declare", topology, vhost=vhost)
    assert result.returncode == 0, result.stderr
    return vhost


@pytest.fixture(params=BACKENDS)
def dsn(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    with store_dsn(request.param, tmp_path) as made:
        init_store(made)
        yield made


def backend_of(dsn: str) -> str:
    return "sqlite" if dsn.startswith("sqlite:") else "postgresql"


def start(
    vhost: str, tmp_path: Path, topology: str, dsn: str, queue: str, *args: str
) -> ConsumerProcess:
    """`rmqkit consume --dedupe DSN` of ``queue`` with the no-transaction handler that writes
    one ledger row per call (tests.handlers' ledger, one per consumer)."""
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


def settle(vhost: str, running: list[ConsumerProcess], expected: int, queues: list[str]) -> None:
    """Wait (bounded) for ``expected`` effects in all, stop the consumers (in-flight messages
    finish; unacked ones go back), then every queue of theirs, parking included, is empty."""
    wait_until(lambda: sum(sum(ledger(c).values()) for c in running) >= expected, 30)
    for consumer in running:
        assert consumer.stop() == 0, consumer.output()[-2000:]
    names = [*queues, *(f"{q}.parking" for q in queues)]
    assert broker.depths(vhost, names) == dict.fromkeys(names, 0)


def scope_of(vhost: str, queue: str) -> str:
    return f"{quote(vhost, safe='')}/{queue}"


def test_two_queues_sharing_one_store_each_apply_every_message(
    dsn: str, sc_vhost: str, topology: str, tmp_path: Path, consumers: list[ConsumerProcess]
) -> None:
    backend = backend_of(dsn)
    ship, bill = f"ship-{backend}.work", f"bill-{backend}.work"
    shipping = start(sc_vhost, tmp_path, topology, dsn, ship)
    billing = start(sc_vhost, tmp_path, topology, dsn, bill)
    consumers.extend([shipping, billing])
    ids = [uuid.uuid4().hex for _ in range(COUNT)]
    broker.publish_with_ids(sc_vhost, f"sc-{backend}", "orders", [(m, b"{}") for m in ids])

    settle(sc_vhost, [shipping, billing], 2 * COUNT, [ship, bill])
    assert ledger(shipping) == Counter(ids), "shipping's copies were taken for duplicates"
    assert ledger(billing) == Counter(ids), "billing's copies were taken for duplicates"
    per_scope = dict(query(dsn, "SELECT scope, count(*) FROM rmqkit_processed GROUP BY scope"))
    assert per_scope == {scope_of(sc_vhost, ship): COUNT, scope_of(sc_vhost, bill): COUNT}


def test_the_ordering_guard_keeps_versions_per_queue(
    dsn: str, sc_vhost: str, topology: str, tmp_path: Path, consumers: list[ConsumerProcess]
) -> None:
    backend = backend_of(dsn)
    ship, bill = f"ship-{backend}.work", f"bill-{backend}.work"
    guard = ("--order-key-header", "k", "--order-version-header", "v")
    shipping = start(sc_vhost, tmp_path, topology, dsn, ship, *guard)
    billing = start(sc_vhost, tmp_path, topology, dsn, bill, *guard)
    consumers.extend([shipping, billing])
    ids = [uuid.uuid4().hex for _ in range(COUNT)]
    broker.publish_with_ids(
        sc_vhost,
        f"sc-{backend}",
        "orders",
        [(m, b"{}") for m in ids],
        headers=lambda i: {"k": f"order-{i}", "v": 1},
    )

    settle(sc_vhost, [shipping, billing], 2 * COUNT, [ship, bill])
    assert ledger(shipping) == Counter(ids), "shipping's versions were taken for stale"
    assert ledger(billing) == Counter(ids), "billing's versions were taken for stale"
    per_scope = dict(query(dsn, "SELECT scope, count(*) FROM rmqkit_versions GROUP BY scope"))
    assert per_scope == {scope_of(sc_vhost, ship): COUNT, scope_of(sc_vhost, bill): COUNT}


def _keyed(
    vhost: str, tmp_path: Path, topology: str, dsn: str, keys: list[Any], versions: list[int]
) -> tuple[ConsumerProcess, list[str]]:
    """Publish one message per (key, version) to the keys queue of the store's backend and run
    a guarded consumer on it until it has settled; its ledger and the ids in order."""
    backend = backend_of(dsn)
    queue = f"keys-{backend}.work"
    consumer = start(
        vhost, tmp_path, topology, dsn, queue, "--order-key-header", "k",
        "--order-version-header", "v",
    )  # fmt: skip
    ids = [uuid.uuid4().hex for _ in keys]
    broker.publish_with_ids(
        vhost,
        "sc-keys",
        backend,
        [(m, b"{}") for m in ids],
        headers=lambda i: {"k": keys[i], "v": versions[i]},
    )
    settle(vhost, [consumer], len(ids), [queue])
    return consumer, ids


def test_byte_array_keys_compare_by_their_bytes(
    dsn: str, sc_vhost: str, topology: str, tmp_path: Path, consumers: list[ConsumerProcess]
) -> None:
    # 200 keys that are not UTF-8 (continuation bytes without a lead byte): decoded with
    # replacement characters every one of them reads "\ufffd\ufffd\ufffd". Version 1 each.
    raw = [bytes([0xFE, 0x80 + i % 64, 0x80 + i // 64]) for i in range(COUNT)]
    keys: list[Any] = [bytearray(k) for k in raw]  # pamqp sends a bytearray as a byte array
    versions = [1] * COUNT
    consumer, ids = _keyed(sc_vhost, tmp_path, topology, dsn, keys, versions)
    consumers.append(consumer)
    assert ledger(consumer) == Counter(ids), "distinct binary keys were merged (acked stale)"
    stored = query(dsn, "SELECT key, version FROM rmqkit_versions")
    assert sorted((bytes(k), v) for k, v in stored) == sorted((k, 1) for k in raw)


def test_an_integer_key_header_is_a_key(
    dsn: str, sc_vhost: str, topology: str, tmp_path: Path, consumers: list[ConsumerProcess]
) -> None:
    keys: list[Any] = list(range(50))
    consumer, ids = _keyed(sc_vhost, tmp_path, topology, dsn, keys, [1] * 50)
    consumers.append(consumer)
    assert ledger(consumer) == Counter(ids), "integer keys were parked as missing"
    stored = dict(query(dsn, "SELECT key, version FROM rmqkit_versions"))
    assert {bytes(k): v for k, v in stored.items()} == {str(k).encode(): 1 for k in keys}


def test_a_consumer_refuses_a_store_without_scopes_until_init_upgrades_it(
    sc_vhost: str, topology: str, tmp_path: Path
) -> None:
    dsn = f"sqlite:///{tmp_path / 'old.db'}"
    old_store(dsn, [("m-1", "ship-sqlite.work")], [("order-1", 3)])
    args = ("consume", "tests.dedupe_handlers:noop", "--queue", "ship-sqlite.work")
    args += ("--topology", topology, "--dedupe", dsn)
    refused = broker.cli(*args, vhost=sc_vhost)
    assert refused.returncode == 78, refused.stderr
    assert "dedupe init" in refused.stderr and "upgrade" in refused.stderr
    upgraded = broker.cli("dedupe", "init", "--dsn", dsn, vhost=sc_vhost)
    assert upgraded.returncode == 0, upgraded.stderr
    scope = scope_of(sc_vhost, "ship-sqlite.work")
    assert query(dsn, "SELECT scope, message_id FROM rmqkit_processed") == [(scope, "m-1")]

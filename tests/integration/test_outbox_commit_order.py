"""An aggregate's rows arrive in id order even when their transactions commit out of order
(PostgreSQL: ids come from a sequence when the row is inserted, visibility when it commits;
SQLite has one writer at a time, so its ids are in commit order already).

The relay holds an aggregate while a transaction that wrote a row of it through ``add`` is
still open (docs/outbox.md, "Order"); variants: test_outbox_delay_adversarial.py.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator

import psycopg
import pytest

import rmqkit.outbox
from tests.integration.test_outbox import collect, declare, drop_schema, outbox, pg_schema_dsn

pytestmark = pytest.mark.broker


@pytest.fixture
def pg() -> Iterator[str]:
    schema, dsn = pg_schema_dsn("rmqkit_obo")
    rmqkit.outbox.init(dsn)
    yield dsn
    drop_schema(schema)


def _add(conn: psycopg.Connection[object], exchange: str, aggregate: str, n: int) -> str:
    return rmqkit.outbox.add(
        conn, exchange=exchange, routing_key="ev", body={"n": n}, aggregate=aggregate
    )


def _ids(dsn: str) -> dict[str, int]:
    with psycopg.connect(dsn) as conn:
        return {str(m): int(i) for m, i in conn.execute("SELECT message_id, id FROM rmqkit_outbox")}


def test_two_transactions_on_one_aggregate_committing_out_of_order(vhost: str, pg: str) -> None:
    """T1 writes order-1's row first (the lower id) and commits last: the relay must not
    publish T2's row ahead of it, though T2's is the only one it can see for a while."""
    exchange, queue = f"co-{uuid.uuid4().hex[:6]}", f"co-{uuid.uuid4().hex[:6]}"
    declare(vhost, exchange, queue)
    first = psycopg.connect(pg)
    second = psycopg.connect(pg)
    try:
        low = _add(first, exchange, "order-1", 1)  # open, uncommitted
        high = _add(second, exchange, "order-1", 2)
        other = _add(second, exchange, "order-2", 1)  # another aggregate: not held
        second.commit()
        ids = _ids(pg)
        assert ids[high] > ids.get(low, 0)  # (low is not visible yet; its id is lower)
        run = outbox("relay", "--dsn", pg, "--once", vhost=vhost)
        assert run.returncode in (0, 3), run.stderr
        early = [m["message_id"] for m in collect(vhost, queue)]
        assert high not in early, "order-1's later row went out while its earlier row could commit"
        assert other in early
        first.commit()
    finally:
        first.close()
        second.close()
    run = outbox("relay", "--dsn", pg, "--once", vhost=vhost)
    assert run.returncode == 0, run.stdout + run.stderr
    got = [m for m in collect(vhost, queue) if m["message_id"] in (low, high)]
    assert [m["message_id"] for m in got] == [low, high]
    assert [json.loads(m["body"])["n"] for m in got] == [1, 2]
    assert _ids(pg)[low] < _ids(pg)[high]

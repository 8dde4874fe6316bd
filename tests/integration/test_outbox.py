"""The outbox end to end: real SQLite file, real PostgreSQL, real broker, counted by message_id.

Issue 12's acceptance: committed events published exactly once and rolled-back ones never;
unroutable rows and rows to a missing exchange stay pending with their error (``--once`` exit 3,
status names them) and go out once the binding exists; unreachable database or broker and a
malformed DSN are one line with the documented exit code. The multi-relay and crash tests are in
test_outbox_relays.py.
"""

from __future__ import annotations

import asyncio
import json
import os
import sqlite3
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aio_pika
import httpx
import psycopg
import pytest

import rmqkit.outbox
from rmqkit.settings import with_vhost
from tests import broker
from tests.ports import free_port

pytestmark = [pytest.mark.broker, pytest.mark.semantics("4.3")]

BASE_DSN = os.environ.get("RMQKIT_TEST_POSTGRES_DSN", "postgresql://postgres@127.0.0.1:5432/test")


# --- helpers (test_outbox_relays.py uses them too) -------------------------------------------
def pg_schema_dsn(prefix: str) -> tuple[str, str]:
    """A fresh schema and a DSN whose search_path is it."""
    schema = f"{prefix}_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(BASE_DSN, autocommit=True) as admin:
        admin.execute(f"CREATE SCHEMA {schema}")
    return schema, f"{BASE_DSN}{'&' if '?' in BASE_DSN else '?'}options=-csearch_path%3D{schema}"


def drop_schema(schema: str) -> None:
    with psycopg.connect(BASE_DSN, autocommit=True) as admin:
        admin.execute(f"DROP SCHEMA {schema} CASCADE")


def declare(vhost: str, exchange: str, queue: str | None, binding: str = "#") -> None:
    """A topic exchange and (optionally) a queue bound to it."""

    async def main() -> None:
        conn = await aio_pika.connect(with_vhost(broker.BASE_URL, vhost))
        try:
            channel = await conn.channel()
            ex = await channel.declare_exchange(exchange, "topic", durable=True)
            if queue is not None:
                q = await channel.declare_queue(queue, durable=True)
                await q.bind(ex, binding)
        finally:
            await conn.close()

    asyncio.run(main())


def collect(vhost: str, queue: str, *, idle_s: float = 1.0) -> list[dict[str, Any]]:
    """Consume everything in ``queue`` until it is idle for ``idle_s``: id, body, headers."""

    async def main() -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        conn = await aio_pika.connect(with_vhost(broker.BASE_URL, vhost))
        try:
            channel = await conn.channel()
            await channel.set_qos(prefetch_count=2000)
            source = await channel.get_queue(queue, ensure=False)
            async with source.iterator(no_ack=True) as messages:
                while True:
                    try:
                        message = await asyncio.wait_for(messages.__anext__(), idle_s)
                    except TimeoutError:
                        return out
                    out.append(
                        {
                            "message_id": message.message_id,
                            "body": message.body,
                            "headers": dict(message.headers or {}),
                            "content_type": message.content_type,
                            "persistent": message.delivery_mode == aio_pika.DeliveryMode.PERSISTENT,
                        }
                    )
        finally:
            await conn.close()

    return asyncio.run(main())


def outbox(*args: str, vhost: str | None, env: dict[str, str] | None = None, timeout: float = 120):
    """``rmqkit outbox ARGS`` in a subprocess (real exit codes)."""
    return broker.cli("outbox", *args, vhost=vhost, env=env, timeout=timeout)


def relay_process(dsn: str, vhost: str, *extra: str, env: dict[str, str] | None = None):
    full = broker.cli_env(vhost)
    full.update(env or {})
    return subprocess.Popen(
        [sys.executable, "-m", "rmqkit", "outbox", "relay", "--dsn", dsn, *extra],
        env=full,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _metrics_answer(port: int) -> bool:
    try:
        return httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


def status_json(dsn: str) -> tuple[int, dict[str, Any]]:
    result = outbox("status", "--dsn", dsn, "--json", vhost=None)
    return result.returncode, json.loads(result.stdout)


# --- fixtures ----------------------------------------------------------------------------------
@pytest.fixture(params=["sqlite", "postgresql"])
def dsn(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path}/app.db"
        return
    schema, pg = pg_schema_dsn("rmqkit_ob")
    yield pg
    drop_schema(schema)


def _connect(dsn: str) -> Any:
    if dsn.startswith("sqlite"):
        return sqlite3.connect(dsn.removeprefix("sqlite:///"))
    return psycopg.connect(dsn)


# --- acceptance --------------------------------------------------------------------------------
def test_only_committed_transactions_are_published(vhost: str, dsn: str) -> None:
    """1,000 transactions (business row + outbox row), 100 rolled back: exactly the 900."""
    exchange, queue = f"orders-{uuid.uuid4().hex[:6]}", f"orders-{uuid.uuid4().hex[:6]}"
    declare(vhost, exchange, queue)
    init = outbox("init", "--dsn", dsn, vhost=None)
    assert init.returncode == 0, init.stderr
    committed: set[str] = set()
    rolled_back: set[str] = set()
    conn = _connect(dsn)
    conn.execute("CREATE TABLE orders (id INTEGER PRIMARY KEY, total INTEGER)")
    conn.commit()
    for n in range(1000):
        conn.execute("INSERT INTO orders (id, total) VALUES (" + str(n) + ", 10)")
        mid = rmqkit.outbox.add(
            conn, exchange=exchange, routing_key="order.created", body={"order": n}
        )
        if n % 10 == 7:
            conn.rollback()
            rolled_back.add(mid)
        else:
            conn.commit()
            committed.add(mid)
    conn.close()
    assert len(committed) == 900

    run = outbox("relay", "--dsn", dsn, "--once", vhost=vhost)
    assert run.returncode == 0, run.stderr
    assert "published 900" in run.stdout
    got = collect(vhost, queue)
    ids = [m["message_id"] for m in got]
    assert len(ids) == 900 and set(ids) == committed  # each once, none rolled back
    assert not set(ids) & rolled_back
    assert all(m["persistent"] and m["content_type"] == "application/json" for m in got)
    code, status = status_json(dsn)
    assert (code, status["pending"], status["failing"]) == (0, 0, 0)
    assert status["published_last_hour"] == 900


def test_unroutable_and_missing_exchange_rows_stay_pending_then_go(vhost: str, dsn: str) -> None:
    ok_ex, queue = f"ok-{uuid.uuid4().hex[:6]}", f"ok-{uuid.uuid4().hex[:6]}"
    missing = f"missing-{uuid.uuid4().hex[:6]}"
    declare(vhost, ok_ex, queue, binding="routed")
    rmqkit.outbox.init(dsn)
    conn = _connect(dsn)
    good = rmqkit.outbox.add(conn, exchange=ok_ex, routing_key="routed", body=b"1")
    unroutable = rmqkit.outbox.add(conn, exchange=ok_ex, routing_key="nobody", body=b"2")
    lost = rmqkit.outbox.add(conn, exchange=missing, routing_key="x", body=b"3", headers={"a": 1})
    conn.commit()
    conn.close()

    first = outbox("relay", "--dsn", dsn, "--once", vhost=vhost)
    assert first.returncode == 3, first.stderr
    assert "left pending 2" in first.stdout
    assert [m["message_id"] for m in collect(vhost, queue)] == [good]
    code, status = status_json(dsn)
    assert code == 1  # failing rows are a warning for monitoring
    assert (status["pending"], status["failing"]) == (2, 2)
    errors = {row["message_id"]: row for row in status["failing_rows"]}
    assert "returned" in errors[unroutable]["last_error"]
    assert "does not exist" in errors[lost]["last_error"]
    assert errors[lost]["attempts"] == errors[unroutable]["attempts"] == 1
    human = outbox("status", "--dsn", dsn, vhost=None)
    assert unroutable in human.stdout and lost in human.stdout and human.returncode == 1

    # still failing: a second --once retries them once each (no hot loop), attempts 2
    assert outbox("relay", "--dsn", dsn, "--once", vhost=vhost).returncode == 3
    _, status = status_json(dsn)
    assert {row["attempts"] for row in status["failing_rows"]} == {2}

    declare(vhost, missing, queue, binding="x")  # the exchange now exists, bound to the queue
    declare(vhost, ok_ex, queue, binding="nobody")  # and the unroutable key is bound
    final = outbox("relay", "--dsn", dsn, "--once", vhost=vhost)
    assert final.returncode == 0, final.stdout + final.stderr
    got = collect(vhost, queue)
    assert sorted(m["message_id"] for m in got) == sorted([unroutable, lost])
    assert next(m for m in got if m["message_id"] == lost)["headers"] == {"a": 1}
    code, status = status_json(dsn)
    assert (code, status["pending"], status["failing"]) == (0, 0, 0)


def test_unreachable_database_broker_and_bad_dsn(vhost: str, tmp_path: Path) -> None:
    dsn = f"sqlite:///{tmp_path}/app.db"
    rmqkit.outbox.init(dsn)
    cases = [
        # database unreachable (nothing listens on port 1)
        (["relay", "--dsn", "postgresql://app:s3cret@127.0.0.1:1/app", "--once"], vhost, None, 69),
        (["status", "--dsn", "postgresql://app:s3cret@127.0.0.1:1/app"], None, None, 69),
        (["init", "--dsn", f"sqlite:///{tmp_path}/no/such/dir/app.db"], None, None, 69),
        # broker unreachable
        (
            ["relay", "--dsn", dsn, "--once"],
            None,
            {"RMQKIT_URL": "amqp://guest:guest@127.0.0.1:1/"},
            69,
        ),
        # malformed / unsupported DSN
        (["relay", "--dsn", "postgresql://app:s3cret@db:notaport/app", "--once"], vhost, None, 78),
        (["status", "--dsn", "mysql://app:s3cret@db/app"], None, None, 78),
        # no outbox table yet
        (["relay", "--dsn", f"sqlite:///{tmp_path}/empty.db", "--once"], vhost, None, 78),
    ]
    for args, on_vhost, env, code in cases:
        result = outbox(*args, vhost=on_vhost, env=env)
        lines = result.stderr.strip().splitlines()
        assert result.returncode == code, (args, result.stderr)
        assert len(lines) == 1 and lines[0].startswith("rmqkit: error: "), (args, lines)
        assert "s3cret" not in result.stderr + result.stdout


def test_two_sqlite_relays_take_turns_under_the_lease(vhost: str, tmp_path: Path) -> None:
    """The second relay waits for the lease instead of publishing the same rows."""
    import signal
    import time

    dsn = f"sqlite:///{tmp_path}/app.db"
    exchange, queue = f"lease-{uuid.uuid4().hex[:6]}", f"lease-{uuid.uuid4().hex[:6]}"
    declare(vhost, exchange, queue)
    rmqkit.outbox.init(dsn)
    conn = _connect(dsn)
    ports = [free_port(), free_port()]
    relays = [
        relay_process(dsn, vhost, "--batch", "50", "--poll", "100ms", "--metrics-port", str(p))
        for p in ports
    ]
    try:
        # Both relays running (their metrics answer once the SIGTERM handler is in place) before
        # any row is committed: under load one could otherwise drain all 2000 while the other is
        # still importing, and the SIGTERM below would find it without a handler.
        deadline = time.monotonic() + 60
        while not all(_metrics_answer(p) for p in ports):
            assert time.monotonic() < deadline and all(r.poll() is None for r in relays)
            time.sleep(0.2)
        ids = [
            rmqkit.outbox.add(conn, exchange=exchange, routing_key="k", body=b"x")
            for _ in range(2000)
        ]
        conn.commit()
        deadline = time.monotonic() + 60
        while conn.execute(
            "SELECT count(*) FROM rmqkit_outbox WHERE published_at IS NULL"
        ).fetchone()[0]:
            assert time.monotonic() < deadline and all(r.poll() is None for r in relays)
            time.sleep(0.2)
    finally:
        for relay in relays:
            relay.send_signal(signal.SIGTERM)
    outputs = [relay.communicate(timeout=30)[0] for relay in relays]
    assert [relay.returncode for relay in relays] == [0, 0], outputs
    got = [m["message_id"] for m in collect(vhost, queue)]
    assert len(got) == 2000 and set(got) == set(ids)  # none twice
    assert got == ids  # one relay at a time: insertion order
    assert conn.execute("SELECT count(*) FROM rmqkit_outbox_lease").fetchone() == (0,)  # released
    conn.close()


def test_retention_deletes_old_published_rows_only(vhost: str, dsn: str) -> None:
    import time

    exchange, queue = f"ret-{uuid.uuid4().hex[:6]}", f"ret-{uuid.uuid4().hex[:6]}"
    declare(vhost, exchange, queue)
    rmqkit.outbox.init(dsn)
    conn = _connect(dsn)
    for _ in range(1200):  # more than one retention chunk (500)
        rmqkit.outbox.add(conn, exchange=exchange, routing_key="k", body=b"old")
    conn.commit()
    assert outbox("relay", "--dsn", dsn, "--once", vhost=vhost).returncode == 0
    time.sleep(1.5)
    rmqkit.outbox.add(conn, exchange=exchange, routing_key="k", body=b"new")
    rmqkit.outbox.add(conn, exchange=f"missing-{uuid.uuid4().hex[:6]}", routing_key="k", body=b"x")
    conn.commit()
    run = outbox("relay", "--dsn", dsn, "--once", "--retention", "1s", vhost=vhost)
    assert run.returncode == 3  # the row to a missing exchange is left pending
    rows = conn.execute(
        "SELECT body, published_at IS NULL FROM rmqkit_outbox ORDER BY id"
    ).fetchall()
    conn.close()
    assert [(bytes(body), pending) for body, pending in rows] == [(b"new", False), (b"x", True)]
    assert len(collect(vhost, queue)) == 1201

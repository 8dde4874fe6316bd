"""The outbox attacked as an on-call engineer would: try to lose, duplicate or misroute events.

Real broker, real PostgreSQL, real SQLite file; every test counts what the broker holds by
message_id and what the table holds. Here: rows the AMQP wire cannot carry (a 256-byte routing
key, a unicode exchange name, an unencodable header), odd but valid rows, a returned or nacked
row in the middle of an aggregate's batch, savepoints and autocommit in ``add``, a daemon relay
without its table, concurrent ``init``. Connection faults and kill -9: test_outbox_faults.py.
"""

from __future__ import annotations

import asyncio
import json
import sqlite3
import subprocess
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aio_pika
import psycopg
import pydantic
import pytest

import rmqkit.outbox
from rmqkit.settings import with_vhost
from tests import broker
from tests.integration.test_outbox import (
    collect,
    declare,
    drop_schema,
    outbox,
    pg_schema_dsn,
    relay_process,
    status_json,
)

pytestmark = pytest.mark.broker

PAUSE = "RMQKIT_OUTBOX_TEST_PAUSE_BEFORE_MARK"
MARKER = "RMQKIT_OUTBOX_TEST_PAUSE_FILE"


@pytest.fixture
def pg() -> Iterator[str]:
    schema, dsn = pg_schema_dsn("rmqkit_oba")
    rmqkit.outbox.init(dsn)
    yield dsn
    drop_schema(schema)


def _names() -> tuple[str, str]:
    return f"ev-{uuid.uuid4().hex[:6]}", f"ev-{uuid.uuid4().hex[:6]}"


def _rows(dsn: str) -> dict[str, tuple[bool, str | None, int]]:
    """message_id -> (published, last_error, attempts) for every row of the table."""
    sql = "SELECT message_id, published_at IS NOT NULL, last_error, attempts FROM rmqkit_outbox"
    if dsn.startswith("sqlite"):
        with sqlite3.connect(dsn.removeprefix("sqlite:///")) as conn:
            found = conn.execute(sql).fetchall()
    else:
        with psycopg.connect(dsn) as pconn:
            found = pconn.execute(sql).fetchall()
    return {str(m): (bool(p), e, int(a)) for m, p, e, a in found}


def _raw_insert(dsn: str, exchange: str, routing_key: str, headers: str | None = None) -> str:
    """A row as a team's own INSERT (or an older rmqkit) could write it: add() not involved."""
    mid = str(uuid.uuid4())
    sql = (
        "INSERT INTO rmqkit_outbox (message_id, exchange, routing_key, body, headers) "
        "VALUES (?, ?, ?, ?, ?)"
    )
    with sqlite3.connect(dsn.removeprefix("sqlite:///")) as conn:
        conn.execute(sql, (mid, exchange, routing_key, b"raw", headers))
    return mid


def _wait(predicate: Any, what: str, timeout_s: float = 30) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, what
        time.sleep(0.1)


def _stop(relay: subprocess.Popen[str]) -> tuple[str, str]:
    relay.terminate()
    return relay.communicate(timeout=30)


# --- rows the AMQP wire cannot carry ------------------------------------------------------------
def test_row_the_wire_cannot_carry_stays_pending_and_blocks_nothing(
    vhost: str, tmp_path: Path
) -> None:
    """256-byte routing key, 258-byte exchange, a unicode exchange name (pamqp refuses it in the
    relay's passive declare), a header integer over 64 bits: each stays pending
    with its error; every other row of the batch is published once; no crash, no loop."""
    dsn = f"sqlite:///{tmp_path}/app.db"
    rmqkit.outbox.init(dsn)
    exchange, queue = _names()
    declare(vhost, exchange, queue)
    conn = sqlite3.connect(tmp_path / "app.db")
    first = rmqkit.outbox.add(conn, exchange=exchange, routing_key="a", body=b"1")
    at_limit = rmqkit.outbox.add(conn, exchange=exchange, routing_key="k" * 255, body=b"2")
    conn.commit()
    with pytest.raises(ValueError, match="255"):  # refused where the mistake is made
        rmqkit.outbox.add(conn, exchange=exchange, routing_key="k" * 256, body=b"x")
    with pytest.raises(ValueError, match="255"):
        rmqkit.outbox.add(conn, exchange="é" * 129, routing_key="a", body=b"x")
    with pytest.raises(ValueError, match="letters, digits"):  # pamqp refuses it in a declare
        rmqkit.outbox.add(conn, exchange="заказы", routing_key="a", body=b"x")
    conn.rollback()
    conn.close()
    too_long = _raw_insert(dsn, exchange, "k" * 256)
    long_exchange = _raw_insert(dsn, "é" * 129, "a")
    unicode_exchange = _raw_insert(dsn, "заказы", "a")
    huge_int = _raw_insert(dsn, exchange, "a", headers=json.dumps({"n": 2**70}))
    last = _raw_insert(dsn, exchange, "a")
    bad = {too_long, long_exchange, unicode_exchange, huge_int}

    for attempt in (1, 2):  # a second run retries each bad row once: no duplicates, no crash
        result = outbox("relay", "--dsn", dsn, "--once", vhost=vhost)
        assert result.returncode == 3, result.stdout + result.stderr
        assert "left pending 4" in result.stdout
        rows = _rows(dsn)
        assert {m for m, (published, _, _) in rows.items() if not published} == bad
        assert all(rows[m][2] == attempt for m in bad)
    got = collect(vhost, queue)
    assert sorted(m["message_id"] for m in got) == sorted([first, at_limit, last])
    rows = _rows(dsn)
    assert "255" in str(rows[too_long][1]) and "255" in str(rows[long_exchange][1])
    assert "letters, digits" in str(rows[unicode_exchange][1])
    assert "encoded" in str(rows[huge_int][1])


class _Order(pydantic.BaseModel):
    id: int
    note: str


def test_odd_but_valid_rows_arrive_intact(vhost: str, tmp_path: Path) -> None:
    dsn = f"sqlite:///{tmp_path}/app.db"
    rmqkit.outbox.init(dsn)
    exchange, queue = f"ev:@#,/+ .{uuid.uuid4().hex[:4]}", f"odd-{uuid.uuid4().hex[:6]}"
    declare(vhost, exchange, queue)
    raw = bytes(range(256)) * 4  # not UTF-8
    huge = bytes(5 * 1024 * 1024)  # 5 MiB: many body frames
    nested = {"trace": {"ids": [1, 2, {"deep": "ü"}], "ok": True}, "n": -(2**40), "none": None}
    conn = sqlite3.connect(tmp_path / "app.db")
    ids = {
        "raw": rmqkit.outbox.add(conn, exchange=exchange, routing_key="r", body=raw),
        "huge": rmqkit.outbox.add(conn, exchange=exchange, routing_key="h", body=huge),
        "nested": rmqkit.outbox.add(
            conn, exchange=exchange, routing_key="n", body={"a": 1}, headers=nested
        ),
        "text": rmqkit.outbox.add(conn, exchange=exchange, routing_key="t", body="grüße ✓"),
        "model": rmqkit.outbox.add(
            conn, exchange=exchange, routing_key="m", body=_Order(id=7, note="ok")
        ),
        "key255": rmqkit.outbox.add(conn, exchange=exchange, routing_key="é" * 127 + "x", body=b""),
    }
    conn.commit()
    conn.close()
    result = outbox("relay", "--dsn", dsn, "--once", vhost=vhost)
    assert result.returncode == 0, result.stdout + result.stderr
    got = {m["message_id"]: m for m in collect(vhost, queue, idle_s=2)}
    assert set(got) == set(ids.values()) and all(m["persistent"] for m in got.values())
    assert got[ids["raw"]]["body"] == raw and got[ids["huge"]]["body"] == huge
    assert got[ids["nested"]]["headers"] == nested
    assert got[ids["text"]]["body"] == "grüße ✓".encode()
    assert got[ids["text"]]["content_type"] == "text/plain; charset=utf-8"
    assert json.loads(got[ids["model"]]["body"]) == {"id": 7, "note": "ok"}
    assert got[ids["model"]]["content_type"] == "application/json"
    assert got[ids["key255"]]["body"] == b""
    assert all(published for published, _, _ in _rows(dsn).values())


# --- order when a row of an aggregate fails -----------------------------------------------------
@pytest.mark.parametrize("backend", ["sqlite", "postgresql"])
def test_a_returned_row_holds_back_the_rest_of_its_aggregate_in_the_same_batch(
    vhost: str, pg: str, tmp_path: Path, backend: str
) -> None:
    """A1 routed, A2 returned, A3/A4 routed, one batch: only A1 goes out; after the binding is
    added, A2, A3, A4 follow in order. Another aggregate in the batch is not held back."""
    dsn = pg if backend == "postgresql" else f"sqlite:///{tmp_path}/app.db"
    rmqkit.outbox.init(dsn)
    exchange, queue = _names()
    declare(vhost, exchange, queue, binding="routed")
    conn: Any = psycopg.connect(pg) if backend == "postgresql" else sqlite3.connect(dsn[10:])
    keys = ["routed", "unbound", "routed", "routed"]
    a = [
        rmqkit.outbox.add(conn, exchange=exchange, routing_key=k, body=b"%d" % n, aggregate="A")
        for n, k in enumerate(keys)
    ]
    b = [
        rmqkit.outbox.add(conn, exchange=exchange, routing_key="routed", body=b"b", aggregate="B")
        for _ in range(3)
    ]
    conn.commit()
    conn.close()
    first = outbox("relay", "--dsn", dsn, "--once", vhost=vhost)
    assert first.returncode == 3, first.stdout + first.stderr
    assert "left pending 3" in first.stdout
    assert [m["message_id"] for m in collect(vhost, queue)] == [a[0], *b]
    rows = _rows(dsn)
    assert "returned" in str(rows[a[1]][1]) and rows[a[1]][2] == 1
    assert [rows[m] for m in a[2:]] == [(False, None, 0)] * 2  # untouched: still waiting

    declare(vhost, exchange, queue, binding="unbound")
    final = outbox("relay", "--dsn", dsn, "--once", vhost=vhost)
    assert final.returncode == 0, final.stdout + final.stderr
    assert [m["message_id"] for m in collect(vhost, queue)] == a[1:]


def test_a_nacked_row_holds_back_its_aggregate_and_nothing_is_lost(vhost: str, pg: str) -> None:
    """A queue with max-length 1 and overflow reject-publish: A0 taken, A1 nacked, A2 not sent;
    after the queue is drained the next run sends A1 then A2."""
    exchange, queue = _names()

    async def full_queue() -> None:
        conn = await aio_pika.connect(with_vhost(broker.BASE_URL, vhost))
        channel = await conn.channel()
        ex = await channel.declare_exchange(exchange, "topic", durable=True)
        arguments = {"x-max-length": 1, "x-overflow": "reject-publish"}
        q = await channel.declare_queue(queue, durable=True, arguments=arguments)
        await q.bind(ex, "#")
        await conn.close()

    asyncio.run(full_queue())
    with psycopg.connect(pg) as conn, conn.transaction():
        a = [
            rmqkit.outbox.add(
                conn, exchange=exchange, routing_key="k", body=b"%d" % n, aggregate="A"
            )
            for n in range(3)
        ]
    first = outbox("relay", "--dsn", pg, "--once", vhost=vhost)
    assert first.returncode == 3 and "nacked 1" in first.stdout, first.stdout + first.stderr
    rows = _rows(pg)
    assert rows[a[0]][0] and "nacked" in str(rows[a[1]][1]) and rows[a[2]] == (False, None, 0)
    code, status = status_json(pg)
    assert code == 1 and [r["message_id"] for r in status["failing_rows"]] == [a[1]]
    got = [m["message_id"] for m in collect(vhost, queue)]  # drains the queue
    assert outbox("relay", "--dsn", pg, "--once", vhost=vhost).returncode == 3  # A1 in, A2 waits
    got += [m["message_id"] for m in collect(vhost, queue)]
    assert outbox("relay", "--dsn", pg, "--once", vhost=vhost).returncode == 0
    got += [m["message_id"] for m in collect(vhost, queue)]
    assert got == a


# --- add() and transactions -------------------------------------------------------------------
def test_savepoint_rollback_autocommit_and_bare_sqlite(pg: str, tmp_path: Path) -> None:
    with psycopg.connect(pg) as conn, conn.transaction():
        kept = rmqkit.outbox.add(conn, exchange="x", routing_key="k", body=b"1")
        with pytest.raises(RuntimeError), conn.transaction():  # a savepoint, rolled back
            gone = rmqkit.outbox.add(conn, exchange="x", routing_key="k", body=b"2")
            raise RuntimeError
        after = rmqkit.outbox.add(conn, exchange="x", routing_key="k", body=b"3")
    assert set(_rows(pg)) == {kept, after} and gone not in _rows(pg)
    # autocommit: the INSERT is its own transaction and commits at once (documented)
    with psycopg.connect(pg, autocommit=True) as conn:
        now = rmqkit.outbox.add(conn, exchange="x", routing_key="k", body=b"4")
        assert now in _rows(pg)

    dsn = f"sqlite:///{tmp_path}/app.db"
    rmqkit.outbox.init(dsn)
    bare = sqlite3.connect(tmp_path / "app.db")  # the module default opens a transaction itself
    mid = rmqkit.outbox.add(bare, exchange="x", routing_key="k", body=b"5")
    assert bare.in_transaction and mid not in _rows(dsn)
    bare.close()  # closed without commit: the row never existed
    assert _rows(dsn) == {}
    auto = sqlite3.connect(tmp_path / "app.db", isolation_level=None)  # autocommit
    mid = rmqkit.outbox.add(auto, exchange="x", routing_key="k", body=b"6")
    auto.close()
    assert set(_rows(dsn)) == {mid}


def test_daemon_without_table_exits_78_and_concurrent_inits(
    vhost: str, pg: str, tmp_path: Path
) -> None:
    empty_schema, empty = pg_schema_dsn("rmqkit_oba")
    try:
        for dsn in (empty, f"sqlite:///{tmp_path}/empty.db"):
            relay = relay_process(dsn, vhost, "--poll", "100ms")
            out, err = relay.communicate(timeout=30)
            assert relay.returncode == 78, out + err
            assert err.strip().count("\n") == 0 and "outbox init" in err
        # the table dropped under a running relay (a migration rolled back): 78 too, one line
        relay = relay_process(pg, vhost, "--poll", "100ms")
        time.sleep(1.5)
        assert relay.poll() is None, relay.communicate()
        with psycopg.connect(pg, autocommit=True) as admin:
            admin.execute("DROP TABLE rmqkit_outbox")
        out, err = relay.communicate(timeout=30)
        assert relay.returncode == 78, out + err
        assert err.strip().count("\n") == 0 and "outbox init" in err
        for dsn in (empty, f"sqlite:///{tmp_path}/twice.db"):
            results: list[int] = []

            def init(target: str = dsn, into: list[int] = results) -> None:
                into.append(outbox("init", "--dsn", target, vhost=None).returncode)

            runs = [threading.Thread(target=init) for _ in range(3)]
            for run in runs:
                run.start()
            for run in runs:
                run.join()
            assert results == [0, 0, 0]
            assert _rows(dsn) == {}
    finally:
        drop_schema(empty_schema)


def test_a_lone_surrogate_in_a_body_is_carried_escaped_or_refused(
    vhost: str, tmp_path: Path
) -> None:
    """A string cut inside an emoji (what JavaScript writes: a lone surrogate) in a JSON body is
    carried escaped, as valid JSON; as a text body it is refused with DataError before anything is
    written. (Before: UnicodeEncodeError escaped outbox.add, a traceback in the caller's app.)"""
    dsn = f"sqlite:///{tmp_path}/app.db"
    rmqkit.outbox.init(dsn)
    exchange, queue = f"sur-{uuid.uuid4().hex[:6]}", f"sur-{uuid.uuid4().hex[:6]}"
    declare(vhost, exchange, queue)
    conn = sqlite3.connect(tmp_path / "app.db")
    mid = rmqkit.outbox.add(conn, exchange=exchange, routing_key="k", body={"note": "cut \ud83d"})
    with pytest.raises(rmqkit.DataError, match="lone surrogate"):
        rmqkit.outbox.add(conn, exchange=exchange, routing_key="k", body="cut \ud83d")
    conn.commit()
    conn.close()
    assert len(_rows(dsn)) == 1  # the refused one wrote nothing
    result = outbox("relay", "--dsn", dsn, "--once", vhost=vhost)
    assert result.returncode == 0, result.stdout + result.stderr
    (got,) = collect(vhost, queue, idle_s=2)
    assert got["message_id"] == mid
    assert got["body"] == b'{"note":"cut \\ud83d"}'
    assert json.loads(got["body"]) == {"note": "cut \ud83d"}

"""The outbox attacked as an on-call engineer would: try to lose, duplicate or misroute events.

Real broker, real PostgreSQL, real SQLite file; every test counts what the broker holds by
message_id and what the table holds. Faults: broker connections closed by the management API
while a daemon relay works, the relay's PostgreSQL backend terminated between confirm and mark,
``kill -9`` of a SQLite relay (the next one takes over when the lease expires), rows the AMQP
wire cannot carry (a 256-byte routing key, an unencodable header), odd but valid rows, a
failing row in the middle of an aggregate's batch, savepoints and autocommit in ``add``.
"""

from __future__ import annotations

import collections
import json
import sqlite3
import subprocess
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pydantic
import pytest

import rmqkit.outbox
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


# --- broker and database faults under a running (daemon) relay -----------------------------------
def _fill(dsn: str, exchange: str, count: int, aggregates: int = 20, start: int = 0) -> list[str]:
    with psycopg.connect(dsn) as conn, conn.pipeline(), conn.transaction():
        return [
            rmqkit.outbox.add(
                conn,
                exchange=exchange,
                routing_key="ev",
                body=json.dumps({"agg": n % aggregates, "seq": n // aggregates}).encode(),
                aggregate=f"agg-{n % aggregates}",
            )
            for n in range(start, start + count)
        ]


def _in_order(got: list[dict[str, Any]]) -> None:
    """Per aggregate, each first copy after the previous one (what an idempotent consumer
    applies: a re-published duplicate of an earlier row is skipped there)."""
    last: dict[int, int] = {}
    seen: set[str] = set()
    for message in got:
        if message["message_id"] in seen:
            continue
        seen.add(message["message_id"])
        body = json.loads(message["body"])
        assert body["seq"] >= last.get(body["agg"], -1), body
        last[body["agg"]] = body["seq"]


def test_broker_connections_closed_while_a_daemon_relay_publishes(vhost: str, pg: str) -> None:
    """Three rounds: 1,500 rows committed, the relay's connection closed by the management API
    (mid-batch or while idle, whichever it hits); the relay reconnects by itself each time."""
    exchange, queue = _names()
    declare(vhost, exchange, queue)
    relay = relay_process(pg, vhost, "--batch", "50", "--poll", "100ms")
    listed, ids, closed = f"/vhosts/{broker.q(vhost)}/connections", [], 0
    try:
        for _ in range(3):
            ids += _fill(pg, exchange, 1500, start=len(ids))
            _wait(lambda: relay.poll() is not None or broker.api("GET", listed).json(), "none")
            assert relay.poll() is None, relay.communicate()[1][-3000:]
            for c in broker.api("GET", listed).json():
                broker.api("DELETE", f"/connections/{broker.q(c['name'])}")
                closed += 1
            code, status = status_json(pg)  # status while the relay works
            assert code in (0, 1) and status["pending"] >= 0
        _wait(lambda: all(p for p, _, _ in _rows(pg).values()), "rows left pending", 40)
        assert relay.poll() is None, relay.communicate()  # it reconnected by itself
    finally:
        out, err = _stop(relay)
    assert relay.returncode == 0, out + err
    assert closed >= 3
    got = collect(vhost, queue)
    counts = collections.Counter(m["message_id"] for m in got)
    assert set(counts) == set(ids)  # nothing lost; re-published rows may repeat
    _in_order(got)
    print(f"relay: {out.strip()}; copies {len(got)} for {len(ids)} rows")


def test_postgres_backend_terminated_between_confirm_and_mark(
    vhost: str, pg: str, tmp_path: Path
) -> None:
    exchange, queue = _names()
    declare(vhost, exchange, queue)
    ids = _fill(pg, exchange, 300)
    marker, app = tmp_path / "paused", f"rmqkit-oba-{uuid.uuid4().hex[:8]}"
    env = {PAUSE: "1", MARKER: str(marker), "PGAPPNAME": app}
    relay = relay_process(pg, vhost, "--batch", "100", "--poll", "100ms", env=env)
    try:
        _wait(marker.exists, "the relay never reached the pause")
        with psycopg.connect(pg, autocommit=True) as admin:
            killed = admin.execute(
                "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
                "WHERE application_name = %s",
                (app,),
            ).fetchone()
        assert killed is not None and killed[0] >= 1
        _wait(lambda: all(p for p, _, _ in _rows(pg).values()), "rows left pending", 40)
        assert relay.poll() is None, relay.communicate()
    finally:
        out, err = _stop(relay)
    assert relay.returncode == 0, out + err
    got = collect(vhost, queue)
    counts = collections.Counter(m["message_id"] for m in got)
    assert set(counts) == set(ids)
    twice = [m for m, n in counts.items() if n > 1]
    assert len(twice) <= 100 and set(twice) <= set(ids[:100])  # only the first batch, at most
    _in_order(got)


def test_kill_9_of_a_sqlite_relay_then_another_takes_over_after_the_lease(
    vhost: str, tmp_path: Path
) -> None:
    dsn = f"sqlite:///{tmp_path}/app.db"
    rmqkit.outbox.init(dsn)
    exchange, queue = _names()
    declare(vhost, exchange, queue)
    conn = sqlite3.connect(tmp_path / "app.db")
    ids = [
        rmqkit.outbox.add(conn, exchange=exchange, routing_key="ev", body=b"%d" % n)
        for n in range(250)
    ]
    conn.commit()
    conn.close()
    marker = tmp_path / "paused"
    first = relay_process(
        dsn, vhost, "--batch", "100", "--lease", "2s", env={PAUSE: "60", MARKER: str(marker)}
    )
    _wait(marker.exists, "the relay never reached the pause")
    first.kill()
    first.communicate()
    second = relay_process(dsn, vhost, "--batch", "100", "--lease", "2s", "--poll", "200ms")
    try:
        _wait(lambda: all(p for p, _, _ in _rows(dsn).values()), "rows left pending", 20)
    finally:
        out, err = _stop(second)
    assert second.returncode == 0, out + err
    counts = collections.Counter(m["message_id"] for m in collect(vhost, queue))
    assert set(counts) == set(ids)
    assert {m for m, n in counts.items() if n > 1} == set(ids[:100])  # the killed batch only


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

"""The relay's claim query on the real PostgreSQL and a real SQLite file: what a second relay may
take while a first one holds a batch (the per-aggregate ordering mechanism, docs/outbox.md)."""

from __future__ import annotations

import os
import sqlite3
import uuid
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

import rmqkit.outbox
from rmqkit.outbox.queries import queries_for
from rmqkit.store import POSTGRESQL, SQLITE

BASE_DSN = os.environ.get("RMQKIT_TEST_POSTGRES_DSN", "postgresql://postgres@127.0.0.1:5432/test")
PG = queries_for(POSTGRESQL)


@pytest.fixture
def pg_dsn() -> Iterator[str]:
    schema = f"rmqkit_obc_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(BASE_DSN, autocommit=True) as admin:
        admin.execute(f"CREATE SCHEMA {schema}")
    dsn = f"{BASE_DSN}{'&' if '?' in BASE_DSN else '?'}options=-csearch_path%3D{schema}"
    rmqkit.outbox.init(dsn)
    yield dsn
    with psycopg.connect(BASE_DSN, autocommit=True) as admin:
        admin.execute(f"DROP SCHEMA {schema} CASCADE")


def _fill(conn: psycopg.Connection | sqlite3.Connection, rows: list[str | None]) -> None:
    for aggregate in rows:
        rmqkit.outbox.add(conn, exchange="", routing_key="q", body=b"x", aggregate=aggregate)


def _claim(conn: psycopg.Connection, limit: int = 100) -> list[tuple[int, str | None]]:
    claimed = [(r[0], r[7]) for r in conn.execute(PG.claim_due, (limit,)).fetchall()]
    conn.execute(PG.release_writers)  # as the relay does once its snapshot is taken
    return claimed


def test_a_second_relay_takes_nothing_of_an_aggregate_the_first_holds(pg_dsn: str) -> None:
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        # ids 1..8: A A B A None B None C
        _fill(conn, ["A", "A", "B", "A", None, "B", None, "C"])
    one = psycopg.connect(pg_dsn, autocommit=True)
    two = psycopg.connect(pg_dsn, autocommit=True)
    try:
        with one.transaction():
            first = _claim(one, limit=3)  # A1 A2 B3: holds aggregates A and B
            assert first == [(1, "A"), (2, "A"), (3, "B")]
            with two.transaction():
                # neither A4 nor B6 (their aggregates are in flight on `one`); free rows and C
                assert _claim(two) == [(5, None), (7, None), (8, "C")]
            one.execute(PG.mark_published_prefix + "(%s, %s, %s)", [1, 2, 3])
        # `one` committed its marks: its aggregates are free, in order, for anyone
        with two.transaction():
            assert _claim(two) == [(4, "A"), (5, None), (6, "B"), (7, None), (8, "C")]
    finally:
        one.close()
        two.close()


def test_a_failing_head_holds_back_its_aggregate_only(pg_dsn: str) -> None:
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        _fill(conn, ["A", "A", "B"])
        conn.execute(PG.mark_failed, ("returned", 60.0, 1))  # A1 backs off for a minute
        assert _claim(conn) == [(3, "B")]  # A2 waits behind A1
        row = conn.execute("SELECT attempts, last_error FROM rmqkit_outbox WHERE id = 1").fetchone()
        assert row == (1, "returned")
        # --once tries every row once whatever its back-off (A1 first, then A2)
        start = conn.execute(PG.now).fetchone()[0] + 1  # type: ignore[index]
        once = conn.execute(PG.claim_once, (start, start, 10)).fetchall()
        assert [r[0] for r in once] == [1, 2, 3]


def test_rows_in_flight_without_aggregate_are_skipped_not_waited_for(pg_dsn: str) -> None:
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        _fill(conn, [None] * 6)
    with (
        psycopg.connect(pg_dsn, autocommit=True) as one,
        psycopg.connect(pg_dsn, autocommit=True) as two,
        one.transaction(),
    ):
        assert [i for i, _ in _claim(one, limit=4)] == [1, 2, 3, 4]
        with two.transaction():
            assert [i for i, _ in _claim(two, limit=4)] == [5, 6]


def test_sqlite_lease_one_relay_at_a_time(tmp_path: Path) -> None:
    dsn = f"sqlite:///{tmp_path}/a.db"
    rmqkit.outbox.init(dsn)
    sql = queries_for(SQLITE)
    conn = sqlite3.connect(tmp_path / "a.db", isolation_level=None)
    assert conn.execute(sql.lease, ("relay-1", 30.0)).rowcount == 1
    assert conn.execute(sql.lease, ("relay-2", 30.0)).rowcount == 0  # waits
    assert conn.execute(sql.lease, ("relay-1", 30.0)).rowcount == 1  # renewal
    conn.execute("UPDATE rmqkit_outbox_lease SET expires_at = 0")  # relay-1 died long ago
    assert conn.execute(sql.lease, ("relay-2", 30.0)).rowcount == 1
    conn.execute(sql.release, ("relay-2",))
    assert conn.execute("SELECT count(*) FROM rmqkit_outbox_lease").fetchone() == (0,)
    _fill(conn, ["A", "A", None])
    assert [r[0] for r in conn.execute(sql.claim_due, (10,)).fetchall()] == [1, 2, 3]

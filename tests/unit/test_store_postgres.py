"""The store layer on the real PostgreSQL (RMQKIT_TEST_POSTGRES_DSN), one schema per test."""

from __future__ import annotations

import asyncio
import os
import uuid
from collections.abc import Iterator

import psycopg
import pytest

from rmqkit.store import POSTGRESQL, Store, dialect_of, transaction

BASE_DSN = os.environ.get("RMQKIT_TEST_POSTGRES_DSN", "postgresql://postgres@127.0.0.1:5432/test")


@pytest.fixture
def pg_dsn() -> Iterator[str]:
    """A DSN whose search_path is a fresh schema, dropped afterwards."""
    schema = f"rmqkit_store_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(BASE_DSN, autocommit=True) as admin:
        admin.execute(f"CREATE SCHEMA {schema}")
    sep = "&" if "?" in BASE_DSN else "?"
    yield f"{BASE_DSN}{sep}options=-csearch_path%3D{schema}"
    with psycopg.connect(BASE_DSN, autocommit=True) as admin:
        admin.execute(f"DROP SCHEMA {schema} CASCADE")


def test_sync_transaction_commits_and_rolls_back(pg_dsn: str) -> None:
    store = Store(pg_dsn)
    assert store.dialect is POSTGRESQL
    with store.transaction() as conn:
        assert dialect_of(conn) is POSTGRESQL
        conn.execute("CREATE TABLE t (k TEXT PRIMARY KEY, v INTEGER)")
        conn.execute(store.dialect.insert_ignore("t", ["k", "v"], ["k"]), ("a", 1))
    with pytest.raises(RuntimeError), store.transaction() as conn:
        conn.execute(store.dialect.q("INSERT INTO t (k, v) VALUES (?, ?)"), ("b", 2))
        raise RuntimeError
    with store.connect() as conn, transaction(conn):
        assert (
            conn.execute(store.dialect.insert_ignore("t", ["k", "v"], ["k"]), ("a", 5)).rowcount
            == 0
        )
        conn.execute(store.dialect.upsert("t", ["k", "v"], ["k"], ["v"]), ("c", 3))
        conn.execute(store.dialect.upsert("t", ["k", "v"], ["k"], ["v"]), ("c", 4))
    with psycopg.connect(pg_dsn) as check:
        assert check.execute("SELECT k, v FROM t ORDER BY k").fetchall() == [("a", 1), ("c", 4)]


def test_async_transaction(pg_dsn: str) -> None:
    store = Store(pg_dsn)

    async def main() -> list[tuple[int]]:
        async with store.transaction_async() as conn:
            assert isinstance(conn, psycopg.AsyncConnection)
            await conn.execute("CREATE TABLE t (a INTEGER)")
            await conn.execute(store.dialect.q("INSERT INTO t (a) VALUES (?)"), (1,))
        with pytest.raises(ValueError):
            async with store.transaction_async() as conn:
                await conn.execute(store.dialect.q("INSERT INTO t (a) VALUES (?)"), (2,))
                raise ValueError
        async with store.connect_async() as conn:
            cursor = await conn.execute(f"SELECT a, {store.dialect.now} FROM t")
            return [(row[0],) for row in await cursor.fetchall()]

    assert asyncio.run(main()) == [(1,)]


def test_a_missing_database_is_unavailable_69() -> None:
    from rmqkit.errors import DatabaseUnavailable

    dsn = BASE_DSN.rsplit("/", 1)[0] + "/rmqkit_no_such_db"
    with pytest.raises(DatabaseUnavailable) as caught, Store(dsn).connect():
        pass
    assert caught.value.exit_code == 69 and "rmqkit_no_such_db" in str(caught.value)

"""The store layer on a real SQLite file: DSNs, masking, dialects, transactions, error mapping."""

from __future__ import annotations

import asyncio
import sqlite3
import sys
from pathlib import Path

import pytest

from rmqkit.errors import ConfigError, DatabaseUnavailable, ExitCode
from rmqkit.store import (
    POSTGRESQL,
    SQLITE,
    AsyncSQLiteConnection,
    Store,
    dialect_of,
    mask_dsn,
    parse_dsn,
    transaction,
)


@pytest.mark.parametrize(
    ("dsn", "backend", "target"),
    [
        ("sqlite:///app.db", "sqlite", "app.db"),
        ("sqlite:///data/app.db", "sqlite", "data/app.db"),
        ("sqlite:////var/lib/app.db", "sqlite", "/var/lib/app.db"),
        ("postgresql://app@db:5432/app", "postgresql", "postgresql://app@db:5432/app"),
        ("postgres://app:pw@db/app", "postgresql", "postgres://app:pw@db/app"),
        ("POSTGRESQL://app@db/app?sslmode=require", "postgresql", None),
    ],
)
def test_good_dsns_parse(dsn: str, backend: str, target: str | None) -> None:
    parsed = parse_dsn(dsn)
    assert parsed.backend == backend
    assert parsed.target == (target or dsn)


@pytest.mark.parametrize(
    "dsn",
    [
        "app.db",
        "sqlite://app.db",
        "sqlite:////",
        "sqlite:///app.db?mode=ro",
        "mysql://root:hunter2@db/app",
        "postgresql+psycopg://root:hunter2@db/app",
        "postgresql://root:hunter2@db:notaport/app",
        "postgresql://root:hunter2@db:70000/app",
        "postgresql://root:hunter2@/app",
    ],
)
def test_bad_dsns_are_config_errors_with_the_password_masked(dsn: str) -> None:
    with pytest.raises(ConfigError) as caught:
        parse_dsn(dsn)
    assert caught.value.exit_code == ExitCode.CONFIG == 78
    assert "hunter2" not in str(caught.value)
    assert "\n" not in str(caught.value)


def test_mask_dsn_hides_every_password_form() -> None:
    assert mask_dsn("postgresql://u:s3cret@h:5432/db") == "postgresql://u:***@h:5432/db"
    assert mask_dsn("postgresql://u:p@ss@h/db") == "postgresql://u:***@h/db"
    assert mask_dsn("postgresql://u@h/db?password=s3cret&x=1") == (
        "postgresql://u@h/db?password=***&x=1"
    )
    assert "s3cret" not in repr(parse_dsn("postgresql://u:s3cret@h/db"))


def test_dialect_sql() -> None:
    assert POSTGRESQL.q("SELECT ? + ?") == "SELECT %s + %s"
    assert SQLITE.q("SELECT ? + ?") == "SELECT ? + ?"
    assert SQLITE.insert_ignore("t", ["a", "b"], ["a"]) == (
        "INSERT INTO t (a, b) VALUES (?, ?) ON CONFLICT (a) DO NOTHING"
    )
    assert POSTGRESQL.upsert("t", ["a", "b"], ["a"], ["b"]) == (
        "INSERT INTO t (a, b) VALUES (%s, %s) ON CONFLICT (a) DO UPDATE SET b = excluded.b"
    )
    assert POSTGRESQL.skip_locked and not SQLITE.skip_locked


@pytest.mark.timing
def test_sqlite_transaction_commits_and_rolls_back_on_the_file(tmp_path: Path) -> None:
    store = Store(f"sqlite:///{tmp_path}/app.db")  # three slashes + absolute tmp path = four
    with store.transaction() as conn:
        conn.execute("CREATE TABLE t (k TEXT PRIMARY KEY, v INTEGER)")
        conn.execute(store.dialect.insert_ignore("t", ["k", "v"], ["k"]), ("a", 1))
    with pytest.raises(RuntimeError), store.transaction() as conn:
        conn.execute(store.dialect.q("INSERT INTO t (k, v) VALUES (?, ?)"), ("b", 2))
        raise RuntimeError("handler failed")
    with store.transaction() as conn:
        cursor = conn.execute(store.dialect.insert_ignore("t", ["k", "v"], ["k"]), ("a", 9))
        assert cursor.rowcount == 0
        conn.execute(store.dialect.upsert("t", ["k", "v"], ["k"], ["v"]), ("c", 3))
        conn.execute(store.dialect.upsert("t", ["k", "v"], ["k"], ["v"]), ("c", 4))
    # what the file holds, read by a separate plain sqlite3 connection
    with sqlite3.connect(tmp_path / "app.db") as check:
        assert check.execute("SELECT k, v FROM t ORDER BY k").fetchall() == [("a", 1), ("c", 4)]
        now = check.execute(f"SELECT {SQLITE.now}").fetchone()[0]
    import time

    assert abs(now - time.time()) < 5


def test_relative_sqlite_dsn_is_relative_to_the_working_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    with Store("sqlite:///rel.db").transaction() as conn:
        conn.execute("CREATE TABLE t (a INTEGER)")
    assert (tmp_path / "rel.db").exists()


def test_async_sqlite_transaction(tmp_path: Path) -> None:
    store = Store(f"sqlite:///{tmp_path}/a.db")

    async def main() -> list[tuple[int]]:
        async with store.transaction_async() as conn:
            assert isinstance(conn, AsyncSQLiteConnection)
            assert dialect_of(conn) is SQLITE
            await conn.execute("CREATE TABLE t (a INTEGER)")
            await conn.execute("INSERT INTO t (a) VALUES (?)", (1,))
        with pytest.raises(ValueError):
            async with store.transaction_async() as conn:
                await conn.execute("INSERT INTO t (a) VALUES (?)", (2,))
                raise ValueError
        async with store.connect_async() as conn:
            cursor = await conn.execute("SELECT a FROM t")
            return await cursor.fetchall()

    assert asyncio.run(main()) == [(1,)]


def test_sqlite_in_a_missing_directory_is_unavailable_69(tmp_path: Path) -> None:
    with (
        pytest.raises(DatabaseUnavailable) as caught,
        Store(f"sqlite:///{tmp_path}/no/a.db").connect(),
    ):
        pass
    assert caught.value.exit_code == ExitCode.UNAVAILABLE == 69


def test_postgres_nobody_listening_is_unavailable_69_masked() -> None:
    dsn = "postgresql://u:hunter2@127.0.0.1:1/db"
    with pytest.raises(DatabaseUnavailable) as caught, Store(dsn).connect():
        pass
    assert caught.value.exit_code == 69
    assert "hunter2" not in str(caught.value) and "127.0.0.1:1" in str(caught.value)


def test_psycopg_missing_says_install_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "psycopg", None)  # import psycopg now raises ImportError
    with pytest.raises(ConfigError, match=r"rmqkit\[postgres\]") as caught:
        Store("postgresql://u@127.0.0.1/db").connect().__enter__()
    assert caught.value.exit_code == 78


def test_dialect_of_refuses_unknown_objects() -> None:
    with pytest.raises(TypeError):
        dialect_of(object())
    with sqlite3.connect(":memory:") as conn:
        assert dialect_of(conn) is SQLITE
    assert transaction  # re-exported

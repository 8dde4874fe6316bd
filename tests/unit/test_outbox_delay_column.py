"""The outbox's delay_ms column: add(delay=...) stores it, and a table created before it existed
(by an older rmqkit or a team's migration) keeps working and is upgraded by ``init``.

Real SQLite files and the real PostgreSQL (RMQKIT_TEST_POSTGRES_DSN), one schema per test."""

from __future__ import annotations

import asyncio
import json
import sqlite3
from datetime import timedelta
from pathlib import Path
from typing import Any

import psycopg
import pytest

import rmqkit.outbox
from rmqkit.crypto import decrypt_fields, generate_keyring
from rmqkit.delay import DelayRangeError
from rmqkit.outbox import add, add_async, add_sqlalchemy
from rmqkit.outbox.queries import queries_for
from rmqkit.outbox.schema import TABLE, ddl
from rmqkit.outbox.write import delay_ms_of
from rmqkit.store import POSTGRESQL, SQLITE, Dialect, Store
from tests.unit.test_outbox_write import pg_dsn  # noqa: F401 (fixture)


def _old_ddl(dialect: Dialect) -> list[str]:
    """The statements of the table's first release (no delay_ms)."""
    statements = [s for s in ddl(dialect) if "ADD COLUMN" not in s]
    statements[0] = statements[0].replace(",\n    delay_ms BIGINT", "")
    assert "delay_ms" not in statements[0]
    return statements


def _delays(conn: Any) -> list[Any]:
    return [r[0] for r in conn.execute(f"SELECT delay_ms FROM {TABLE} ORDER BY id").fetchall()]


def test_delay_values() -> None:
    assert delay_ms_of(None) is None
    assert delay_ms_of("90s") == 90_000
    assert delay_ms_of(timedelta(minutes=2)) == 120_000
    assert delay_ms_of("0s") == 0 and delay_ms_of(timedelta(0)) == 0  # overrides a default
    with pytest.raises(TypeError):
        delay_ms_of(90)  # type: ignore[arg-type]  # seconds or ms? refused, not guessed
    with pytest.raises(DelayRangeError, match="exceeds the maximum"):
        delay_ms_of("30h")
    with pytest.raises(DelayRangeError):
        delay_ms_of("soon")


def test_sqlite_table_without_the_column_is_migrated_by_init(tmp_path: Path) -> None:
    path = tmp_path / "old.db"
    conn = sqlite3.connect(path)
    for statement in _old_ddl(SQLITE):
        conn.execute(statement)
    conn.commit()
    add(conn, exchange="ev", routing_key="k", body={"n": 1})  # no delay: the old columns only
    conn.commit()
    with pytest.raises(sqlite3.OperationalError, match="delay_ms"):
        add(conn, exchange="ev", routing_key="k", body={"n": 2}, delay="5s")
    conn.rollback()
    # the relay's fallback query reads an old table
    assert conn.execute(queries_for(SQLITE, delay_column=False).claim_due, (10,)).fetchall()
    statements = rmqkit.outbox.init(f"sqlite:///{path}")
    assert f"ALTER TABLE {TABLE} ADD COLUMN delay_ms BIGINT" in statements
    assert not any("ADD COLUMN" in s for s in rmqkit.outbox.init(f"sqlite:///{path}"))  # once
    add(conn, exchange="ev", routing_key="k", body={"n": 3}, delay="5s")
    conn.commit()
    assert _delays(conn) == [None, 5000]
    rows = conn.execute(queries_for(SQLITE).claim_due, (10,)).fetchall()
    assert [r[9] for r in rows] == [None, 5000] and all(0 <= r[11] < 60_000 for r in rows)


def test_postgresql_table_without_the_column_is_migrated_by_init(pg_dsn: str) -> None:  # noqa: F811
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        for statement in _old_ddl(POSTGRESQL):
            conn.execute(statement)
        add(conn, exchange="ev", routing_key="k", body={"n": 1})
        rmqkit.outbox.init(pg_dsn)
        rmqkit.outbox.init(pg_dsn)  # idempotent
        add(conn, exchange="ev", routing_key="k", body={"n": 2}, delay=timedelta(seconds=7))
        assert _delays(conn) == [None, 7000]
        claim = POSTGRESQL.q(queries_for(POSTGRESQL).claim_due)
        rows = conn.execute(claim, (10,)).fetchall()
        assert [r[9] for r in rows] == [None, 7000] and all(0 <= r[11] < 60_000 for r in rows)


def test_async_and_sqlalchemy_writers_store_delay_and_ciphertext(tmp_path: Path) -> None:
    sqlalchemy = pytest.importorskip("sqlalchemy")
    from sqlalchemy.orm import Session

    path = tmp_path / "app.db"
    rmqkit.outbox.init(f"sqlite:///{path}")
    ring = generate_keyring()
    enc = rmqkit.outbox.Encryptor(["card.holder"], [], ring)
    body = {"card": {"holder": "SENTINEL-holder"}}

    async def main() -> None:
        async with Store(f"sqlite:///{path}").transaction_async() as aconn:
            await add_async(
                aconn, exchange="ev", routing_key="k", body=body, delay="3s", encryptor=enc
            )

    asyncio.run(main())
    engine = sqlalchemy.create_engine(f"sqlite:///{path}")
    with Session(engine) as session, session.begin():
        add_sqlalchemy(session, exchange="ev", routing_key="k", body=body, encryptor=enc)
        add_sqlalchemy(session, exchange="ev", routing_key="k", body=body, delay="0s")
    engine.dispose()
    with sqlite3.connect(path) as check:
        rows = check.execute(f"SELECT delay_ms, body FROM {TABLE} ORDER BY id").fetchall()
    assert [r[0] for r in rows] == [3000, None, 0]
    assert [b"SENTINEL" in bytes(r[1]) for r in rows] == [False, False, True]
    assert (
        decrypt_fields(bytes(rows[0][1]), None, ring)
        == json.dumps(body, separators=(",", ":")).encode()
    )

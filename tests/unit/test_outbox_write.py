"""rmqkit.outbox.add, add_async, add_sqlalchemy: one row in the caller's transaction, no commit.

Real SQLite files and the real PostgreSQL (RMQKIT_TEST_POSTGRES_DSN), one schema per test."""

from __future__ import annotations

import asyncio
import json
import os
import sqlite3
import uuid
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pydantic
import pytest

import rmqkit.outbox
from rmqkit.outbox import add, add_async, add_sqlalchemy, encode_body
from rmqkit.store import POSTGRESQL, SQLITE, Store

BASE_DSN = os.environ.get("RMQKIT_TEST_POSTGRES_DSN", "postgresql://postgres@127.0.0.1:5432/test")


@pytest.fixture
def pg_dsn() -> Iterator[str]:
    schema = f"rmqkit_obw_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(BASE_DSN, autocommit=True) as admin:
        admin.execute(f"CREATE SCHEMA {schema}")
    yield f"{BASE_DSN}{'&' if '?' in BASE_DSN else '?'}options=-csearch_path%3D{schema}"
    with psycopg.connect(BASE_DSN, autocommit=True) as admin:
        admin.execute(f"DROP SCHEMA {schema} CASCADE")


@pytest.fixture
def sqlite_path(tmp_path: Path) -> Path:
    path = tmp_path / "app.db"
    rmqkit.outbox.init(f"sqlite:///{path}")
    rmqkit.outbox.init(f"sqlite:///{path}")  # idempotent
    return path


class Order(pydantic.BaseModel):
    id: int
    total: float


def test_encode_body() -> None:
    assert encode_body(b"\x00raw") == (b"\x00raw", None)
    assert encode_body("héllo") == ("héllo".encode(), "text/plain; charset=utf-8")
    assert encode_body({"a": [1, 2]}) == (b'{"a":[1,2]}', "application/json")
    assert encode_body(Order(id=1, total=2.5)) == (b'{"id":1,"total":2.5}', "application/json")
    with pytest.raises(TypeError):
        encode_body(object())


def test_a_model_with_aliases_is_written_as_it_is_read_back() -> None:
    """Dumped by field name, an aliased model failed validation in a consumer taking the same
    model (``model_validate_json`` reads aliases): the row must carry the aliases."""
    from pydantic import BaseModel, ConfigDict, Field

    class Invoice(BaseModel):
        model_config = ConfigDict(frozen=True)
        tax_id: str = Field(alias="taxId")
        total: float

    invoice = Invoice(taxId="123", total=2.5)
    data, _ = encode_body(invoice)
    assert data == b'{"taxId":"123","total":2.5}'
    assert Invoice.model_validate_json(data) == invoice


def test_add_on_sqlite_commits_and_rolls_back_with_the_callers_transaction(
    sqlite_path: Path,
) -> None:
    conn = sqlite3.connect(sqlite_path)  # the application's own connection, default mode
    conn.execute("CREATE TABLE orders (id INTEGER PRIMARY KEY)")
    conn.commit()
    with conn:  # commits
        conn.execute("INSERT INTO orders (id) VALUES (1)")
        kept = add(conn, exchange="ev", routing_key="order.created", body={"id": 1}, aggregate="o1")
    with pytest.raises(RuntimeError), conn:  # rolls back
        conn.execute("INSERT INTO orders (id) VALUES (2)")
        add(conn, exchange="ev", routing_key="order.created", body={"id": 2})
        raise RuntimeError
    given = add(
        conn,
        exchange="ev",
        routing_key="k",
        body="text",
        message_id="fixed-id",
        headers={"tenant": "t1", "n": 3},
        content_type="text/x-custom",
    )
    assert given == "fixed-id"
    conn.close()  # never committed by add: the last row is gone with the connection
    check = sqlite3.connect(sqlite_path)
    assert check.execute("SELECT id FROM orders").fetchall() == [(1,)]
    rows = check.execute(
        "SELECT message_id, exchange, routing_key, body, headers, content_type, aggregate, "
        "published_at, attempts FROM rmqkit_outbox"
    ).fetchall()
    assert rows == [
        (kept, "ev", "order.created", b'{"id":1}', None, "application/json", "o1", None, 0)
    ]
    assert uuid.UUID(kept)


def test_add_on_postgres_inside_the_callers_transaction(pg_dsn: str) -> None:
    rmqkit.outbox.init(pg_dsn)
    rmqkit.outbox.init(pg_dsn)
    with psycopg.connect(pg_dsn) as conn:  # not autocommit: the application's usual mode
        conn.execute("CREATE TABLE orders (id INT PRIMARY KEY)")
        conn.commit()
        with conn.transaction():
            conn.execute("INSERT INTO orders VALUES (1)")
            add(conn, exchange="ev", routing_key="k", body=Order(id=1, total=9.5), headers={"h": 1})
        with pytest.raises(ValueError), conn.transaction():
            conn.execute("INSERT INTO orders VALUES (2)")
            add(conn, exchange="ev", routing_key="k", body=b"x")
            raise ValueError
        conn.commit()
    with psycopg.connect(pg_dsn) as check:
        rows = check.execute("SELECT body, headers, content_type FROM rmqkit_outbox").fetchall()
    assert rows == [(b'{"id":1,"total":9.5}', '{"h":1}', "application/json")]


def test_add_async_on_postgres_and_on_async_sqlite(pg_dsn: str, sqlite_path: Path) -> None:
    rmqkit.outbox.init(pg_dsn)

    async def main() -> None:
        async with await psycopg.AsyncConnection.connect(pg_dsn) as conn:
            async with conn.transaction():
                await add_async(conn, exchange="ev", routing_key="k", body="a")
            with pytest.raises(KeyError):
                async with conn.transaction():
                    await add_async(conn, exchange="ev", routing_key="k", body="b")
                    raise KeyError
        async with Store(f"sqlite:///{sqlite_path}").transaction_async() as aconn:
            await add_async(aconn, exchange="ev", routing_key="k", body="c")

    asyncio.run(main())
    with psycopg.connect(pg_dsn) as check:
        assert check.execute("SELECT body FROM rmqkit_outbox").fetchall() == [(b"a",)]
    with sqlite3.connect(sqlite_path) as check:
        assert check.execute("SELECT body FROM rmqkit_outbox").fetchall() == [(b"c",)]


def test_add_refuses_an_async_connection(sqlite_path: Path) -> None:
    async def main() -> None:
        async with Store(f"sqlite:///{sqlite_path}").connect_async() as aconn:
            with pytest.raises(TypeError, match="add_async"):
                add(aconn, exchange="", routing_key="q", body=b"")

    asyncio.run(main())


def test_add_sqlalchemy_session(sqlite_path: Path, pg_dsn: str) -> None:
    sqlalchemy = pytest.importorskip("sqlalchemy")
    from sqlalchemy.orm import Session

    rmqkit.outbox.init(pg_dsn)
    for url in (
        f"sqlite:///{sqlite_path}",
        pg_dsn.replace("postgresql://", "postgresql+psycopg://"),
    ):
        engine = sqlalchemy.create_engine(url)
        with Session(engine) as session, session.begin():
            mid = add_sqlalchemy(session, exchange="ev", routing_key="k", body={"x": 1})
        with Session(engine) as session:
            session.begin()
            add_sqlalchemy(session, exchange="ev", routing_key="k", body={"x": 2})
            session.rollback()
        with engine.connect() as conn:
            rows = conn.execute(sqlalchemy.text("SELECT message_id, body FROM rmqkit_outbox")).all()
        assert [(r[0], bytes(r[1])) for r in rows] == [(mid, b'{"x":1}')]
        engine.dispose()


def test_init_ddl_is_documented_and_idempotent(pg_dsn: str) -> None:
    statements = rmqkit.outbox.init(pg_dsn)
    assert any("rmqkit_outbox_pending" in s for s in statements)
    docs = (Path(__file__).resolve().parents[2] / "docs" / "outbox.md").read_text()
    for dialect in (POSTGRESQL, SQLITE):  # the documented schema is the one init runs
        for statement in rmqkit.outbox.ddl(dialect):
            assert statement + ";" in docs, statement
    with psycopg.connect(pg_dsn) as check:
        indexes = {
            r[0]
            for r in check.execute(
                "SELECT indexname FROM pg_indexes WHERE tablename = 'rmqkit_outbox'"
            )
        }
        assert {
            "rmqkit_outbox_pending",
            "rmqkit_outbox_failing",
            "rmqkit_outbox_published",
        } <= indexes
        json.dumps(list(indexes))

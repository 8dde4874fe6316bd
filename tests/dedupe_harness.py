"""Stores for the idempotency tests: a fresh SQLite file, or a fresh PostgreSQL schema.

PostgreSQL is RMQKIT_TEST_POSTGRES_DSN (default the local ``test`` database, trust auth); each
store is a schema of its own (the DSN's search_path), dropped afterwards, so tests and other
helpers' tables never meet.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg

BASE_PG_DSN = os.environ.get(
    "RMQKIT_TEST_POSTGRES_DSN", "postgresql://postgres@127.0.0.1:5432/test"
)
BACKENDS = ("sqlite", "postgresql")


@contextlib.contextmanager
def pg_schema_dsn(prefix: str = "rmqkit_dedupe") -> Iterator[str]:
    """A DSN whose search_path is a new schema, dropped at the end."""
    schema = f"{prefix}_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(BASE_PG_DSN, autocommit=True) as admin:
        admin.execute(f"CREATE SCHEMA {schema}")
    sep = "&" if "?" in BASE_PG_DSN else "?"
    try:
        yield f"{BASE_PG_DSN}{sep}options=-csearch_path%3D{schema}"
    finally:
        with psycopg.connect(BASE_PG_DSN, autocommit=True) as admin:
            admin.execute(f"DROP SCHEMA {schema} CASCADE")


@contextlib.contextmanager
def store_dsn(backend: str, tmp_path: Path) -> Iterator[str]:
    """A DSN of an empty store of ``backend`` ("sqlite" or "postgresql")."""
    if backend == "sqlite":
        yield f"sqlite:///{tmp_path / 'dedupe.db'}"
        return
    with pg_schema_dsn() as dsn:
        yield dsn


def query(dsn: str, sql: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Run one statement on a new connection (autocommit) and return its rows."""
    if dsn.startswith("sqlite:"):
        db = sqlite3.connect(dsn.removeprefix("sqlite:///"), timeout=30)
        try:
            rows = list(db.execute(sql.replace("%s", "?"), params))
            db.commit()
            return rows
        finally:
            db.close()
    with psycopg.connect(dsn, autocommit=True) as conn:
        cursor = conn.execute(sql, params)
        return list(cursor.fetchall()) if cursor.description else []


BUSINESS_TABLES = (
    "CREATE TABLE business (message_id TEXT NOT NULL, attempt INTEGER NOT NULL)",
    "CREATE TABLE state (k TEXT PRIMARY KEY, version INTEGER NOT NULL)",
    "CREATE TABLE applied (k TEXT NOT NULL, version INTEGER NOT NULL)",
)


def business_tables(dsn: str) -> None:
    """The tables tests.dedupe_handlers write (no unique key: a second effect shows)."""
    for statement in BUSINESS_TABLES:
        query(dsn, statement)


# The tables an rmqkit before scopes created (ids and text keys global to the store): the
# upgrade tests make a store with them, as an existing deployment has it.
OLD_SCHEMA = (
    "CREATE TABLE rmqkit_processed (message_id TEXT PRIMARY KEY, "
    "queue TEXT NOT NULL DEFAULT '', processed_at {float} NOT NULL)",
    "CREATE INDEX rmqkit_processed_at ON rmqkit_processed (processed_at)",
    "CREATE TABLE rmqkit_dedupe_settings (name TEXT PRIMARY KEY, value TEXT NOT NULL)",
    "CREATE TABLE rmqkit_versions (key TEXT PRIMARY KEY, version BIGINT NOT NULL, "
    "updated_at {float} NOT NULL)",
)


def old_store(dsn: str, ids: list[tuple[str, str]], versions: list[tuple[str, int]]) -> None:
    """Make the older rmqkit's tables at ``dsn`` holding ``ids`` ((message_id, queue)) and
    ``versions`` ((key, version)), recorded a minute ago, with a 7-day window."""
    real = "REAL" if dsn.startswith("sqlite:") else "DOUBLE PRECISION"
    for statement in OLD_SCHEMA:
        query(dsn, statement.format(float=real))
    query(dsn, "INSERT INTO rmqkit_dedupe_settings VALUES ('window_s', '604800.0')")
    at = time.time() - 60
    for message_id, queue in ids:
        query(dsn, "INSERT INTO rmqkit_processed VALUES (%s, %s, %s)", (message_id, queue, at))
    for key, version in versions:
        query(dsn, "INSERT INTO rmqkit_versions VALUES (%s, %s, %s)", (key, version, at))


def columns(dsn: str, table: str) -> set[str]:
    """The column names of ``table`` in the store at ``dsn``."""
    if dsn.startswith("sqlite:"):
        return {row[1] for row in query(dsn, f"PRAGMA table_info({table})")}
    rows = query(
        dsn,
        "SELECT attname FROM pg_attribute WHERE attrelid = to_regclass(%s) "
        "AND attnum > 0 AND NOT attisdropped",
        (table,),
    )
    return {row[0] for row in rows}

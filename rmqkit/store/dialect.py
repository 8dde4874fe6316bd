"""The SQL that differs between SQLite and PostgreSQL, in one place.

Queries in rmqkit are written once with ``?`` placeholders and passed through ``Dialect.q``,
which turns them into psycopg's ``%s`` on PostgreSQL; such queries must therefore contain no
literal ``?`` or ``%``. Times are stored as Unix seconds (``double precision`` / ``REAL``) on
both backends, so that ages and back-off deadlines are plain arithmetic in SQL and in Python;
``Dialect.now`` is the SQL expression of the current time in those units.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from rmqkit.store.dsn import Backend


@dataclass(frozen=True)
class Dialect:
    """Backend-specific SQL fragments and capabilities."""

    name: Backend
    placeholder: str  # "?" (sqlite3) or "%s" (psycopg)
    now: str  # SQL: the current time as Unix seconds (a float)
    skip_locked: bool  # SELECT ... FOR UPDATE SKIP LOCKED is available
    id_column: str  # an auto-increment integer primary key, in a CREATE TABLE
    blob: str  # the binary column type
    float_type: str  # the double-precision column type

    def q(self, sql: str) -> str:
        """``sql`` written with ``?`` placeholders, in this backend's placeholder style."""
        return sql if self.placeholder == "?" else sql.replace("?", self.placeholder)

    def params(self, count: int) -> str:
        """``?, ?, ?`` for ``count`` values, in this backend's style."""
        return ", ".join([self.placeholder] * count)

    def insert_ignore(self, table: str, columns: Sequence[str], conflict: Sequence[str]) -> str:
        """An INSERT that does nothing when a row with the same ``conflict`` key exists.

        Both backends speak ``ON CONFLICT (...) DO NOTHING`` (SQLite since 3.24); the cursor's
        ``rowcount`` is then 1 for a new row and 0 for an existing one.
        """
        return (
            f"INSERT INTO {table} ({', '.join(columns)}) VALUES ({self.params(len(columns))}) "
            f"ON CONFLICT ({', '.join(conflict)}) DO NOTHING"
        )

    def upsert(
        self,
        table: str,
        columns: Sequence[str],
        conflict: Sequence[str],
        update: Sequence[str],
    ) -> str:
        """An INSERT that overwrites the ``update`` columns of an existing row with the new ones."""
        sets = ", ".join(f"{column} = excluded.{column}" for column in update)
        return (
            f"INSERT INTO {table} ({', '.join(columns)}) VALUES ({self.params(len(columns))}) "
            f"ON CONFLICT ({', '.join(conflict)}) DO UPDATE SET {sets}"
        )


SQLITE = Dialect(
    name="sqlite",
    placeholder="?",
    now="((julianday('now') - 2440587.5) * 86400.0)",
    skip_locked=False,
    id_column="INTEGER PRIMARY KEY AUTOINCREMENT",
    blob="BLOB",
    float_type="REAL",
)

POSTGRESQL = Dialect(
    name="postgresql",
    placeholder="%s",
    # clock_timestamp(), not now(): now() is frozen at the start of the transaction.
    now="extract(epoch from clock_timestamp())::double precision",
    skip_locked=True,
    id_column="BIGSERIAL PRIMARY KEY",
    blob="BYTEA",
    float_type="DOUBLE PRECISION",
)


def dialect_for(backend: Backend) -> Dialect:
    """The dialect of a backend name."""
    return SQLITE if backend == "sqlite" else POSTGRESQL

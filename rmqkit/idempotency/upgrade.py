"""``init_store``: create the store's tables, or upgrade a store an older rmqkit made.

Older stores keyed ``rmqkit_processed`` on the message id alone and ``rmqkit_versions`` on a
text key alone, so consumers of two queues sharing one database took each other's ids for
duplicates and each other's versions for newer ones. The upgrade, in one transaction (both
backends have transactional DDL: it happens completely or not at all):

* ``rmqkit_processed`` gets the ``scope`` column and the primary key (scope, message_id); each
  old row's scope is that of the queue that recorded it (``default_scope(vhost, queue)``, the
  vhost given to init), so a copy that comes back after the upgrade is still a duplicate; rows
  recorded without a queue (the library's ``record``) get the empty scope, as before;
* ``rmqkit_versions`` gets ``scope`` and a binary ``key`` (the old text keys as their UTF-8
  bytes), primary key (scope, key); its rows did not say who wrote them: they go to
  ``legacy_scope`` if given, else to the scope of the processed ids when those all came from
  one queue, else to the empty scope (where no consumer looks: the first version of each key
  after the upgrade is then applied).

SQLite cannot change a primary key in place: its tables are rebuilt (copy, drop, rename).
PostgreSQL alters them (``ALTER TABLE … ADD COLUMN``, a new primary key), holding their lock
until the commit: stop the consumers (older ones cannot write to the new schema) and upgrade.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Final

from rmqkit.errors import ConfigError
from rmqkit.guard import VERSIONS_TABLE, versions_ddl
from rmqkit.idempotency.schema import (
    DEFAULT_WINDOW_S,
    PROCESSED_TABLE,
    default_scope,
    processed_ddl,
    read_window,
    schema_statements,
    store_errors,
    table_columns,
    write_setting,
)
from rmqkit.store import Dialect, Dsn, as_dsn, connect, dialect_of, transaction

SCHEMA_VERSION: Final = 2  # 1: no scopes (ids and text keys global to the store)


@dataclass(frozen=True)
class Upgrade:
    """What the upgrade of an older store did: rows kept per table, and the scopes given."""

    ids: int = 0
    id_scopes: dict[str, int] = field(default_factory=dict)  # scope -> ids moved into it
    versions: int = 0
    versions_scope: str | None = None  # None: the versions table needed no upgrade


@dataclass(frozen=True)
class InitResult:
    """What ``init_store`` left in place: the store (masked), the window in effect, and the
    upgrade it made (None: the store was new or already current)."""

    dsn: str
    window_s: float
    window_changed: bool
    upgraded: Upgrade | None = None


def init_store(
    dsn: str | Dsn,
    *,
    window_s: float | None = None,
    vhost: str = "/",
    legacy_scope: str | None = None,
) -> InitResult:
    """Create the tables if missing, upgrade an older store's, record the retention window
    (idempotent).

    ``window_s`` None keeps the window already recorded (7 days on a new store); a value
    replaces it. ``vhost`` and ``legacy_scope`` only matter to an upgrade (module docstring):
    the vhost the old rows' queues are in, and the scope to give every old row instead.
    Database failures: DatabaseUnavailable (exit 69); other SQL errors ConfigError (78).
    """
    parsed = as_dsn(dsn)
    if window_s is not None and window_s <= 0:
        raise ConfigError("the dedupe window must be greater than zero")
    with (
        store_errors(parsed, "create the dedupe tables"),
        connect(parsed) as conn,
        transaction(conn),
    ):
        dialect = dialect_of(conn)
        upgraded = _upgrade(conn, dialect, vhost, legacy_scope)
        for statement in schema_statements(dialect):
            conn.execute(statement)
        current = read_window(conn)
        wanted = window_s if window_s is not None else (current or DEFAULT_WINDOW_S)
        if current != wanted:
            write_setting(conn, dialect, "window_s", repr(float(wanted)))
        write_setting(conn, dialect, "schema_version", str(SCHEMA_VERSION))
    changed = current is not None and current != wanted
    return InitResult(parsed.masked, wanted, changed, upgraded)


def outdated_tables(conn: Any, dialect: Dialect) -> list[str]:
    """The store's tables that still have an older rmqkit's schema (no scope column)."""
    return [
        table
        for table in (PROCESSED_TABLE, VERSIONS_TABLE)
        if (columns := table_columns(conn, dialect, table)) is not None and "scope" not in columns
    ]


def _upgrade(conn: Any, dialect: Dialect, vhost: str, legacy_scope: str | None) -> Upgrade | None:
    outdated = outdated_tables(conn, dialect)
    if not outdated:
        return None
    ids, only_scope = 0, ""
    id_scopes: dict[str, int] = {}
    if PROCESSED_TABLE in outdated:
        queues = [row[0] for row in conn.execute(f"SELECT DISTINCT queue FROM {PROCESSED_TABLE}")]
        scopes = {
            queue: legacy_scope
            if legacy_scope is not None
            else (default_scope(vhost, queue) if queue else "")
            for queue in queues
        }
        id_scopes = _upgrade_processed(conn, dialect, scopes)
        ids = sum(id_scopes.values())
        if len(set(scopes.values())) == 1:
            only_scope = next(iter(scopes.values()))
    versions, versions_scope = 0, None
    if VERSIONS_TABLE in outdated:
        versions_scope = legacy_scope if legacy_scope is not None else only_scope
        versions = _upgrade_versions(conn, dialect, versions_scope)
    return Upgrade(ids, id_scopes, versions, versions_scope)


def _primary_key_name(conn: Any, table: str) -> str:
    row = conn.execute(
        "SELECT conname FROM pg_constraint WHERE conrelid = to_regclass(%s) AND contype = 'p'",
        (table,),
    ).fetchone()
    return str(row[0]) if row is not None else ""


def _repoint_primary_key(conn: Any, table: str, columns: str) -> None:
    name = _primary_key_name(conn, table)
    if name:
        conn.execute(f'ALTER TABLE {table} DROP CONSTRAINT "{name}"')
    conn.execute(f"ALTER TABLE {table} ADD PRIMARY KEY ({columns})")


def _upgrade_processed(conn: Any, dialect: Dialect, scopes: dict[str, str]) -> dict[str, int]:
    """Give every old row the scope of its queue; the rows moved per scope."""
    moved: dict[str, int] = {}
    if dialect.name == "sqlite":
        old = f"{PROCESSED_TABLE}_v1"
        # The index keeps its name across the rename: drop it, or the new table would find
        # the name taken and go without one.
        conn.execute(f"DROP INDEX IF EXISTS {PROCESSED_TABLE}_at")
        conn.execute(f"ALTER TABLE {PROCESSED_TABLE} RENAME TO {old}")
        for statement in processed_ddl(dialect):
            conn.execute(statement)
        copy = (
            f"INSERT INTO {PROCESSED_TABLE} (scope, message_id, queue, processed_at) "
            f"SELECT ?, message_id, queue, processed_at FROM {old} WHERE queue = ?"
        )
        for queue, scope in scopes.items():
            count = conn.execute(copy, (scope, queue)).rowcount
            moved[scope] = moved.get(scope, 0) + count
        conn.execute(f"DROP TABLE {old}")
        return moved
    conn.execute(f"ALTER TABLE {PROCESSED_TABLE} ADD COLUMN scope TEXT NOT NULL DEFAULT ''")
    for queue, scope in scopes.items():
        count = conn.execute(
            f"UPDATE {PROCESSED_TABLE} SET scope = %s WHERE queue = %s", (scope, queue)
        ).rowcount
        moved[scope] = moved.get(scope, 0) + count
    _repoint_primary_key(conn, PROCESSED_TABLE, "scope, message_id")
    return moved


def _upgrade_versions(conn: Any, dialect: Dialect, scope: str) -> int:
    """Give every old version row ``scope`` and its key as bytes; the rows kept."""
    if dialect.name == "sqlite":
        old = f"{VERSIONS_TABLE}_v1"
        conn.execute(f"ALTER TABLE {VERSIONS_TABLE} RENAME TO {old}")
        for statement in versions_ddl(dialect):
            conn.execute(statement)
        count: int = conn.execute(
            f"INSERT INTO {VERSIONS_TABLE} (scope, key, version, updated_at) "
            f"SELECT ?, CAST(key AS BLOB), version, updated_at FROM {old}",
            (scope,),
        ).rowcount
        conn.execute(f"DROP TABLE {old}")
        return count
    conn.execute(f"ALTER TABLE {VERSIONS_TABLE} ADD COLUMN scope TEXT NOT NULL DEFAULT ''")
    count = conn.execute(f"UPDATE {VERSIONS_TABLE} SET scope = %s", (scope,)).rowcount
    conn.execute(
        f"ALTER TABLE {VERSIONS_TABLE} ALTER COLUMN key TYPE BYTEA USING convert_to(key, 'UTF8')"
    )
    _repoint_primary_key(conn, VERSIONS_TABLE, "scope, key")
    return count


__all__ = ["SCHEMA_VERSION", "InitResult", "Upgrade", "init_store", "outdated_tables"]

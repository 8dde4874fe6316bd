"""The ordering guard: apply a message only if it is newer than what was applied for its key.

Reordered deliveries (a retry that waited in a wait queue while later messages passed, several
relays or consumers, a replay from parking) reach a consumer out of order. Seed 001 §4 and seed
003 give the defence that needs no global order: every message carries a monotonic version of
the thing it describes (an order's sequence number, an account's balance version), and the
consumer keeps the highest version applied per key and drops anything not newer. Deliveries
then converge to the latest state whatever order they arrive in.

``apply_if_newer(tx, key, version)`` does that on the caller's open transaction, in the table
``rmqkit_versions`` (one row per key: the highest version applied and when), with one
statement — an upsert whose update only happens when the new version is greater — so two
workers racing on a key serialize on its row (PostgreSQL row lock, SQLite's write lock) and
exactly one of them sees True. Because it runs in the caller's transaction, a rollback (the
handler failed) also undoes the version: the message is applied again when it comes back.
A version equal to the stored one is not newer (False): a redelivered copy is not re-applied.
"""

from __future__ import annotations

from typing import Any, Final

from rmqkit.store import AsyncConnection, Dialect, SyncConnection, dialect_of

VERSIONS_TABLE: Final = "rmqkit_versions"
# Stored by lock_keys for a key nothing was applied to yet: every real version is newer.
NO_VERSION: Final = -(2**63)


def versions_ddl(dialect: Dialect) -> list[str]:
    """The statements that create the versions table (idempotent)."""
    return [
        f"CREATE TABLE IF NOT EXISTS {VERSIONS_TABLE} ("
        "key TEXT PRIMARY KEY, "
        "version BIGINT NOT NULL, "
        f"updated_at {dialect.float_type} NOT NULL)"
    ]


def _apply_sql(dialect: Dialect) -> str:
    return dialect.q(
        f"INSERT INTO {VERSIONS_TABLE} (key, version, updated_at) VALUES (?, ?, {dialect.now}) "
        "ON CONFLICT (key) DO UPDATE SET version = excluded.version, "
        "updated_at = excluded.updated_at "
        f"WHERE {VERSIONS_TABLE}.version < excluded.version"
    )


def _check(key: str, version: int) -> None:
    if not isinstance(key, str) or not key:
        raise ValueError("apply_if_newer: the key must be a non-empty string")
    if isinstance(version, bool) or not isinstance(version, int):
        raise ValueError(f"apply_if_newer: the version must be an integer, got {version!r}")
    if not NO_VERSION < version < 2**63:
        raise ValueError(f"apply_if_newer: version {version} does not fit a 64-bit integer")


def apply_if_newer(tx: SyncConnection, key: str, version: int) -> bool:
    """Record ``version`` as the latest applied for ``key`` if it is greater than the one
    stored (or none is); True if so, False for a message that is not newer (skip it).

    ``tx`` is an open transaction on a ``sqlite3.Connection`` or ``psycopg.Connection`` (the
    one a handler receives as ``rmqkit.Transaction``); the table must exist
    (``rmqkit dedupe init``). Never commits.
    """
    _check(key, version)
    cursor: Any = tx.execute(_apply_sql(dialect_of(tx)), (key, version))
    return bool(cursor.rowcount == 1)


async def apply_if_newer_async(tx: AsyncConnection, key: str, version: int) -> bool:
    """``apply_if_newer`` on an asyncio connection (psycopg ``AsyncConnection`` or rmqkit's
    async SQLite connection)."""
    _check(key, version)
    cursor: Any = await tx.execute(_apply_sql(dialect_of(tx)), (key, version))
    return bool(cursor.rowcount == 1)


def apply_sql(dialect: Dialect) -> str:
    """The statement ``apply_if_newer`` runs (parameters: key, version)."""
    return _apply_sql(dialect)


def lock_keys_sql(dialect: Dialect) -> list[str]:
    """Statements that take the row locks of several keys in sorted order (parameter: the list
    of keys, sorted, for each statement); none on SQLite.

    A consumer that handles several messages in one transaction runs these first with the
    batch's keys, so two transactions always lock keys in the same order and cannot deadlock on
    them. On SQLite the write lock already serializes transactions.
    """
    if dialect.name == "sqlite":
        return []
    return [
        # Missing keys get a row (no version yet) so that there is a row to lock.
        f"INSERT INTO {VERSIONS_TABLE} (key, version, updated_at) "
        f"SELECT k, {NO_VERSION}, {dialect.now} FROM unnest(%s::text[]) WITH ORDINALITY "
        "AS t(k, i) ORDER BY i ON CONFLICT (key) DO NOTHING",
        f"SELECT key FROM {VERSIONS_TABLE} WHERE key = ANY(%s::text[]) ORDER BY key FOR UPDATE",
    ]


__all__ = [
    "NO_VERSION",
    "VERSIONS_TABLE",
    "apply_if_newer",
    "apply_if_newer_async",
    "apply_sql",
    "lock_keys_sql",
    "versions_ddl",
]

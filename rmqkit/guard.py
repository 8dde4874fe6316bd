"""The ordering guard: apply a message only if it is newer than what was applied for its key.

Reordered deliveries (a retry that waited in a wait queue while later messages passed, several
relays or consumers, a replay from parking) reach a consumer out of order. Seed 001 §4 and seed
003 give the defence that needs no global order: every message carries a monotonic version of
the thing it describes (an order's sequence number, an account's balance version), and the
consumer keeps the highest version applied per key and drops anything not newer. Deliveries
then converge to the latest state whatever order they arrive in.

``apply_if_newer(tx, key, version, scope=...)`` does that on the caller's open transaction, in
the table ``rmqkit_versions`` (one row per scope and key: the highest version applied and
when), with one statement — an upsert whose update only happens when the new version is
greater — so two workers racing on a key serialize on its row (PostgreSQL row lock, SQLite's
write lock) and exactly one of them sees True. Because it runs in the caller's transaction, a
rollback (the handler failed) also undoes the version: the message is applied again when it
comes back. A version equal to the stored one is not newer (False): a redelivered copy is not
re-applied.

The **scope** is whose versions these are: ``rmqkit consume`` uses its work queue (with its
vhost), so two services that consume copies of the same events from their own queues into one
database each keep their own versions. Keys are compared by their exact bytes (the column is
binary): a text key is its UTF-8 bytes, an integer key its decimal digits (``order_key``).
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
        "scope TEXT NOT NULL DEFAULT '', "
        f"key {dialect.blob} NOT NULL, "
        "version BIGINT NOT NULL, "
        f"updated_at {dialect.float_type} NOT NULL, "
        "PRIMARY KEY (scope, key))"
    ]


def order_key(value: object) -> bytes | None:
    """A key as the guard stores it, or None if ``value`` cannot be one.

    Bytes (an AMQP byte-array header, or a string header that is not UTF-8) are kept exactly;
    text is its UTF-8 bytes (so the text ``"a"`` and the bytes ``b"a"`` are one key: the same
    bytes on the wire); an integer is its decimal digits (``42`` and ``"42"`` are one key).
    Empty values, booleans, floats, decimals, timestamps, arrays and tables are not keys.
    """
    if isinstance(value, bytes | bytearray | memoryview):
        key = bytes(value)
    elif isinstance(value, str):
        key = value.encode("utf-8")
    elif isinstance(value, int) and not isinstance(value, bool):
        key = str(value).encode("ascii")
    else:
        return None
    return key or None


def _apply_sql(dialect: Dialect) -> str:
    return dialect.q(
        f"INSERT INTO {VERSIONS_TABLE} (scope, key, version, updated_at) "
        f"VALUES (?, ?, ?, {dialect.now}) "
        "ON CONFLICT (scope, key) DO UPDATE SET version = excluded.version, "
        "updated_at = excluded.updated_at "
        f"WHERE {VERSIONS_TABLE}.version < excluded.version"
    )


def _checked(key: str | bytes | int, version: int) -> bytes:
    stored = order_key(key)
    if stored is None:
        raise ValueError(
            f"apply_if_newer: the key must be non-empty text, bytes or an integer, got {key!r}"
        )
    if isinstance(version, bool) or not isinstance(version, int):
        raise ValueError(f"apply_if_newer: the version must be an integer, got {version!r}")
    if not NO_VERSION < version < 2**63:
        raise ValueError(f"apply_if_newer: version {version} does not fit a 64-bit integer")
    return stored


def apply_if_newer(
    tx: SyncConnection, key: str | bytes | int, version: int, *, scope: str = ""
) -> bool:
    """Record ``version`` as the latest applied for ``key`` in ``scope`` if it is greater than
    the one stored (or none is); True if so, False for a message that is not newer (skip it).

    ``tx`` is an open transaction on a ``sqlite3.Connection`` or ``psycopg.Connection`` (the
    one a handler receives as ``rmqkit.Transaction``); the table must exist
    (``rmqkit dedupe init``). ``scope`` separates independent users of one store (give each
    consumer its own). Never commits.
    """
    stored = _checked(key, version)
    cursor: Any = tx.execute(_apply_sql(dialect_of(tx)), (scope, stored, version))
    return bool(cursor.rowcount == 1)


async def apply_if_newer_async(
    tx: AsyncConnection, key: str | bytes | int, version: int, *, scope: str = ""
) -> bool:
    """``apply_if_newer`` on an asyncio connection (psycopg ``AsyncConnection`` or rmqkit's
    async SQLite connection)."""
    stored = _checked(key, version)
    cursor: Any = await tx.execute(_apply_sql(dialect_of(tx)), (scope, stored, version))
    return bool(cursor.rowcount == 1)


def apply_sql(dialect: Dialect) -> str:
    """The statement ``apply_if_newer`` runs (parameters: scope, key bytes, version)."""
    return _apply_sql(dialect)


def lock_keys_sql(dialect: Dialect) -> list[str]:
    """Statements that take the row locks of several keys of one scope in sorted order
    (parameters of each: the scope, then the list of key bytes, sorted); none on SQLite.

    A consumer that handles several messages in one transaction runs these first with the
    batch's keys, so two transactions always lock keys in the same order and cannot deadlock on
    them. On SQLite the write lock already serializes transactions.
    """
    if dialect.name == "sqlite":
        return []
    return [
        # Missing keys get a row (no version yet) so that there is a row to lock.
        f"INSERT INTO {VERSIONS_TABLE} (scope, key, version, updated_at) "
        f"SELECT %s, k, {NO_VERSION}, {dialect.now} FROM unnest(%s::bytea[]) WITH ORDINALITY "
        "AS t(k, i) ORDER BY i ON CONFLICT (scope, key) DO NOTHING",
        f"SELECT key FROM {VERSIONS_TABLE} WHERE scope = %s AND key = ANY(%s::bytea[]) "
        "ORDER BY key FOR UPDATE",
    ]


__all__ = [
    "NO_VERSION",
    "VERSIONS_TABLE",
    "apply_if_newer",
    "apply_if_newer_async",
    "apply_sql",
    "lock_keys_sql",
    "order_key",
    "versions_ddl",
]

"""Status and pruning of the processed-ids table.

``rmqkit_processed`` cannot grow forever (seed 003): ids older than the retention window are
deleted. ``prune`` deletes them in small batches, each its own short transaction, so a consumer
recording ids meanwhile waits at most for one batch: on PostgreSQL the batch's rows are taken
with ``FOR UPDATE SKIP LOCKED`` (rows a consumer holds are left for the next run, never waited
for); on SQLite each batch holds the write lock briefly and the prune pauses between batches so
that consumers get it in between.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from typing import Any

from rmqkit.errors import ConfigError
from rmqkit.guard import VERSIONS_TABLE
from rmqkit.idempotency.schema import (
    PROCESSED_TABLE,
    format_window,
    read_window,
    store_errors,
    table_columns,
)
from rmqkit.idempotency.upgrade import outdated_tables
from rmqkit.store import Dialect, Dsn, as_dsn, connect, dialect_of, transaction

DEFAULT_BATCH = 10_000


@dataclass(frozen=True)
class ScopeRows:
    """One scope of the store: its processed ids and the ordering guard's keys."""

    scope: str
    ids: int
    keys: int


@dataclass(frozen=True)
class DedupeStatus:
    """What ``rmqkit dedupe status`` shows. Times are Unix seconds; ages in seconds.

    ``outdated``: tables still in an older rmqkit's schema (no scopes): ``rmqkit dedupe init``
    upgrades them, and consumers refuse to start until it has; ``scopes`` is empty then.
    """

    dsn: str
    rows: int
    oldest_at: float | None
    newest_at: float | None
    window_s: float | None
    older_than_window: int  # rows a prune with the window would delete now
    scopes: tuple[ScopeRows, ...] = ()
    outdated: tuple[str, ...] = ()

    @property
    def oldest_age_s(self) -> float | None:
        return None if self.oldest_at is None else max(0.0, time.time() - self.oldest_at)

    def as_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["oldest_age_s"] = self.oldest_age_s
        data["window"] = None if self.window_s is None else format_window(self.window_s)
        return data


@dataclass(frozen=True)
class PruneResult:
    """What one prune did: rows deleted, in how many batches, the cut-off, the longest batch."""

    dsn: str
    deleted: int
    batches: int
    cutoff_at: float
    older_than_s: float
    window_s: float | None
    longest_batch_s: float
    elapsed_s: float

    @property
    def below_window(self) -> bool:
        """Pruned ids younger than the recorded window: their duplicates would apply again."""
        return self.window_s is not None and self.older_than_s < self.window_s

    def as_dict(self) -> dict[str, Any]:
        data = asdict(self)
        data["below_window"] = self.below_window
        return data


def _missing_table(dsn: Dsn) -> ConfigError:
    return ConfigError(
        f"the store {dsn.masked} has no {PROCESSED_TABLE} table — run "
        f"`rmqkit dedupe init --dsn {dsn.masked}` first"
    )


def _table_exists(conn: Any, dialect: Dialect) -> bool:
    return table_columns(conn, dialect, PROCESSED_TABLE) is not None


def _outdated(dsn: Dsn) -> ConfigError:
    return ConfigError(
        f"the dedupe store {dsn.masked} has an older rmqkit's schema (message ids and ordering "
        f"keys without a scope) — run `rmqkit dedupe init --dsn {dsn.masked}` to upgrade it"
    )


def _scopes(conn: Any, dialect: Dialect) -> tuple[ScopeRows, ...]:
    counts: dict[str, list[int]] = {}
    for scope, ids in conn.execute(
        f"SELECT scope, count(*) FROM {PROCESSED_TABLE} GROUP BY scope"
    ).fetchall():
        counts.setdefault(scope, [0, 0])[0] = int(ids)
    if table_columns(conn, dialect, VERSIONS_TABLE) is not None:
        for scope, keys in conn.execute(
            f"SELECT scope, count(*) FROM {VERSIONS_TABLE} GROUP BY scope"
        ).fetchall():
            counts.setdefault(scope, [0, 0])[1] = int(keys)
    return tuple(ScopeRows(scope, ids, keys) for scope, (ids, keys) in sorted(counts.items()))


def dedupe_status(dsn: str | Dsn) -> DedupeStatus:
    """Row count, oldest and newest entry, and the recorded window of the store at ``dsn``.

    ConfigError (78) if the store was never initialised; DatabaseUnavailable (69) if unreachable.
    """
    parsed = as_dsn(dsn)
    with store_errors(parsed, "read the dedupe store"), connect(parsed) as conn:
        dialect = dialect_of(conn)
        if not _table_exists(conn, dialect):
            raise _missing_table(parsed)
        summary: Any = conn.execute(
            f"SELECT count(*), min(processed_at), max(processed_at) FROM {PROCESSED_TABLE}"
        ).fetchone()
        rows, oldest, newest = summary
        window = read_window(conn)
        stale = 0
        if window is not None and rows:
            counted: Any = conn.execute(
                dialect.q(f"SELECT count(*) FROM {PROCESSED_TABLE} WHERE processed_at < ?"),
                (time.time() - window,),
            ).fetchone()
            stale = counted[0]
        outdated = tuple(outdated_tables(conn, dialect))
        scopes = () if outdated else _scopes(conn, dialect)
    return DedupeStatus(
        dsn=parsed.masked,
        rows=int(rows),
        oldest_at=None if oldest is None else float(oldest),
        newest_at=None if newest is None else float(newest),
        window_s=window,
        older_than_window=int(stale),
        scopes=scopes,
        outdated=outdated,
    )


def _delete_sql(dialect: Dialect) -> str:
    if dialect.name == "sqlite":
        return (
            f"DELETE FROM {PROCESSED_TABLE} WHERE rowid IN (SELECT rowid FROM {PROCESSED_TABLE} "
            "WHERE processed_at < ? LIMIT ?)"
        )
    # The row's whole key: the same id may be recorded in several scopes, at other times.
    return (
        f"DELETE FROM {PROCESSED_TABLE} WHERE (scope, message_id) IN (SELECT scope, message_id "
        f"FROM {PROCESSED_TABLE} WHERE processed_at < %s LIMIT %s FOR UPDATE SKIP LOCKED)"
    )


def prune(
    dsn: str | Dsn,
    *,
    older_than_s: float | None = None,
    batch: int = DEFAULT_BATCH,
    pause_s: float | None = None,
) -> PruneResult:
    """Delete ids recorded more than ``older_than_s`` ago (default: the recorded window), at
    most ``batch`` per transaction, pausing ``pause_s`` between batches (default 20 ms on
    SQLite, where the prune and the consumers share one write lock; none on PostgreSQL).
    """
    if batch < 1:
        raise ConfigError("--batch must be at least 1")
    parsed = as_dsn(dsn)
    started = time.monotonic()
    deleted = batches = 0
    longest = 0.0
    with store_errors(parsed, "prune the dedupe store"), connect(parsed) as conn:
        dialect = dialect_of(conn)
        if not _table_exists(conn, dialect):
            raise _missing_table(parsed)
        if outdated_tables(conn, dialect):
            raise _outdated(parsed)
        window = read_window(conn)
        age = older_than_s if older_than_s is not None else window
        if age is None:
            raise ConfigError(
                "no retention window recorded: give --older-than, or run `rmqkit dedupe init`"
            )
        if pause_s is None:
            pause_s = 0.02 if dialect.name == "sqlite" else 0.0
        cutoff = time.time() - age
        sql = _delete_sql(dialect)
        while True:
            batch_started = time.monotonic()
            with transaction(conn):
                count = conn.execute(sql, (cutoff, batch)).rowcount
            longest = max(longest, time.monotonic() - batch_started)
            batches += 1
            deleted += max(0, count)
            if count < batch:
                break
            if pause_s:
                time.sleep(pause_s)
    return PruneResult(
        dsn=parsed.masked,
        deleted=deleted,
        batches=batches,
        cutoff_at=cutoff,
        older_than_s=age,
        window_s=window,
        longest_batch_s=longest,
        elapsed_s=time.monotonic() - started,
    )


def require_current(dsn: str | Dsn) -> DedupeStatus:
    """``dedupe_status``, refusing a store still in an older rmqkit's schema (ConfigError, 78:
    its ids and keys have no scope, and the consumer's statements would fail on it)."""
    status = dedupe_status(dsn)
    if status.outdated:
        raise _outdated(as_dsn(dsn))
    return status


__all__ = [
    "DEFAULT_BATCH",
    "DedupeStatus",
    "PruneResult",
    "ScopeRows",
    "dedupe_status",
    "prune",
    "require_current",
]

"""The relay's and status's SQL, built once per dialect.

Ordering (docs/outbox.md, "Order"): a row is claimed only when every earlier pending row of
its aggregate is claimable too (a row backing off after a failure holds back the rest of its
aggregate), in id order. Only a row that failed (``last_error`` set) can be backing off, so the
check looks at failing rows only, through the ``rmqkit_outbox_failing`` partial index.

On PostgreSQL a relay claims inside a transaction that stays open until its batch is marked,
holding ``FOR UPDATE SKIP LOCKED`` row locks and one transaction advisory lock per aggregate
(``pg_try_advisory_xact_lock(727002, hashtext(aggregate))``): a second relay skips every row of
an aggregate the first holds, so rows of one aggregate are never in flight on two relays.

The claim runs in two statements: the first takes the locks (an aggregate's lock as its scan
reaches the aggregate), the second, ``reclaim``, selects the rows again from a new snapshot,
limited to the free rows the first one locked and the aggregates it holds. The second statement
is what makes the order right: an aggregate lock can be granted in the middle of the first
scan, when the relay that held it commits; that scan has by then passed over the aggregate's
earlier rows (lock refused) and would claim a later row ahead of them (three relays on 50
aggregates did exactly that before the second statement existed). The new snapshot is taken
after every lock is held, so it sees the previous holder's marks and starts each aggregate at
its true head.

On SQLite one relay at a time holds a lease (``rmqkit_outbox_lease``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from rmqkit.outbox.schema import AGGREGATE_WRITE_LOCK_SPACE, LEASE_TABLE, TABLE
from rmqkit.store import Dialect

ROW_COLUMNS: Final = (
    "id",
    "message_id",
    "exchange",
    "routing_key",
    "body",
    "headers",
    "content_type",
    "aggregate",
    "attempts",
    "delay_ms",
    "last_error",  # the relay logs a failure only when it differs from this (failures.py)
)
# After ROW_COLUMNS in every claim: how long the row has waited, in ms (the relay deducts it
# from the row's delay).
AGE_MS: Final = "({now} - o.created_at) * 1000.0"
AGGREGATE_LOCK_SPACE: Final = 727002  # first key of the two-key advisory locks
RETENTION_CHUNK: Final = 500  # rows per retention DELETE: short transactions, small WAL bursts
FAILING_SHOWN: Final = 20
# SQLite, rows of the lease table besides the relay's lease: a relay's batch in flight
# (BATCH_PREFIX + holder) and an operator command's hold (``rmqkit outbox retry|discard|retarget``).
BATCH_PREFIX: Final = "batch:"
OPERATOR_HOLD: Final = "operator"
ONCE: Final = "{a}.last_attempt_at IS NULL OR {a}.last_attempt_at < ?"


@dataclass(frozen=True)
class Queries:
    """The SQL of one dialect (``?`` already turned into its placeholder)."""

    claim_due: str  # params: limit
    claim_once: str  # params: run_start, run_start, limit
    reclaim_due: str  # PostgreSQL: the claim again, on the locks the first one took
    reclaim_once: str
    mark_published_prefix: str  # + "(?, ?, ...)" for the ids
    mark_failed: str  # params: error, backoff seconds, id
    delete_published: str  # params: retention seconds, chunk
    now: str
    pending: str  # -> count, oldest created_at, now
    failing_count: str
    failing_rows: str  # params: limit
    published_since: str  # params: seconds
    pending_before: str  # params: max id -> count
    max_id: str
    has_delay: str  # fails on a table without the delay_ms column
    lease: str  # params: holder, seconds
    release: str  # params: holder
    release_writers: str  # PostgreSQL: the claim's AGGREGATE_WRITE_LOCK_SPACE locks (session)
    failing_totals: str  # -> count, oldest created_at, now
    failing_groups: str  # params: limit -> last_error, count (most frequent first)
    begin_batch: str  # SQLite: params: holder, holder, seconds; no row while an operator holds
    renew_batch: str  # SQLite: params: seconds, holder
    end_batch: str  # SQLite: params: holder


def queries_for(dialect: Dialect, *, delay_column: bool = True) -> Queries:
    """Build the queries of ``dialect``. ``delay_column``: the table has ``delay_ms`` (one
    created before delays existed reads NULL until ``rmqkit outbox init`` adds it)."""
    now = dialect.now
    selected = ", ".join(
        "o." + c if c != "delay_ms" or delay_column else "NULL" for c in ROW_COLUMNS
    )
    selected += ", " + AGE_MS.format(now=now)
    pg = dialect.name == "postgresql"

    def claim(due: str, *, reclaim: bool = False) -> str:
        ready = due.format(a="o")
        blocked = due.format(a="e")
        lock = (
            f" AND (o.aggregate IS NULL OR (pg_try_advisory_xact_lock({AGGREGATE_LOCK_SPACE}, "
            f"hashtext(o.aggregate)) AND pg_try_advisory_lock({AGGREGATE_WRITE_LOCK_SPACE}, "
            "hashtext(o.aggregate))))"
            if pg
            else ""
        )
        if reclaim:  # params: ..., the free rows' ids, the aggregates locked, limit
            lock = " AND ((o.aggregate IS NULL AND o.id = ANY(?)) OR o.aggregate = ANY(?))"
        return dialect.q(
            f"SELECT {selected} FROM {TABLE} o "
            f"WHERE o.published_at IS NULL AND ({ready}) AND (o.aggregate IS NULL OR NOT EXISTS "
            f"(SELECT 1 FROM {TABLE} e WHERE e.aggregate = o.aggregate AND e.published_at IS NULL"
            f" AND e.last_error IS NOT NULL AND e.id < o.id AND NOT ({blocked}))){lock} "
            "ORDER BY o.id LIMIT ?" + (" FOR UPDATE OF o SKIP LOCKED" if pg else "")
        )

    return Queries(
        claim_due=claim(f"{{a}}.next_attempt_at <= {now}"),
        # --once tries every pending row once, whatever its back-off: the run is the retry.
        claim_once=claim(ONCE),
        reclaim_due=claim(f"{{a}}.next_attempt_at <= {now}", reclaim=True),
        reclaim_once=claim(ONCE, reclaim=True),
        mark_published_prefix=(
            f"UPDATE {TABLE} SET published_at = {now}, last_attempt_at = {now}, "
            "attempts = attempts + 1, last_error = NULL WHERE id IN "
        ),
        mark_failed=dialect.q(
            f"UPDATE {TABLE} SET attempts = attempts + 1, last_attempt_at = {now}, "
            f"last_error = ?, next_attempt_at = {now} + ? WHERE id = ?"
        ),
        delete_published=dialect.q(
            f"DELETE FROM {TABLE} WHERE id IN (SELECT id FROM {TABLE} WHERE published_at IS NOT "
            f"NULL AND published_at < {now} - ? LIMIT ?)"
        ),
        now=f"SELECT {now}",
        pending=(
            f"SELECT count(*), min(created_at), {now} FROM {TABLE} WHERE published_at IS NULL"
        ),
        failing_count=(
            f"SELECT count(*) FROM {TABLE} WHERE published_at IS NULL AND last_error IS NOT NULL"
        ),
        failing_rows=dialect.q(
            "SELECT id, message_id, exchange, routing_key, aggregate, attempts, last_error, "
            f"next_attempt_at FROM {TABLE} WHERE published_at IS NULL AND last_error IS NOT NULL "
            "ORDER BY id LIMIT ?"
        ),
        published_since=dialect.q(
            f"SELECT count(*) FROM {TABLE} WHERE published_at IS NOT NULL AND published_at >= "
            f"{now} - ?"
        ),
        pending_before=dialect.q(
            f"SELECT count(*) FROM {TABLE} WHERE published_at IS NULL AND id <= ?"
        ),
        max_id=f"SELECT coalesce(max(id), 0) FROM {TABLE}",
        has_delay=f"SELECT delay_ms FROM {TABLE} WHERE 1 = 0",
        lease=dialect.q(
            f"INSERT INTO {LEASE_TABLE} (name, holder, expires_at) VALUES ('relay', ?, {now} + ?)"
            " ON CONFLICT (name) DO UPDATE SET holder = excluded.holder, expires_at = "
            f"excluded.expires_at WHERE {LEASE_TABLE}.holder = excluded.holder OR "
            f"{LEASE_TABLE}.expires_at < {now}"
        ),
        release=dialect.q(f"DELETE FROM {LEASE_TABLE} WHERE holder = ?"),
        release_writers="SELECT pg_advisory_unlock_all()",
        failing_totals=(
            f"SELECT count(*), min(created_at), {now} FROM {TABLE} WHERE published_at IS NULL "
            "AND last_error IS NOT NULL"
        ),
        failing_groups=dialect.q(
            f"SELECT last_error, count(*) FROM {TABLE} WHERE published_at IS NULL AND last_error "
            "IS NOT NULL GROUP BY last_error ORDER BY count(*) DESC, last_error LIMIT ?"
        ),
        # SQLite has no row locks: a relay's batch in flight is a row of the lease table
        # (rmqkit.outbox.operator waits for it to go), and a batch starts only while no
        # operator command holds the table (one statement, so the check and the start are atomic).
        begin_batch=dialect.q(
            f"INSERT INTO {LEASE_TABLE} (name, holder, expires_at) SELECT '{BATCH_PREFIX}' || ?, "
            f"?, {now} + ? WHERE NOT EXISTS (SELECT 1 FROM {LEASE_TABLE} WHERE name = "
            f"'{OPERATOR_HOLD}' AND expires_at > {now}) ON CONFLICT (name) DO UPDATE SET "
            "expires_at = excluded.expires_at"
        ),
        renew_batch=dialect.q(
            f"UPDATE {LEASE_TABLE} SET expires_at = {now} + ? WHERE name = '{BATCH_PREFIX}' || ?"
        ),
        end_batch=dialect.q(f"DELETE FROM {LEASE_TABLE} WHERE name = '{BATCH_PREFIX}' || ?"),
    )


def ids_in(dialect: Dialect, count: int) -> str:
    """``(?, ?, ...)`` for ``count`` ids."""
    return f"({dialect.params(count)})"

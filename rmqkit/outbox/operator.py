"""``rmqkit outbox list|retry|discard|retarget``: an operator's changes to pending rows, no SQL.

Each change waits for any relay that is publishing one of the rows, and keeps relays off them
while it runs, with the locks the relays themselves use, so a row is never changed (or removed)
between its publish and its mark:

* PostgreSQL: in one transaction, the aggregates' advisory locks (``queries.AGGREGATE_LOCK_SPACE``;
  taken first and in order, so a relay cannot claim a later row of the aggregate meanwhile), then
  the rows ``FOR UPDATE``: a relay holds both until its batch's marks commit, and skips locked
  rows and aggregates (SKIP LOCKED, try-locks), so only the operator command ever waits.
* SQLite: an ``operator`` row in the lease table stops relays from starting a batch
  (``queries.begin_batch``); the command then waits until no batch row is left (a batch in
  flight ends with its marks) and makes its change in one transaction.

The wait is bounded (``wait_s``): after it nothing is changed and the error says so (69). All ids
are checked under the locks: an id that is not in the table, or a row already published, is a
DataError (65) and nothing is changed. ``discard`` moves the rows to ``rmqkit_outbox_discarded``
(with when, by whom and why) in the transaction that deletes them: an audit trail, and a way back.
"""

from __future__ import annotations

import contextlib
import getpass
import socket
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass
from typing import Any, Final

from rmqkit.errors import DatabaseUnavailable, DataError, UsageError
from rmqkit.outbox.queries import AGGREGATE_LOCK_SPACE, BATCH_PREFIX, OPERATOR_HOLD
from rmqkit.outbox.schema import DISCARDED_TABLE, LEASE_TABLE, TABLE, check_shape, discarded_ddl
from rmqkit.store import Dialect, Store, SyncConnection, transaction

WAIT_S: Final = 30.0
POLL_S: Final = 0.05
LIST_COLUMNS: Final = (
    "id, message_id, exchange, routing_key, aggregate, attempts, last_error, created_at, "
    "next_attempt_at, published_at"
)
# Copied to the audit table (delay_ms is left out: a table from before delays has no such column).
DISCARD_COLUMNS: Final = (
    "id, message_id, exchange, routing_key, body, headers, content_type, aggregate, created_at, "
    "attempts, last_attempt_at, last_error"
)


@dataclass
class OutboxRow:
    """A row of the outbox as ``list`` shows it."""

    id: int
    message_id: str
    exchange: str
    routing_key: str
    aggregate: str | None
    attempts: int
    last_error: str | None
    age_s: float  # since it was written
    due_in_s: float  # until a relay may try it (0: due now)

    def as_dict(self) -> dict[str, Any]:
        """For ``--json``."""
        return asdict(self)


@dataclass
class Listing:
    """Pending rows (the first ``limit``), and how many there are in all."""

    rows: list[OutboxRow]
    total: int


def list_rows(dsn: str, *, failing: bool = False, limit: int = 100) -> Listing:
    """Pending rows in id order (``failing``: only those whose last publish failed)."""
    store = Store(dsn)
    where = "published_at IS NULL" + (" AND last_error IS NOT NULL" if failing else "")
    now = store.dialect.now
    with store.connect() as conn:
        check_shape(conn, store.dsn)
        (total,) = conn.execute(f"SELECT count(*) FROM {TABLE} WHERE {where}").fetchone()  # type: ignore[misc]
        found = conn.execute(
            store.dialect.q(
                f"SELECT {LIST_COLUMNS}, {now} FROM {TABLE} WHERE {where} ORDER BY id LIMIT ?"
            ),
            (limit,),
        ).fetchall()
    return Listing([_row(v) for v in found], int(total))


def retry(dsn: str, ids: Sequence[int], *, wait_s: float = WAIT_S) -> list[OutboxRow]:
    """Make the rows due now, their back-off reset (``attempts`` 0); the rows as they were."""
    return _change(dsn, ids, wait_s, lambda d, where: [_due_now(d, where)])


def retarget(
    dsn: str,
    ids: Sequence[int],
    *,
    exchange: str | None = None,
    routing_key: str | None = None,
    wait_s: float = WAIT_S,
) -> list[OutboxRow]:
    """Change the rows' exchange and/or routing key, and make them due now with their
    back-off reset; the rows as they were. ``last_error`` stays until a publish succeeds."""
    if exchange is None and routing_key is None:
        raise UsageError("retarget: give --exchange, --routing-key or both")
    sets = []
    params: list[Any] = []
    if exchange is not None:
        sets.append("exchange = ?")
        params.append(exchange)
    if routing_key is not None:
        sets.append("routing_key = ?")
        params.append(routing_key)

    def statements(dialect: Dialect, where: str) -> list[tuple[str, list[Any]]]:
        moved = (f"UPDATE {TABLE} SET {', '.join(sets)} WHERE {where}", params)
        return [moved, _due_now(dialect, where)]

    return _change(dsn, ids, wait_s, statements)


def discard(
    dsn: str, ids: Sequence[int], *, reason: str | None = None, wait_s: float = WAIT_S
) -> list[OutboxRow]:
    """Remove the rows from the outbox, kept in ``rmqkit_outbox_discarded`` with when, by whom
    and ``reason``; the rows as they were."""
    by = f"{getpass.getuser()}@{socket.gethostname()}"

    def statements(dialect: Dialect, where: str) -> list[tuple[str, list[Any]]]:
        return [
            (discarded_ddl(dialect), []),
            (
                f"INSERT INTO {DISCARDED_TABLE} ({DISCARD_COLUMNS}, discarded_at, "
                f"discarded_by, reason) SELECT {DISCARD_COLUMNS}, {dialect.now}, ?, ? "
                f"FROM {TABLE} WHERE {where}",
                [by, reason],
            ),
            (f"DELETE FROM {TABLE} WHERE {where}", []),
        ]

    return _change(dsn, ids, wait_s, statements)


# --- the change, under the relays' locks ------------------------------------------------------
# A change's statements, ``?`` placeholders: each one's own parameters, then (if it has a
# ``where``) the ids.
Statements = Callable[[Dialect, str], list[tuple[str, list[Any]]]]


def _due_now(dialect: Dialect, where: str) -> tuple[str, list[Any]]:
    return (f"UPDATE {TABLE} SET next_attempt_at = {dialect.now}, attempts = 0 WHERE {where}", [])


def _change(dsn: str, ids: Sequence[int], wait_s: float, statements: Statements) -> list[OutboxRow]:
    if not ids:
        raise UsageError("give at least one ROW_ID (`rmqkit outbox list` shows them)")
    wanted = sorted(set(ids))
    store = Store(dsn)
    dialect = store.dialect
    where = _id_in(len(wanted))
    with store.connect() as conn:
        check_shape(conn, store.dsn)
        with _relays_held(conn, dialect, wanted, wait_s), transaction(conn):
            if dialect.name == "postgresql":
                _lock_pg(conn, dialect, wanted, wait_s)
            now = dialect.now
            found = conn.execute(
                dialect.q(f"SELECT {LIST_COLUMNS}, {now} FROM {TABLE} WHERE {where} ORDER BY id"),
                wanted,
            ).fetchall()
            _check(store, wanted, found)
            for sql, params in statements(dialect, where):
                conn.execute(dialect.q(sql), [*params, *wanted] if "?" in sql else params)
    return [_row(v) for v in found]


def _id_in(count: int) -> str:
    """``id IN (?, ...)`` with ``?`` placeholders (turned into the dialect's by ``Dialect.q``)."""
    return f"id IN ({', '.join('?' * count)})"


def _check(store: Store, wanted: list[int], found: Sequence[Any]) -> None:
    have = {int(v[0]): v for v in found}
    missing = [i for i in wanted if i not in have]
    if missing:
        listed = ", ".join(str(i) for i in missing)
        raise DataError(
            f"no outbox row with id {listed} in {store.dsn.masked} — nothing changed "
            "(`rmqkit outbox list` shows the pending rows)"
        )
    published = [i for i in wanted if have[i][9] is not None]
    if published:
        listed = ", ".join(str(i) for i in published)
        raise DataError(f"outbox row {listed} was already published — nothing changed")


def _lock_pg(conn: SyncConnection, dialect: Dialect, wanted: list[int], wait_s: float) -> None:
    """The relays' locks on the rows and their aggregates, waited for at most ``wait_s``."""
    conn.execute(f"SET LOCAL lock_timeout = '{max(1, int(wait_s * 1000))}ms'")
    where = _id_in(len(wanted))
    try:
        aggregates = conn.execute(
            dialect.q(
                f"SELECT DISTINCT aggregate FROM {TABLE} WHERE {where} AND aggregate IS NOT NULL "
                "ORDER BY aggregate"
            ),
            wanted,
        ).fetchall()
        for (aggregate,) in aggregates:
            conn.execute(
                dialect.q(f"SELECT pg_advisory_xact_lock({AGGREGATE_LOCK_SPACE}, hashtext(?))"),
                (aggregate,),
            )
        conn.execute(
            dialect.q(f"SELECT id FROM {TABLE} WHERE {where} ORDER BY id FOR UPDATE"), wanted
        ).fetchall()
    except Exception as exc:
        if getattr(exc, "sqlstate", None) == "55P03":  # lock_not_available: lock_timeout
            raise _busy(wanted, wait_s) from None
        raise


@contextlib.contextmanager
def _relays_held(
    conn: SyncConnection, dialect: Dialect, wanted: list[int], wait_s: float
) -> Iterator[None]:
    """SQLite: no relay starts a batch in the block, and none is in flight when it begins.
    PostgreSQL: nothing (the transaction's locks do it)."""
    if dialect.name != "sqlite":
        yield
        return
    now = dialect.now
    holder = f"{socket.gethostname()}:{uuid.uuid4().hex[:8]}"
    # The hold outlives a command killed while it holds (relays wait for it at most this long).
    ttl = wait_s + 10.0
    take = dialect.q(
        f"INSERT INTO {LEASE_TABLE} (name, holder, expires_at) VALUES ('{OPERATOR_HOLD}', ?, "
        f"{now} + ?) ON CONFLICT (name) DO UPDATE SET holder = excluded.holder, expires_at = "
        f"excluded.expires_at WHERE {LEASE_TABLE}.expires_at < {now} OR "
        f"{LEASE_TABLE}.holder = excluded.holder"
    )
    in_flight = (
        f"SELECT count(*) FROM {LEASE_TABLE} WHERE name LIKE '{BATCH_PREFIX}%' "
        f"AND expires_at > {now}"
    )
    deadline = time.monotonic() + wait_s
    try:
        while not conn.execute(take, (holder, ttl)).rowcount:  # another operator command
            if time.monotonic() > deadline:
                raise _busy(wanted, wait_s)
            time.sleep(POLL_S)
        while conn.execute(in_flight).fetchone()[0]:  # type: ignore[index]
            if time.monotonic() > deadline:
                raise _busy(wanted, wait_s)
            time.sleep(POLL_S)
        yield
    finally:
        conn.execute(
            dialect.q(f"DELETE FROM {LEASE_TABLE} WHERE name = '{OPERATOR_HOLD}' AND holder = ?"),
            (holder,),
        )


def _busy(wanted: list[int], wait_s: float) -> DatabaseUnavailable:
    listed = ", ".join(str(i) for i in wanted)
    return DatabaseUnavailable(
        f"a relay (or another operator command) kept outbox row {listed} busy for {wait_s:.0f}s "
        "— nothing changed; try again, or with a longer --wait"
    )


def _row(v: Sequence[Any]) -> OutboxRow:
    now = float(v[10])
    return OutboxRow(
        id=int(v[0]),
        message_id=v[1],
        exchange=v[2],
        routing_key=v[3],
        aggregate=v[4],
        attempts=int(v[5]),
        last_error=v[6],
        age_s=round(max(0.0, now - float(v[7])), 1),
        due_in_s=round(max(0.0, float(v[8]) - now), 1),
    )

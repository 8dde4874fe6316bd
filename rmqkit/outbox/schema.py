"""The outbox table, its indexes and (PostgreSQL) its NOTIFY trigger; ``init`` creates them.

Documented in docs/outbox.md for teams that create the table with their own migration tool:
the relay needs exactly these columns; the indexes keep the pending scan and the retention
delete cheap however many published rows the table holds.
"""

from __future__ import annotations

from typing import Any, Final

from rmqkit.errors import ConfigError
from rmqkit.store import Dialect, Dsn, connect, transaction

TABLE: Final = "rmqkit_outbox"
LEASE_TABLE: Final = "rmqkit_outbox_lease"  # SQLite: which relay may publish (one at a time)
DISCARDED_TABLE: Final = "rmqkit_outbox_discarded"  # `rmqkit outbox discard`'s audit trail
CHANNEL: Final = "rmqkit_outbox"  # PostgreSQL NOTIFY channel: a commit added rows
# PostgreSQL: ``add`` takes this shared advisory lock (first key; the second is
# ``hashtext(aggregate)``) until its transaction ends; a relay claims an aggregate's rows only
# if it can take it exclusively, i.e. while no transaction that wrote a row of the aggregate is
# still open (docs/outbox.md, "Order": a row with a lower id may still commit).
AGGREGATE_WRITE_LOCK_SPACE: Final = 727003


def ddl(dialect: Dialect) -> list[str]:
    """The statements ``init`` runs, in order; each is idempotent (IF NOT EXISTS / OR REPLACE)."""
    now = dialect.now
    statements = [
        f"""CREATE TABLE IF NOT EXISTS {TABLE} (
    id {dialect.id_column},
    message_id TEXT NOT NULL,
    exchange TEXT NOT NULL,
    routing_key TEXT NOT NULL,
    body {dialect.blob} NOT NULL,
    headers TEXT,
    content_type TEXT,
    aggregate TEXT,
    created_at {dialect.float_type} NOT NULL DEFAULT ({now}),
    attempts INTEGER NOT NULL DEFAULT 0,
    next_attempt_at {dialect.float_type} NOT NULL DEFAULT 0,
    last_attempt_at {dialect.float_type},
    last_error TEXT,
    published_at {dialect.float_type},
    delay_ms BIGINT
)""",
        # The dispatch index: pending rows in insertion order (the relay's scan).
        f"CREATE INDEX IF NOT EXISTS {TABLE}_pending ON {TABLE} (id) WHERE published_at IS NULL",
        # Failing rows by aggregate: "does a row backing off hold this aggregate back?" and
        # status's failing list. Normally empty, so the check costs nothing.
        f"CREATE INDEX IF NOT EXISTS {TABLE}_failing ON {TABLE} (aggregate, id) "
        "WHERE published_at IS NULL AND last_error IS NOT NULL",
        # Retention deletes and "published in the last hour".
        f"CREATE INDEX IF NOT EXISTS {TABLE}_published ON {TABLE} (published_at) "
        "WHERE published_at IS NOT NULL",
    ]
    if dialect.name == "postgresql":
        # A table created before rmqkit had delays gains the column (SQLite: ``init`` adds it
        # after a PRAGMA check, since it has no ADD COLUMN IF NOT EXISTS; see ``migrations``).
        statements.append(f"ALTER TABLE {TABLE} ADD COLUMN IF NOT EXISTS delay_ms BIGINT")
    if dialect.name == "sqlite":
        statements.append(
            f"CREATE TABLE IF NOT EXISTS {LEASE_TABLE} (name TEXT PRIMARY KEY, holder TEXT "
            f"NOT NULL, expires_at {dialect.float_type} NOT NULL)"
        )
    else:
        # One NOTIFY per inserting statement, sent by PostgreSQL at commit (never on rollback);
        # a trigger rather than a NOTIFY in add(), so rows a team inserts by hand wake it too.
        statements += [
            f"""CREATE OR REPLACE FUNCTION {TABLE}_notify() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('{CHANNEL}', '');
    RETURN NULL;
END $$""",
            f"DROP TRIGGER IF EXISTS {TABLE}_notify ON {TABLE}",
            f"CREATE TRIGGER {TABLE}_notify AFTER INSERT ON {TABLE} "
            f"FOR EACH STATEMENT EXECUTE FUNCTION {TABLE}_notify()",
        ]
    return statements


def discarded_ddl(dialect: Dialect) -> str:
    """The audit table of ``rmqkit outbox discard``: each discarded row as it was, and when, by
        whom and why it was discarded. Created by the first discard (in its transaction), so a table
    from before ``discard`` existed needs no migration; not part of ``ddl``."""
    return f"""CREATE TABLE IF NOT EXISTS {DISCARDED_TABLE} (
    id BIGINT NOT NULL,
    message_id TEXT NOT NULL,
    exchange TEXT NOT NULL,
    routing_key TEXT NOT NULL,
    body {dialect.blob} NOT NULL,
    headers TEXT,
    content_type TEXT,
    aggregate TEXT,
    created_at {dialect.float_type} NOT NULL,
    attempts INTEGER NOT NULL,
    last_attempt_at {dialect.float_type},
    last_error TEXT,
    discarded_at {dialect.float_type} NOT NULL,
    discarded_by TEXT NOT NULL,
    reason TEXT
)"""


ADDED_COLUMNS: Final = (("delay_ms", "BIGINT"),)
"""Columns added after the table's first release: ``init`` adds them to an existing table;
teams with their own migrations run ``ALTER TABLE rmqkit_outbox ADD COLUMN delay_ms BIGINT``.
The relay works without them (rows cannot carry a delay until then)."""


def _sqlite_migrations(conn: Any) -> list[str]:
    have = {row[1] for row in conn.execute(f"PRAGMA table_info({TABLE})").fetchall()}
    return [
        f"ALTER TABLE {TABLE} ADD COLUMN {name} {kind}"
        for name, kind in ADDED_COLUMNS
        if name not in have
    ]


def init(dsn: str | Dsn) -> list[str]:
    """Create the outbox table, indexes and trigger if missing; returns the statements run."""
    from rmqkit.store import Store

    store = Store(dsn)
    statements = ddl(store.dialect)
    with connect(store.dsn) as conn:
        # A table of that name that is not rmqkit's (CREATE TABLE IF NOT EXISTS would keep it and
        # the first index on a column it lacks would fail): one line, 78, nothing changed.
        try:
            check_shape(conn, store.dsn)
        except ConfigError as exc:
            if not str(exc).startswith(f"{store.dsn.masked} has no table"):
                raise
    with connect(store.dsn) as conn, transaction(conn):
        if store.dialect.name == "postgresql":
            # Two relays or deploys running init at once: serialise them (CREATE ... IF NOT
            # EXISTS is not safe against a concurrent twin in PostgreSQL).
            conn.execute("SELECT pg_advisory_xact_lock(727001)")
        for statement in statements:
            conn.execute(statement)
        if store.dialect.name == "sqlite":
            added = _sqlite_migrations(conn)
            for statement in added:
                conn.execute(statement)
            statements += added
    return statements


REQUIRED_COLUMNS: Final = (
    "id",
    "message_id",
    "exchange",
    "routing_key",
    "body",
    "headers",
    "content_type",
    "aggregate",
    "created_at",
    "attempts",
    "next_attempt_at",
    "last_attempt_at",
    "last_error",
    "published_at",
)
"""The columns the relay and ``status`` read (``delay_ms`` is optional: see ADDED_COLUMNS)."""

INIT_HINT: Final = "run `rmqkit outbox init --dsn ...` (or your migrations, docs/outbox.md)"


def probe_sql(columns: tuple[str, ...] = REQUIRED_COLUMNS) -> str:
    """A statement that reads no row and fails unless the table has ``columns``."""
    return f"SELECT {', '.join(columns)} FROM {TABLE} WHERE 1 = 0"


def is_missing_table(exc: BaseException) -> bool:
    """Whether ``exc`` (from a statement on the outbox table) says the table does not exist."""
    text = str(exc)
    return TABLE in text and ("does not exist" in text or "no such table" in text)


def shape_error(dsn: Dsn, exc: BaseException, missing: list[str]) -> ConfigError:
    """The one-line error (78) for an outbox table that is absent, or lacks ``missing``."""
    if is_missing_table(exc):
        return ConfigError(f"{dsn.masked} has no table {TABLE} — {INIT_HINT}")
    if not missing:
        reason = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        return ConfigError(f"{dsn.masked}: table {TABLE} cannot be read ({reason}) — {INIT_HINT}")
    return ConfigError(
        f"{dsn.masked}: table {TABLE} has no column(s) {', '.join(missing)}: not the outbox "
        "table rmqkit expects — migrate it to docs/outbox.md's schema, or rename it and run "
        "`rmqkit outbox init --dsn ...`"
    )


def check_shape(conn: Any, dsn: Dsn) -> None:
    """ConfigError (78) unless ``conn``'s outbox table exists with the columns rmqkit reads;
    errors that mean "unreachable" are left to the caller's mapping. ``conn`` is a sync
    connection in autocommit mode (a failed probe must not abort a transaction)."""
    from rmqkit.store import map_db_error

    try:
        conn.execute(probe_sql()).fetchall()
    except Exception as exc:
        if map_db_error(exc, dsn) is not None:
            raise
        missing = []
        if not is_missing_table(exc):
            for column in REQUIRED_COLUMNS:
                try:
                    conn.execute(probe_sql((column,))).fetchall()
                except Exception:
                    missing.append(column)
        raise shape_error(dsn, exc, missing) from None

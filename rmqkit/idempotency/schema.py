"""The idempotency store's tables, created (and upgraded) by ``rmqkit dedupe init``.

``rmqkit_processed`` holds one row per (scope, message id) handled — the primary key is the
whole mechanism: a second insert of the same id in the same scope finds the row — the queue it
came from and when, as Unix seconds; ``rmqkit_processed_at`` indexes the time for pruning. The
scope is whose ids these are: ``rmqkit consume`` uses its vhost and work queue
(``default_scope``), so consumers of two queues that get copies of one message both apply it.
``rmqkit_dedupe_settings`` keeps the retention window chosen at init, which ``status`` shows,
``prune`` defaults to and ``doctor --dedupe`` compares with the retry and replay horizon, and
the schema version. The ordering guard's ``rmqkit_versions`` (rmqkit.guard) is created
alongside. A store made by an older rmqkit (ids and keys without a scope) is upgraded in place
by ``init_store`` (rmqkit.idempotency.upgrade). Teams that migrate with their own tools can take
the statements from ``schema_statements`` (docs/idempotency.md shows them).
"""

from __future__ import annotations

import contextlib
import re
import sqlite3
from collections.abc import Iterator
from typing import Any, Final
from urllib.parse import quote

from rmqkit.durations import parse_duration_ms
from rmqkit.errors import ConfigError, RmqkitError
from rmqkit.guard import versions_ddl
from rmqkit.store import Dialect, Dsn, dialect_of

PROCESSED_TABLE: Final = "rmqkit_processed"
SETTINGS_TABLE: Final = "rmqkit_dedupe_settings"
DEFAULT_WINDOW_S: Final = 7 * 86400.0
_DAYS = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*d\s*$")


def parse_window(text: str) -> float:
    """A window or age in seconds: ``7d``, ``36h``, ``90m``, ``30s``; ValueError if bad."""
    match = _DAYS.match(text)
    if match is not None:
        seconds = float(match.group(1)) * 86400.0
        if seconds <= 0:
            raise ValueError(f"bad duration {text!r}: must be greater than zero")
        return seconds
    try:
        return parse_duration_ms(text) / 1000
    except ValueError:
        raise ValueError(
            f"bad duration {text!r}: use a number with d, h, m, s or ms (e.g. 7d, 36h)"
        ) from None


def format_window(seconds: float) -> str:
    """``604800`` → ``7d``; the largest whole unit."""
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size and seconds % size == 0:
            return f"{int(seconds // size)}{unit}"
    return f"{seconds:g}s"


@contextlib.contextmanager
def store_errors(dsn: Dsn, doing: str) -> Iterator[None]:
    """A database error that is not "unreachable" (the store layer maps those) becomes one
    ConfigError line naming what failed, e.g. a missing schema or a permission."""
    try:
        yield
    except RmqkitError:
        raise
    except Exception as exc:
        if not _is_db_error(exc):
            raise
        reason = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise ConfigError(f"cannot {doing} at {dsn.masked}: {reason}") from None


def _is_db_error(exc: BaseException) -> bool:
    if isinstance(exc, sqlite3.Error):
        return True
    return type(exc).__module__.startswith("psycopg")


def default_scope(vhost: str, queue: str) -> str:
    """The scope ``rmqkit consume`` records ids and versions in when not given one: the vhost,
    URL-encoded as in an AMQP URL (``/`` is ``%2F``), a slash, and the work queue — e.g.
    ``%2F/shipping.work``. Encoding the vhost keeps it unambiguous: two vhosts with a queue of
    the same name get two scopes."""
    return f"{quote(vhost, safe='')}/{queue}"


def processed_ddl(dialect: Dialect) -> list[str]:
    """The processed-ids table and its time index (idempotent)."""
    return [
        f"CREATE TABLE IF NOT EXISTS {PROCESSED_TABLE} ("
        "scope TEXT NOT NULL DEFAULT '', "
        "message_id TEXT NOT NULL, "
        "queue TEXT NOT NULL DEFAULT '', "
        f"processed_at {dialect.float_type} NOT NULL, "
        "PRIMARY KEY (scope, message_id))",
        f"CREATE INDEX IF NOT EXISTS {PROCESSED_TABLE}_at ON {PROCESSED_TABLE} (processed_at)",
    ]


def schema_statements(dialect: Dialect) -> list[str]:
    """Every CREATE statement of the store, idempotent (IF NOT EXISTS)."""
    return [
        *processed_ddl(dialect),
        f"CREATE TABLE IF NOT EXISTS {SETTINGS_TABLE} (name TEXT PRIMARY KEY, value TEXT NOT NULL)",
        *versions_ddl(dialect),
    ]


def table_columns(conn: Any, dialect: Dialect, table: str) -> set[str] | None:
    """The column names of ``table`` on an open connection (None: no such table)."""
    if dialect.name == "sqlite":
        rows = conn.execute(f"PRAGMA table_info({table})").fetchall()
        return {row[1] for row in rows} or None
    found = conn.execute("SELECT to_regclass(%s)", (table,)).fetchone()
    if found is None or found[0] is None:
        return None
    rows = conn.execute(
        "SELECT attname FROM pg_attribute WHERE attrelid = to_regclass(%s) "
        "AND attnum > 0 AND NOT attisdropped",
        (table,),
    ).fetchall()
    return {row[0] for row in rows}


def _read_window(conn: Any, dialect: Dialect) -> float | None:
    row = conn.execute(
        dialect.q(f"SELECT value FROM {SETTINGS_TABLE} WHERE name = ?"), ("window_s",)
    ).fetchone()
    return float(row[0]) if row is not None else None


def write_setting(conn: Any, dialect: Dialect, name: str, value: str) -> None:
    """Set one row of the settings table on an open connection."""
    conn.execute(
        dialect.q(dialect.upsert(SETTINGS_TABLE, ("name", "value"), ("name",), ("value",))),
        (name, value),
    )


def read_window(conn: Any) -> float | None:
    """The recorded window in seconds on an open connection (None if never set)."""
    return _read_window(conn, dialect_of(conn))


__all__ = [
    "DEFAULT_WINDOW_S",
    "PROCESSED_TABLE",
    "SETTINGS_TABLE",
    "default_scope",
    "format_window",
    "parse_window",
    "processed_ddl",
    "read_window",
    "schema_statements",
    "store_errors",
    "table_columns",
    "write_setting",
]

"""The idempotency store's tables, created by ``rmqkit dedupe init`` (or ``init_store``).

``rmqkit_processed`` holds one row per message id handled (the primary key is the whole
mechanism: a second insert of the same id finds the row), the queue it came from and when, as
Unix seconds; ``rmqkit_processed_at`` indexes the time for pruning. ``rmqkit_dedupe_settings``
keeps the retention window chosen at init, which ``status`` shows, ``prune`` defaults to and
``doctor --dedupe`` compares with the retry and replay horizon. The ordering guard's
``rmqkit_versions`` (rmqkit.guard) is created alongside. Teams that migrate with their own tools
can take the statements from ``schema_statements`` (docs/idempotency.md shows them).
"""

from __future__ import annotations

import contextlib
import re
import sqlite3
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Final

from rmqkit.durations import parse_duration_ms
from rmqkit.errors import ConfigError, RmqkitError
from rmqkit.guard import versions_ddl
from rmqkit.store import Dialect, Dsn, as_dsn, connect, dialect_of, transaction

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


def schema_statements(dialect: Dialect) -> list[str]:
    """Every CREATE statement of the store, idempotent (IF NOT EXISTS)."""
    return [
        f"CREATE TABLE IF NOT EXISTS {PROCESSED_TABLE} ("
        "message_id TEXT PRIMARY KEY, "
        "queue TEXT NOT NULL DEFAULT '', "
        f"processed_at {dialect.float_type} NOT NULL)",
        f"CREATE INDEX IF NOT EXISTS {PROCESSED_TABLE}_at ON {PROCESSED_TABLE} (processed_at)",
        f"CREATE TABLE IF NOT EXISTS {SETTINGS_TABLE} (name TEXT PRIMARY KEY, value TEXT NOT NULL)",
        *versions_ddl(dialect),
    ]


@dataclass(frozen=True)
class InitResult:
    """What ``init_store`` left in place: the store (masked) and the window in effect."""

    dsn: str
    window_s: float
    window_changed: bool


def init_store(dsn: str | Dsn, *, window_s: float | None = None) -> InitResult:
    """Create the tables if missing and record the retention window (idempotent).

    ``window_s`` None keeps the window already recorded (7 days on a new store); a value
    replaces it. Database failures: DatabaseUnavailable (exit 69).
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
        for statement in schema_statements(dialect):
            conn.execute(statement)
        current = _read_window(conn, dialect)
        wanted = window_s if window_s is not None else (current or DEFAULT_WINDOW_S)
        if current != wanted:
            conn.execute(
                dialect.q(dialect.upsert(SETTINGS_TABLE, ("name", "value"), ("name",), ("value",))),
                ("window_s", repr(float(wanted))),
            )
    return InitResult(parsed.masked, wanted, current is not None and current != wanted)


def _read_window(conn: Any, dialect: Dialect) -> float | None:
    row = conn.execute(
        dialect.q(f"SELECT value FROM {SETTINGS_TABLE} WHERE name = ?"), ("window_s",)
    ).fetchone()
    return float(row[0]) if row is not None else None


def read_window(conn: Any) -> float | None:
    """The recorded window in seconds on an open connection (None if never set)."""
    return _read_window(conn, dialect_of(conn))


__all__ = [
    "DEFAULT_WINDOW_S",
    "PROCESSED_TABLE",
    "SETTINGS_TABLE",
    "InitResult",
    "format_window",
    "init_store",
    "parse_window",
    "read_window",
    "schema_statements",
]

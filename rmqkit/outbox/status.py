"""``rmqkit outbox status``: what is pending, how old, what was published, what is failing.

As a monitoring check it follows the Nagios convention that ``parking stats`` uses: 0 ok,
1 warning (rows are failing, or a limit is 80% reached), 2 critical (a limit is exceeded).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from rmqkit.outbox.queries import FAILING_SHOWN, queries_for
from rmqkit.outbox.schema import check_shape
from rmqkit.store import Dsn, Store

OK, WARNING, CRITICAL = 0, 1, 2


@dataclass
class FailingRow:
    """A pending row whose last publish failed."""

    id: int
    message_id: str
    exchange: str
    routing_key: str
    aggregate: str | None
    attempts: int
    last_error: str
    retry_in_s: float


@dataclass
class OutboxStatus:
    """The outbox table's state."""

    pending: int
    oldest_pending_age_s: float | None
    published_last_hour: int
    failing: int
    failing_rows: list[FailingRow] = field(default_factory=list)
    status: int = OK
    reasons: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        """For ``--json``."""
        return asdict(self)


def outbox_status(
    dsn: str | Dsn, *, max_pending: int | None = None, max_age_s: float | None = None
) -> OutboxStatus:
    """Read the state of the outbox at ``dsn`` and grade it against the limits. A database
    without the outbox table, or with a table of another shape, is a ConfigError (78), not a
    check result: monitoring reads 1 and 2 as the outbox's state."""
    store = Store(dsn)
    sql = queries_for(store.dialect)
    with store.connect() as conn:
        check_shape(conn, store.dsn)
        count, oldest, now = conn.execute(sql.pending).fetchone()  # type: ignore[misc]
        (last_hour,) = conn.execute(sql.published_since, (3600.0,)).fetchone()  # type: ignore[misc]
        (failing,) = conn.execute(sql.failing_count).fetchone()  # type: ignore[misc]
        rows = conn.execute(sql.failing_rows, (FAILING_SHOWN,)).fetchall()
    result = OutboxStatus(
        pending=int(count),
        oldest_pending_age_s=None if oldest is None else round(max(0.0, now - oldest), 3),
        published_last_hour=int(last_hour),
        failing=int(failing),
        failing_rows=[
            FailingRow(
                int(r[0]), r[1], r[2], r[3], r[4], int(r[5]), r[6], round(max(0.0, r[7] - now), 1)
            )
            for r in rows
        ],
    )
    _grade(result, max_pending, max_age_s)
    return result


def _grade(result: OutboxStatus, max_pending: int | None, max_age_s: float | None) -> None:
    def worse(level: int, reason: str) -> None:
        result.status = max(result.status, level)
        result.reasons.append(reason)

    if result.failing:
        worse(WARNING, f"{result.failing} pending row(s) failed to publish")
    if max_pending is not None:
        if result.pending > max_pending:
            worse(CRITICAL, f"{result.pending} pending > {max_pending}")
        elif result.pending > 0.8 * max_pending:
            worse(WARNING, f"{result.pending} pending > 80% of {max_pending}")
    age = result.oldest_pending_age_s
    if max_age_s is not None and age is not None:
        if age > max_age_s:
            worse(CRITICAL, f"oldest pending row is {age:.0f}s old > {max_age_s:.0f}s")
        elif age > 0.8 * max_age_s:
            worse(WARNING, f"oldest pending row is {age:.0f}s old > 80% of {max_age_s:.0f}s")

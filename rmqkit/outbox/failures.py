"""What the relay says about rows that fail: one log line per row and error, and a summary.

A failing row is retried with back-off for as long as it fails, so logging every attempt would
bury the one line that matters. The relay logs a row when it first fails and again only when its
error changes: the row's previous error is its ``last_error`` column, read with the claim, so
the rule holds across batches, relay restarts and several relays on one table (a row is logged
once, whichever relay tries it). ``rmqkit outbox retry`` and ``retarget`` keep ``last_error``;
a retried row that fails the same way again is not logged again, the summary still counts it.

While any row is failing, the summary (``--failing-summary``, every 60 s) counts them by error
and gives the age of the oldest: ``outbox relay: 3 rows failing (oldest written 42s ago): 2
exchange 'foo' does not exist; 1 returned: ...``.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Final

from rmqkit.broker.session import Outcome
from rmqkit.outbox.amqp import Row

log = logging.getLogger("rmqkit.outbox")

GROUPS_SHOWN: Final = 5  # errors named in a summary; the rest are counted as "other"


def describe(row: Row, outcome: Outcome | str) -> str:
    """The ``last_error`` of a row whose publish ended in ``outcome`` (not CONFIRMED)."""
    if outcome is Outcome.RETURNED and row.ladder_target is not None:
        return "returned: the delay ladder's entry routed it to no rung (the ladder was deleted?)"
    if outcome is Outcome.RETURNED:
        return (
            f"returned: no queue is bound to exchange {row.exchange!r} for routing key "
            f"{row.routing_key!r}"
        )
    if outcome is Outcome.NACKED:
        return "nacked: the broker refused it (a full queue with overflow=reject-publish?)"
    return str(outcome)


def note_failure(row: Row, error: str, backoff_s: float) -> bool:
    """Log ``row``'s failure unless it failed with the same error last time; whether it did."""
    if row.last_error == error:
        return False
    again = "" if row.last_error is None else f" (before: {row.last_error})"
    log.warning(
        "outbox relay: row %d (message_id %s) to exchange %r, routing key %r failed: %s%s; "
        "retrying in %.0fs, with back-off (fix it, or `rmqkit outbox retarget|discard %d`)",
        row.id,
        row.message_id,
        row.exchange,
        row.routing_key,
        error,
        again,
        backoff_s,
        row.id,
    )
    return True


def summary_line(total: int, oldest_age_s: float | None, groups: Sequence[tuple[str, int]]) -> str:
    """The summary of ``total`` failing rows, ``groups`` the most frequent errors and counts."""
    parts = [f"{count} {error}" for error, count in groups]
    other = total - sum(count for _, count in groups)
    if other > 0:
        parts.append(f"{other} other")
    age = "" if oldest_age_s is None else f" (oldest written {oldest_age_s:.0f}s ago)"
    noun = "row" if total == 1 else "rows"
    return f"outbox relay: {total} {noun} failing{age}: " + "; ".join(parts)

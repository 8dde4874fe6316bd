"""What the relay logs about failing rows (rmqkit.outbox.failures): once per row and error, and
the summary's wording. The relay's real log is counted in
tests/integration/test_outbox_operator.py."""

from __future__ import annotations

import logging
from dataclasses import replace

import pytest

from rmqkit.broker.session import Outcome
from rmqkit.outbox.amqp import Row
from rmqkit.outbox.failures import describe, note_failure, summary_line


def _row(last_error: str | None = None) -> Row:
    return Row(
        7, "mid-7", "ordrs", "order.created", b"", None, None, None, 3, last_error=last_error
    )


def test_a_row_is_logged_when_its_error_is_new_or_changed(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, "rmqkit.outbox")
    error = "exchange 'ordrs' does not exist"
    assert note_failure(_row(), error, 1.4)
    assert not note_failure(_row(error), error, 2.0)  # the same error again: silent
    assert note_failure(_row(error), "returned: x", 4.0)
    assert [r.getMessage() for r in caplog.records] == [
        "outbox relay: row 7 (message_id mid-7) to exchange 'ordrs', routing key 'order.created' "
        "failed: exchange 'ordrs' does not exist; retrying in 1s, with back-off (fix it, or "
        "`rmqkit outbox retarget|discard 7`)",
        "outbox relay: row 7 (message_id mid-7) to exchange 'ordrs', routing key 'order.created' "
        "failed: returned: x (before: exchange 'ordrs' does not exist); retrying in 4s, with "
        "back-off (fix it, or `rmqkit outbox retarget|discard 7`)",
    ]


def test_summary_names_the_most_frequent_errors_and_counts_the_rest() -> None:
    groups = [("exchange 'a' does not exist", 3), ("returned: b", 2)]
    assert summary_line(6, 312.4, groups) == (
        "outbox relay: 6 rows failing (oldest written 312s ago): 3 exchange 'a' does not exist; "
        "2 returned: b; 1 other"
    )
    assert summary_line(1, None, [("nacked", 1)]) == "outbox relay: 1 row failing: 1 nacked"


def test_describe_names_the_route() -> None:
    assert describe(_row(), Outcome.RETURNED) == (
        "returned: no queue is bound to exchange 'ordrs' for routing key 'order.created'"
    )
    ladder = replace(_row(), ladder_target=("ordrs", "k"))
    assert describe(ladder, Outcome.RETURNED).startswith("returned: the delay ladder's entry")
    assert describe(_row(), "exchange 'ordrs' does not exist") == "exchange 'ordrs' does not exist"

"""The line an interrupted `rmqkit publish` ends with, for each state it can stop in (the run
against the broker: tests/integration/test_first_hour_errors.py)."""

from __future__ import annotations

from rmqkit.publishing.engine import PublishReport
from rmqkit.publishing.inputs import OutgoingMessage
from rmqkit.publishing.stopping import Stop


def _stop(sent: list[str], settled: int, *, repeatable: bool = True) -> Stop:
    report = PublishReport(published=len(sent), confirmed=settled)
    stop = Stop(report, repeatable_ids=repeatable)
    for number, where in enumerate(sent, start=1):
        stop.sent(number, OutgoingMessage(b"x", f"id-{number}", where=where))
    for number in range(1, settled + 1):
        stop.settled(number)
    return stop


def test_unconfirmed_lines_are_named_and_skip_sends_them_again() -> None:
    # line 3 was empty (skipped, counted): positions are line numbers, not message counts
    stop = _stop(["<stdin>:1", "<stdin>:2", "<stdin>:4", "<stdin>:5"], settled=2)
    assert stop.message() == (
        "interrupted: 4 message(s) published, 2 confirmed (on their queues); 2 sent without a "
        "confirm (lines 4-5), which may be on the queue — to resume, run the same command on "
        "the same input with --skip 3 (the lines after it keep their numbers, so their "
        "message_ids); those are sent again under the same message_ids, which a consumer "
        "deduplicating by message_id drops"
    )


def test_random_ids_say_copies_cannot_be_recognised() -> None:
    stop = _stop(["<stdin>:1", "<stdin>:2"], settled=1, repeatable=False)
    assert stop.message().endswith(
        "with --skip 1 (the lines after it keep their numbers, so their message_ids); those "
        "are sent again under new random message_ids (--random-ids): a consumer cannot "
        "recognise copies"
    )


def test_body_values_and_nothing_sent() -> None:
    stop = _stop(["--body 1", "--body 2"], settled=2)
    assert stop.message() == (
        "interrupted: 2 message(s) published, 2 confirmed (on their queues); the last sent was "
        "--body 2 of the input — to resume, publish the --body values after the first 2; a "
        "rerun of the whole input instead sends those 2 again under the same message_ids, "
        "which a consumer deduplicating by message_id drops"
    )
    assert _stop([], settled=0).message() == (
        "interrupted: 0 message(s) published, 0 confirmed (on their queues); nothing was sent"
    )

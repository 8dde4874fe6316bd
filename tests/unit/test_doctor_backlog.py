"""dead-letter-backlog-held and status's held counts over hand-made management API JSON: the
cause follows the target (full, refused while full, routed nowhere, not confirming), a parking
target gets a parking fix, delay ladder rungs are left to delayed-stuck."""

from __future__ import annotations

from typing import Any

from rmqkit.broker.snapshot import Snapshot
from rmqkit.health.status import build_status
from tests.unit.test_doctor_checks import check, policy, queue, snapshot

WAIT_ARGS = {"x-message-ttl": 1000, "x-dead-letter-exchange": "", "x-dead-letter-routing-key": "w"}
WORK_ARGS = {"x-dead-letter-exchange": "", "x-dead-letter-routing-key": "w.parking"}


def _vhost(work: dict[str, Any], held: int = 24, **extra: Any) -> Snapshot:
    return snapshot(
        [
            queue("w", args=WORK_ARGS, **work),
            queue("w.wait.1s", args=WAIT_ARGS, messages=held, messages_dlx=held, **extra),
            queue("w.parking"),
        ],
        policies=[policy("bound", "^w$", max_length=5, overflow="reject-publish")],
    )


def test_a_full_work_queue_is_named_as_the_cause() -> None:
    (finding,) = check(_vhost({"messages": 6}), "dead-letter-backlog-held")
    assert (finding.severity, finding.object) == ("warning", "w.wait.1s")
    assert "24 dead-lettered message(s)" in finding.evidence
    assert "w is full (6 of max-length 5, overflow reject-publish)" in finding.evidence
    assert "few minutes" in finding.evidence
    assert "scale its consumers" in finding.fix and "max_length" in finding.fix


def test_room_now_still_warns_because_the_broker_retries_late() -> None:
    (finding,) = check(_vhost({"messages": 0}), "dead-letter-backlog-held")
    assert "refused them while full (max-length 5, overflow reject-publish; 0 in it now)" in (
        finding.evidence
    )
    assert "it has room now" in finding.evidence


def test_nothing_held_is_ok_and_classic_queues_without_the_field_too() -> None:
    assert check(_vhost({"messages": 6}, held=0), "dead-letter-backlog-held") == []
    snap = snapshot([queue("c", "classic", args={"x-dead-letter-exchange": ""})])
    assert check(snap, "dead-letter-backlog-held") == []


def test_a_bounded_parking_queue_gets_a_parking_fix() -> None:
    snap = snapshot(
        [
            queue("w", args=WORK_ARGS, messages=7, messages_dlx=7),
            queue("w.parking", messages=3),
        ],
        policies=[policy("bound", "^w[.]parking$", max_length=3, overflow="reject-publish")],
    )
    (finding,) = check(snap, "dead-letter-backlog-held")
    assert finding.object == "w" and "w.parking is full (3 of max-length 3" in finding.evidence
    assert "rmqkit parking replay|purge" in finding.fix


def test_a_target_routed_nowhere_is_said() -> None:
    snap = snapshot(
        [
            queue(
                "w",
                args={"x-dead-letter-exchange": "", "x-dead-letter-routing-key": "gone"},
                messages=2,
                messages_dlx=2,
            )
        ]
    )
    (finding,) = check(snap, "dead-letter-backlog-held")
    assert "routes them to no queue" in finding.evidence


def test_delay_rungs_are_left_to_delayed_stuck() -> None:
    rung = queue(
        "rmqkit.delay.100ms.00-100ms",
        args={"x-message-ttl": 100, "x-dead-letter-exchange": "rmqkit.delay.100ms.after-00"},
        messages=1,
        messages_dlx=1,
    )
    assert check(snapshot([rung]), "dead-letter-backlog-held") == []


def test_status_rows_and_groups_carry_the_held_count() -> None:
    report = build_status(_vhost({"messages": 6}))
    rows = {q.name: q for q in report.queues}
    assert rows["w.wait.1s"].dead_letter_held == 24 and rows["w.wait.1s"].held_for == ("w",)
    assert rows["w.wait.1s"].note.startswith("24 dead letters held for w: w full (6 of")
    assert rows["w"].dead_letter_held is None  # the broker said nothing (no messages_dlx)
    (group,) = [g.as_dict() for g in report.groups]
    assert group["dead_letter_held"] == 24

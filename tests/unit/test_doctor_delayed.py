"""Delay ladders in doctor and status, over hand-made management API JSON (no broker): the
rungs are recognised, messages due but not taken are a `delayed-stuck` warning, and the
queues a ladder delivers into are not taken for parking queues."""

from __future__ import annotations

from typing import Any

from rmqkit.broker.snapshot import Snapshot, effective_queue
from rmqkit.delay import Ladder
from rmqkit.health.checks import CHECKS, DoctorInput
from rmqkit.health.roles import classify
from rmqkit.health.status import build_status

LADDER = Ladder(prefix="rmqkit.delay", unit_ms=100, bits=3)
V3 = (3, 10, 8)


def _queue(name: str, **raw: Any) -> dict[str, Any]:
    args = {"x-queue-type": "quorum", **raw.pop("args", {})}
    return {"name": name, "type": "quorum", "durable": True, "arguments": args, **raw}


def _snapshot(stuck: int) -> Snapshot:
    queues = [
        _queue(
            LADDER.queue_name(bit),
            args=LADDER.queue_arguments(bit),
            messages=2 + (stuck if bit == 0 else 0),
            messages_ready=2 + (stuck if bit == 0 else 0),
            messages_dlx=stuck if bit == 0 else 0,
        )
        for bit in range(LADDER.bits)
    ]
    queues.append(_queue("plain.target", messages=0))  # an exit target, no dead-lettering
    objects = LADDER.objects([("", "plain.target")])
    exchanges = [{"name": e.name, "type": "headers"} for e in objects.exchanges]
    bindings = [
        {
            "source": b.source,
            "destination": b.destination,
            "destination_type": b.destination_type,
            "routing_key": "",
            "arguments": b.arguments,
        }
        for b in objects.bindings
    ]
    return Snapshot(
        vhost="v",
        version=V3,
        queues={q["name"]: effective_queue(q, [], [], V3) for q in queues},
        exchanges={"": {"name": ""}, **{e["name"]: e for e in exchanges}},
        bindings=bindings,
        policies=[],
        operator_policies=[],
        vhost_stats=None,
    )


def _findings(snap: Snapshot) -> list[Any]:
    (check,) = [c for c in CHECKS if c.id == "delayed-stuck"]
    return check.run(DoctorInput(snapshot=snap, roles=classify(snap)))


def test_rungs_are_delay_queues_and_their_target_is_no_parking_queue() -> None:
    snap = _snapshot(stuck=0)
    roles = classify(snap)
    assert {roles[n] for n in LADDER.queue_names} == {("delay", LADDER.base)}
    assert roles["plain.target"][0] == "other"  # was "parking": a dead-letter target
    report = build_status(snap)
    assert [(v.name, v.waiting, v.stuck) for v in report.delayed] == [(LADDER.base, 6, 0)]
    assert report.as_dict()["delayed"]["total"] == 6
    assert report.groups == []  # no rung or target makes a work queue's group


def test_messages_due_but_not_taken_are_a_warning() -> None:
    assert _findings(_snapshot(stuck=0)) == []
    (finding,) = _findings(_snapshot(stuck=3))
    assert finding.severity == "warning" and finding.object == LADDER.base
    assert LADDER.queue_name(0) in finding.evidence and "3 delayed" in finding.evidence
    assert build_status(_snapshot(stuck=3)).delayed_dict()["stuck"] == 3

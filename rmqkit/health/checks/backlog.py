"""Doctor check of held dead letters (docs/doctor.md: dead-letter-backlog-held): messages a
queue dead-lettered at-least-once that their target has not taken wait in that queue, invisible
to consumers, and the broker retries them only every few minutes (``rmqkit.health.backlog``)."""

from __future__ import annotations

from rmqkit.health.backlog import held_backlogs
from rmqkit.health.findings import DoctorInput, Finding


def dead_letter_backlog_held(inp: DoctorInput) -> list[Finding]:
    """Per queue holding dead letters (``messages_dlx`` > 0; delay ladder rungs are
    ``delayed-stuck``'s): where they are, why their target has not taken them (full with
    reject-publish, routed nowhere, unavailable) and what to do. A warning: nothing is lost,
    but the messages are late by minutes and no consumer or parking command sees them."""
    return [
        Finding(
            "dead-letter-backlog-held",
            "warning",
            "queue",
            backlog.queue,
            backlog.evidence(),
            backlog.fix(),
        )
        for backlog in held_backlogs(inp.snapshot, inp.roles)
    ]


__all__ = ["dead_letter_backlog_held"]

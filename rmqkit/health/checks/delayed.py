"""Doctor check of delay ladders (docs/doctor.md: delayed-stuck): a delayed message that is
due but that its target does not take waits in the ladder's last rung (quorum rungs keep it and
the broker retries the hop every few minutes; classic rungs would have dropped it)."""

from __future__ import annotations

from rmqkit.health.delayed import find_ladders
from rmqkit.health.findings import DoctorInput, Finding


def delayed_stuck(inp: DoctorInput) -> list[Finding]:
    """Per ladder with messages due but not accepted by their target (``messages_dlx`` of its
    rungs, from the management API: ``Ladder.delayed_in``)."""
    found: list[Finding] = []
    for view in find_ladders(inp.snapshot):
        if not view.stuck:
            continue
        rungs = ", ".join(f"{name} {c.stuck}" for name, c in view.rungs.items() if c.stuck)
        found.append(
            Finding(
                "delayed-stuck",
                "warning",
                "queue",
                view.name,
                f"{view.stuck} delayed message(s) are due but their target has not taken them "
                f"({rungs}): they wait in the ladder and are retried every few minutes",
                "declare the ladder's exit for the target (`rmqkit declare` with the topology, "
                "or rmqkit.delay.declare_target), check that the target exchange routes the "
                "message's routing key to a queue, and that the queue is not full "
                "(overflow reject-publish); see docs/delay.md",
            )
        )
    return found


__all__ = ["delayed_stuck"]

"""Doctor checks of dead-lettering: a message rejected, expired or over a limit must reach a
parking queue, not vanish (docs/doctor.md: quorum-no-dead-letter, dead-letter-target-missing,
at-least-once-without-reject-publish)."""

from __future__ import annotations

from rmqkit.health.checks.common import plain_queues
from rmqkit.health.findings import DoctorInput, Finding, Severity


# --- 1. quorum queue without a dead-letter target -------------------------------------------
def quorum_without_dead_letter(inp: DoctorInput) -> list[Finding]:
    """A quorum queue with a delivery limit (4.x: 20 unless set) and no dead-letter exchange
    drops a message silently when it reaches the limit."""
    found: list[Finding] = []
    v4 = inp.snapshot.version >= (4, 0, 0)
    for queue in plain_queues(inp):
        if queue.type != "quorum" or queue.dead_letter_exchange is not None:
            continue
        # The limit the broker enforces (rmqkit.broker.policies): 20 on 4.x unless set,
        # none for a negative setting, none on 3.x unless set.
        limit, source = queue.delivery_limit, queue.delivery_limit_source
        if limit is None:
            continue
        found.append(
            Finding(
                "quorum-no-dead-letter",
                "critical",
                "queue",
                queue.name,
                f"quorum queue with delivery-limit {limit} ({source}) and no "
                "dead-letter-exchange: a message returned to it that many times (crashing "
                "consumer, nack/requeue) is dropped without a trace",
                "give it a dead-letter target: policy keys dead-letter-exchange and "
                "dead-letter-routing-key pointing at a parking queue (`rmqkit declare` wires "
                "this for a topology file)"
                + ("; or, for a queue that must never drop, delivery-limit -1" if v4 else ""),
            )
        )
    return found


# --- 2. dead-letter exchange (or target) that does not exist ---------------------------------
def dead_letter_target_missing(inp: DoctorInput) -> list[Finding]:
    """Dead letters sent to an exchange that does not exist, or that routes them to no queue,
    are dropped."""
    snapshot = inp.snapshot
    found: list[Finding] = []
    for queue in plain_queues(inp):
        dlx = queue.dead_letter_exchange
        if dlx is None:
            continue
        source = queue.source("dead-letter-exchange")
        key = queue.dead_letter_routing_key
        problem: str | None = None
        severity: Severity = "critical"
        fix = ""
        if dlx != "" and not snapshot.exchange_exists(dlx):
            problem = f"dead-letter-exchange {dlx!r} ({source}) does not exist"
            fix = (
                f"declare exchange {dlx!r} and bind the parking queue to it, or point "
                "dead-letter-exchange at an existing exchange"
            )
        elif dlx == "" and key is None:
            severity = "warning"
            problem = (
                "dead-letters through the default exchange without a dead-letter-routing-key, "
                "so each message goes to the queue named by its own routing key — usually none"
            )
            fix = "set dead-letter-routing-key to the parking queue's name"
        elif dlx == "" and key not in snapshot.queues:
            problem = (
                f"dead-letters through the default exchange to queue {key!r} "
                f"({queue.source('dead-letter-routing-key')}), which does not exist"
            )
            fix = f"declare queue {key!r} (a quorum parking queue), or fix the routing key"
        elif dlx != "" and not snapshot.dead_letter_targets(queue):
            if snapshot.exchange_setting(dlx, "alternate-exchange"):
                continue
            shown = f"key {key!r}" if key is not None else "its routing keys"
            problem = f"dead-letter-exchange {dlx!r} routes no dead letter ({shown}) to any queue"
            fix = f"bind the parking queue to exchange {dlx!r}"
        if problem is None:
            continue
        found.append(
            Finding(
                "dead-letter-target-missing",
                severity,
                "queue",
                queue.name,
                problem + ": every message it dead-letters (rejected, expired, over a limit) "
                "is dropped",
                fix,
            )
        )
    return found


# --- 3. at-least-once dead-lettering without overflow reject-publish ------------------------
def at_least_once_without_reject_publish(inp: DoctorInput) -> list[Finding]:
    """``dead-letter-strategy=at-least-once`` needs ``overflow=reject-publish``; otherwise the
    broker silently falls back to at-most-once (a log line only)."""
    check = "at-least-once-without-reject-publish"
    found: list[Finding] = []
    for queue in plain_queues(inp):
        if queue.settings.get("dead-letter-strategy") != "at-least-once":
            continue
        if queue.dead_letter_exchange is None:
            continue
        if queue.type != "quorum":
            evidence = (
                f"dead-letter-strategy at-least-once on a {queue.type} queue: only quorum "
                "queues support it, so dead-lettering here is at-most-once"
            )
            fix = "use a quorum queue for messages whose dead letters must not be lost"
        else:
            overflow = queue.settings.get("overflow")
            if overflow == "reject-publish":
                continue
            shown = (
                f"{overflow} ({queue.source('overflow')})" if overflow else "drop-head (default)"
            )
            evidence = (
                f"dead-letter-strategy at-least-once ({queue.source('dead-letter-strategy')}) "
                f"with overflow {shown}: the broker silently falls back to at-most-once, so a "
                "dead letter can be lost on a node failure"
            )
            fix = (
                "set overflow reject-publish (policy key `overflow`; on quorum queues the "
                "policy wins over an argument)"
            )
        found.append(Finding(check, "warning", "queue", queue.name, evidence, fix))
    return found

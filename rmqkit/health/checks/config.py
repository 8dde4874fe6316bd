"""Doctor checks of configuration: deprecated mirroring policies, handler timeouts against the
broker's consumer timeout, and the topology file against the broker (docs/doctor.md:
classic-mirrored-policy, handler-timeout-above-consumer-timeout, topology-out-of-sync)."""

from __future__ import annotations

from rmqkit.broker.snapshot import count
from rmqkit.consumer.config import BROKER_CONSUMER_TIMEOUT_S, PER_CONSUMER_TIMEOUT_SINCE
from rmqkit.health.checks.common import seconds_text
from rmqkit.health.findings import CheckSkipped, DoctorInput, Finding

# Per-queue consumer timeouts (x-consumer-timeout / policy key) exist since 3.12; before that
# only rabbitmq.conf's consumer_timeout (default BROKER_CONSUMER_TIMEOUT_S) applies.
PER_QUEUE_CONSUMER_TIMEOUT_SINCE = (3, 12, 0)


# --- 5. classic mirrored queue policies ------------------------------------------------------
def classic_mirrored_policies(inp: DoctorInput) -> list[Finding]:
    """``ha-*`` policy keys: classic mirrored queues are deprecated and removed in 4.0."""
    found: list[Finding] = []
    snapshot = inp.snapshot
    for kind, policies in (
        ("policy", snapshot.policies),
        ("operator-policy", snapshot.operator_policies),
    ):
        for policy in sorted(policies, key=lambda p: str(p.get("name", ""))):
            definition = policy.get("definition") or {}
            keys = sorted(k for k in definition if str(k).startswith("ha-"))
            if not keys:
                continue
            shown = ", ".join(f"{k}={definition[k]}" for k in keys)
            found.append(
                Finding(
                    "classic-mirrored-policy",
                    "warning",
                    kind,
                    str(policy.get("name", "")),
                    f"{kind} (pattern {policy.get('pattern')!r}) sets {shown}: "
                    + (
                        "RabbitMQ 4.x removed classic queue mirroring, so these keys have no "
                        "effect and the matching queues have a single replica"
                        if inp.snapshot.version >= (4, 0, 0)
                        else "classic mirrored queues are deprecated, lose unsynchronised "
                        "messages on failover, and have no effect from RabbitMQ 4.0 on (the "
                        "queues keep one replica)"
                    ),
                    "move the matching queues to quorum queues (declare new ones, shovel the "
                    "messages, switch consumers), then delete the policy's ha-* keys",
                )
            )
    return found


# --- 10. handler timeout above the consumer timeout ------------------------------------------
def handler_timeout_above_consumer_timeout(inp: DoctorInput) -> list[Finding]:
    """A handler allowed to run past the broker's consumer (ack) timeout gets its channel
    closed (≤ 4.2) or consumer cancelled (4.3): every unacked delivery comes back."""
    found: list[Finding] = []
    if inp.snapshot.version >= PER_CONSUMER_TIMEOUT_SINCE:
        # `rmqkit consume` asks for a consumer timeout of its own there, above its handler
        # timeout, which outranks the queue's and the broker's: nothing to fix.
        return found
    per_queue = inp.snapshot.version >= PER_QUEUE_CONSUMER_TIMEOUT_SINCE
    for queue in inp.queues_with_role("work"):
        handler_s, handler_source = inp.handler_timeout_for(queue.name)
        consumer_s = BROKER_CONSUMER_TIMEOUT_S
        consumer_source = (
            "the broker default; consumer_timeout in rabbitmq.conf can change it, and this "
            "check cannot read it"
        )
        configured = count(queue.settings.get("consumer-timeout"))
        if per_queue and configured is not None:
            consumer_s = configured / 1000
            consumer_source = queue.source("consumer-timeout")
        if handler_s < consumer_s:
            continue
        found.append(
            Finding(
                "handler-timeout-above-consumer-timeout",
                "warning",
                "queue",
                queue.name,
                f"handler timeout {seconds_text(handler_s)} ({handler_source}) is not below the "
                f"consumer timeout {seconds_text(consumer_s)} ({consumer_source}): a handler "
                "running that long gets its channel closed or its consumer cancelled, and "
                "every unacked message on it is redelivered (counting toward the delivery "
                "limit)",
                "lower the handler timeout (`rmqkit consume --handler-timeout`, or "
                "handler_timeout in the topology file) below the consumer timeout, or raise "
                "the consumer timeout (policy key consumer-timeout on 3.12+, consumer_timeout "
                "in rabbitmq.conf)",
            )
        )
    return found


# --- 11. topology file out of sync -----------------------------------------------------------
def topology_out_of_sync(inp: DoctorInput) -> list[Finding]:
    """The broker does not hold what the topology file says: pending changes (warning) or
    conflicts `declare` cannot apply (critical)."""
    plan = inp.plan
    if plan is None:
        raise CheckSkipped("no --topology file given")
    found: list[Finding] = []
    for change in plan.changes:
        if change.action not in ("create", "change", "conflict"):
            continue
        conflict = change.action == "conflict"
        found.append(
            Finding(
                "topology-out-of-sync",
                "critical" if conflict else "warning",
                change.kind,
                change.name,
                f"{plan.source}: {change.action}"
                + (f" — {change.detail}" if change.detail else "")
                + ("" if conflict else " (the broker does not match the file)"),
                change.fix
                or f"review `rmqkit plan {plan.source}`, then run `rmqkit declare {plan.source}`",
            )
        )
    return found

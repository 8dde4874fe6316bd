"""The reliability checks of `rmqkit doctor`: one pure function each, over a fetched vhost.

Each check takes a ``DoctorInput`` and returns its findings (empty: ok), or raises
``CheckSkipped`` when the broker did not give it what it needs (stats off, no topology file).
The checklist comes from seed 004 and ../shared/rabbitmq-facts.md; docs/doctor.md explains
each check, why it matters and the fix.
"""

from __future__ import annotations

from typing import Any

from rmqkit.broker.policies import DEFAULT_SOURCE_4X
from rmqkit.broker.snapshot import QueueView, count
from rmqkit.consumer.config import BROKER_CONSUMER_TIMEOUT_S
from rmqkit.health.findings import (
    SEVERITY_RANK,
    Check,
    CheckSkipped,
    DoctorInput,
    Finding,
    Severity,
)

# Per-queue consumer timeouts (x-consumer-timeout / policy key) exist since 3.12; before that
# only rabbitmq.conf's consumer_timeout (default BROKER_CONSUMER_TIMEOUT_S) applies.
PER_QUEUE_CONSUMER_TIMEOUT_SINCE = (3, 12, 0)


def _seconds(value: float) -> str:
    for unit, size in (("h", 3600.0), ("m", 60.0)):
        if value >= size and value % size == 0:
            return f"{value / size:g}{unit}"
    return f"{value:g}s"


def _ms(value: Any) -> str:
    found = count(value)
    return "?" if found is None else _seconds(found / 1000)


def _plain_queues(inp: DoctorInput) -> list[QueueView]:
    """Queues worth checking: not exclusive (client-owned, gone with their connection)."""
    return [q for _, q in sorted(inp.snapshot.queues.items()) if not q.exclusive]


# --- 1. quorum queue without a dead-letter target -------------------------------------------
def quorum_without_dead_letter(inp: DoctorInput) -> list[Finding]:
    """A quorum queue with a delivery limit (4.x: 20 unless set) and no dead-letter exchange
    drops a message silently when it reaches the limit."""
    found: list[Finding] = []
    v4 = inp.snapshot.version >= (4, 0, 0)
    for queue in _plain_queues(inp):
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
    for queue in _plain_queues(inp):
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
    found: list[Finding] = []
    for queue in _plain_queues(inp):
        if queue.settings.get("dead-letter-strategy") != "at-least-once":
            continue
        if queue.dead_letter_exchange is None:
            continue
        if queue.type != "quorum":
            found.append(
                Finding(
                    "at-least-once-without-reject-publish",
                    "warning",
                    "queue",
                    queue.name,
                    f"dead-letter-strategy at-least-once on a {queue.type} queue: only quorum "
                    "queues support it, so dead-lettering here is at-most-once",
                    "use a quorum queue for messages whose dead letters must not be lost",
                )
            )
            continue
        overflow = queue.settings.get("overflow")
        if overflow == "reject-publish":
            continue
        shown = f"{overflow} ({queue.source('overflow')})" if overflow else "drop-head (default)"
        found.append(
            Finding(
                "at-least-once-without-reject-publish",
                "warning",
                "queue",
                queue.name,
                f"dead-letter-strategy at-least-once ({queue.source('dead-letter-strategy')}) "
                f"with overflow {shown}: the broker silently falls back to at-most-once, so a "
                "dead letter can be lost on a node failure",
                "set overflow reject-publish (policy key `overflow`; on quorum queues the "
                "policy wins over an argument)",
            )
        )
    return found


# --- 4. parking queue with a delivery limit or a TTL ----------------------------------------
def parking_limit_or_ttl(inp: DoctorInput) -> list[Finding]:
    """A parking queue must keep every message until an operator acts: no TTL, no expiry,
    no delivery limit (browsing spends attempts), no bound that drops from the head."""
    found: list[Finding] = []
    v4 = inp.snapshot.version >= (4, 0, 0)
    for queue in inp.queues_with_role("parking"):
        settings = queue.settings
        problems: list[str] = []
        if settings.get("message-ttl") is not None:
            problems.append(
                f"message-ttl {_ms(settings['message-ttl'])} ({queue.source('message-ttl')}): "
                "parked messages expire"
            )
        if settings.get("expires") is not None:
            problems.append(
                f"expires {_ms(settings['expires'])} ({queue.source('expires')}): the queue "
                "is deleted, with its messages, once unused that long"
            )
        if queue.type == "quorum":
            limit = queue.delivery_limit
            if limit is not None and queue.delivery_limit_source == DEFAULT_SOURCE_4X:
                problems.append(
                    f"no delivery-limit, so the 4.x default {limit} "
                    "applies: each browse (`rmqkit parking list/replay`) spends an attempt"
                )
            elif limit is not None:
                problems.append(
                    f"delivery-limit {limit} ({queue.delivery_limit_source}): each browse "
                    "(`rmqkit parking list/replay`) spends an attempt, and rmqkit refuses to "
                    "browse it"
                )
        bounded = settings.get("max-length") is not None or (
            settings.get("max-length-bytes") is not None
        )
        if bounded and settings.get("overflow", "drop-head") == "drop-head":
            problems.append(
                "a length bound with overflow drop-head: the oldest parked messages are "
                "dropped when it fills"
            )
        if not problems:
            continue
        found.append(
            Finding(
                "parking-limit-or-ttl",
                "critical",
                "queue",
                queue.name,
                "parking queue with " + "; ".join(problems),
                "remove them — a parking queue keeps messages until someone replays or purges "
                "them"
                + (" (on 4.x set delivery-limit -1, as `rmqkit declare` does)" if v4 else "")
                + "; policy keys go with the policy, x-arguments only by moving the messages "
                "out (`rmqkit parking export --remove`) and redeclaring",
            )
        )
    return found


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


# --- 6. transient messages in durable queues -------------------------------------------------
def transient_messages(inp: DoctorInput) -> list[Finding]:
    """A durable queue survives a restart; its transient (delivery_mode 1) messages do not."""
    if inp.snapshot.stats_disabled:
        raise CheckSkipped("the broker keeps no message counts (management.disable_stats)")
    found: list[Finding] = []
    for queue in _plain_queues(inp):
        if not queue.durable:
            continue
        total, persistent = queue.messages, queue.messages_persistent
        if total is None or persistent is None or persistent >= total:
            continue
        found.append(
            Finding(
                "transient-messages",
                "warning",
                "queue",
                queue.name,
                f"{total - persistent} of {total} message(s) in this durable {queue.type} queue "
                "are transient (delivery_mode 1): they are lost when the node restarts",
                "publish with delivery_mode 2 (persistent; `rmqkit publish` does), or use a "
                "quorum queue, which persists every message",
            )
        )
    return found


# --- 7. unroutable publishes with no alternate exchange --------------------------------------
def unroutable_dropped(inp: DoctorInput) -> list[Finding]:
    """Messages published without ``mandatory`` that no queue takes are dropped silently
    unless the exchange has an alternate exchange."""
    snapshot = inp.snapshot
    if not snapshot.rates_kept:
        raise CheckSkipped("the broker keeps no message stats (management.disable_stats)")
    stats = snapshot.vhost_stats or {}
    dropped = count(stats.get("drop_unroutable")) or 0
    if dropped == 0:
        return []
    found: list[Finding] = []
    for name, exchange in sorted(snapshot.exchanges.items()):
        if name == "" or snapshot.exchange_setting(name, "alternate-exchange"):
            continue
        xstats = exchange.get("message_stats") or {}
        published = count(xstats.get("publish_in")) or 0
        routed = count(xstats.get("publish_out")) or 0
        if published <= routed:
            continue
        found.append(
            Finding(
                "unroutable-dropped",
                "warning",
                "exchange",
                name,
                f"{published} message(s) published to it, {routed} routed to a queue, no "
                f"alternate-exchange; the vhost dropped {dropped} unroutable message(s) "
                "published without mandatory (counts since the stats were last reset)",
                "bind a queue for those routing keys, or set an alternate exchange (policy key "
                "alternate-exchange → an exchange bound to a catch-all queue), or publish with "
                "mandatory and handle returns (`rmqkit publish` does)",
            )
        )
    if not found:
        found.append(
            Finding(
                "unroutable-dropped",
                "warning",
                "vhost",
                snapshot.vhost,
                f"the vhost dropped {dropped} unroutable message(s) published without "
                "mandatory (the exchange is not identifiable from its stats)",
                "publish with mandatory and handle returns, or give the exchanges an alternate "
                "exchange (policy key alternate-exchange)",
            )
        )
    return found


# --- 8. a queue growing with no consumers ----------------------------------------------------
def growing_without_consumers(inp: DoctorInput) -> list[Finding]:
    """Ready messages, no consumer, and still being published to (or growing between two
    reads). Wait and parking queues have no consumers by design and are left out."""
    found: list[Finding] = []
    for queue in _plain_queues(inp):
        if inp.role(queue.name) in ("wait", "parking"):
            continue
        # A sample (AMQP, immediate) beats the management counts, which lag.
        sample = inp.ready_samples.get(queue.name)
        ready = sample[1] if sample is not None else queue.ready
        if not ready or queue.consumers not in (0, None):
            continue
        signs: list[str] = []
        publish = queue.publish_rate
        if publish:
            signs.append(f"published at {publish:.2f}/s")
        growth = queue.growth_rate
        if growth and growth > 0:
            signs.append(f"growing at {growth:.2f}/s")
        if sample is not None and sample[1] > sample[0]:
            signs.append(f"ready went {sample[0]} → {sample[1]} in {inp.sample_interval_s:g}s")
        if not signs:
            continue
        found.append(
            Finding(
                "growing-without-consumers",
                "warning",
                "queue",
                queue.name,
                f"{ready} ready message(s), no consumer, " + ", ".join(signs),
                f"start its consumer (`rmqkit consume MODULE:HANDLER --queue {queue.name}`); "
                "if nothing should consume it, unbind it or bound it (max-length with "
                "overflow reject-publish) before it fills the node",
            )
        )
    return found


# --- 9. no length bound on work queues -------------------------------------------------------
def unbounded_work_queue(inp: DoctorInput) -> list[Finding]:
    """A work queue with no max-length / max-length-bytes grows until an alarm blocks every
    publisher on the node, not just the ones of the stalled queue."""
    found: list[Finding] = []
    for queue in inp.queues_with_role("work"):
        if "max-length" in queue.settings or "max-length-bytes" in queue.settings:
            continue
        found.append(
            Finding(
                "unbounded-work-queue",
                "warning",
                "queue",
                queue.name,
                "work queue (it dead-letters into a parking queue) with no max-length or "
                "max-length-bytes: if its consumers stall it grows until a memory or disk "
                "alarm blocks every publisher on the node",
                "set max_length (or max_length_bytes) for it in the topology file and run "
                "`rmqkit declare` (policy key max-length with overflow reject-publish: "
                "producers get a nack they can retry instead of losing the oldest message)",
            )
        )
    return found


# --- 10. handler timeout above the consumer timeout ------------------------------------------
def handler_timeout_above_consumer_timeout(inp: DoctorInput) -> list[Finding]:
    """A handler allowed to run past the broker's consumer (ack) timeout gets its channel
    closed (≤ 4.2) or consumer cancelled (4.3): every unacked delivery comes back."""
    found: list[Finding] = []
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
                f"handler timeout {_seconds(handler_s)} ({handler_source}) is not below the "
                f"consumer timeout {_seconds(consumer_s)} ({consumer_source}): a handler "
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


CHECKS: tuple[Check, ...] = (
    Check(
        "quorum-no-dead-letter",
        "quorum queue without a dead-letter target",
        quorum_without_dead_letter,
    ),
    Check(
        "dead-letter-target-missing",
        "dead-letter exchange or target that does not exist",
        dead_letter_target_missing,
    ),
    Check(
        "at-least-once-without-reject-publish",
        "at-least-once dead-lettering without overflow reject-publish",
        at_least_once_without_reject_publish,
    ),
    Check("parking-limit-or-ttl", "parking queue with a limit or TTL", parking_limit_or_ttl),
    Check("classic-mirrored-policy", "classic mirrored (ha-*) policies", classic_mirrored_policies),
    Check("transient-messages", "transient messages in durable queues", transient_messages),
    Check(
        "unroutable-dropped",
        "unroutable publishes dropped (no alternate exchange)",
        unroutable_dropped,
    ),
    Check(
        "growing-without-consumers",
        "queue growing with no consumers",
        growing_without_consumers,
    ),
    Check("unbounded-work-queue", "work queue without a length bound", unbounded_work_queue),
    Check(
        "handler-timeout-above-consumer-timeout",
        "handler timeout not below the consumer timeout",
        handler_timeout_above_consumer_timeout,
    ),
    Check("topology-out-of-sync", "topology file out of sync", topology_out_of_sync),
)

__all__ = [
    "CHECKS",
    "SEVERITY_RANK",
    "Check",
    "CheckSkipped",
    "DoctorInput",
    "Finding",
    "Severity",
]

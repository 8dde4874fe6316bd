"""The reliability checks of `rmqkit doctor`: one pure function each, over a fetched vhost.

Each check takes a ``DoctorInput`` and returns its findings (empty: ok), or raises
``CheckSkipped`` when the broker did not give it what it needs (stats off, no topology file).
The checklist comes from seed 004 and ../shared/rabbitmq-facts.md; docs/doctor.md explains
each check, why it matters and the fix.

This package owns the checklist: ``CHECKS``, in the order doctor reports them, is the one
registry. The checks live by what they look at: ``dead_letters`` (where rejected messages go),
``lanes`` (parking and work queue bounds), ``traffic`` (messages at risk in flight),
``config`` (policies, timeouts, the topology file), ``cluster`` (the nodes: alarms, quorum
queue members), ``delayed`` (delay ladders) and ``backlog`` (dead letters held for a target
that has not taken them);
``common`` holds what they share.
``DEDUPE_CHECK`` (``dedupe``) runs only when doctor is given an idempotent-consumer store.
"""

from __future__ import annotations

from rmqkit.health.checks.backlog import dead_letter_backlog_held
from rmqkit.health.checks.cluster import broker_alarm, quorum_members
from rmqkit.health.checks.config import (
    PER_QUEUE_CONSUMER_TIMEOUT_SINCE,
    classic_mirrored_policies,
    handler_timeout_above_consumer_timeout,
    topology_out_of_sync,
)
from rmqkit.health.checks.dead_letters import (
    at_least_once_without_reject_publish,
    dead_letter_target_missing,
    quorum_without_dead_letter,
)
from rmqkit.health.checks.dedupe import DEDUPE_CHECK, dedupe_window_short
from rmqkit.health.checks.delayed import delayed_stuck
from rmqkit.health.checks.lanes import parking_limit_or_ttl, unbounded_work_queue
from rmqkit.health.checks.traffic import (
    growing_without_consumers,
    transient_messages,
    unroutable_dropped,
)
from rmqkit.health.findings import Check, CheckSkipped, DoctorInput, Finding

CHECKS: tuple[Check, ...] = (
    Check("broker-alarm", "memory or disk alarm on a node", broker_alarm),
    Check("quorum-members", "quorum queue members offline or too few", quorum_members),
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
    Check("delayed-stuck", "delayed messages due but not taken by their target", delayed_stuck),
    Check(
        "dead-letter-backlog-held",
        "dead letters held because their target refuses them (e.g. a full work queue)",
        dead_letter_backlog_held,
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
    "DEDUPE_CHECK",
    "PER_QUEUE_CONSUMER_TIMEOUT_SINCE",
    "Check",
    "CheckSkipped",
    "DoctorInput",
    "Finding",
    "at_least_once_without_reject_publish",
    "broker_alarm",
    "classic_mirrored_policies",
    "dead_letter_backlog_held",
    "dead_letter_target_missing",
    "dedupe_window_short",
    "delayed_stuck",
    "growing_without_consumers",
    "handler_timeout_above_consumer_timeout",
    "parking_limit_or_ttl",
    "quorum_members",
    "quorum_without_dead_letter",
    "topology_out_of_sync",
    "transient_messages",
    "unbounded_work_queue",
    "unroutable_dropped",
]

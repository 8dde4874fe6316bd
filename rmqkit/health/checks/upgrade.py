"""The upgrade preflight of `rmqkit doctor --target 4.3`: what RabbitMQ 4.3 refuses or does
differently for this vhost, found on the broker it runs on today (3.x, 4.0 to 4.2).

What 4.3 does was seen on 4.3.6 (tests/integration/test_doctor_upgrade.py runs each refusal
there), not only read from release notes, which differ from 4.3.6 in places: 4.3.0's notes
refuse ``x-queue-mode`` and transient non-exclusive queues, 4.3.6 accepts both. Each check is
pure over ``DoctorInput``; ``inp.upgrade`` holds the channels and feature flags read for it.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from rmqkit.broker.snapshot import QueueView, count
from rmqkit.health.findings import (
    Check,
    CheckSkipped,
    DoctorInput,
    Finding,
    Severity,
    UpgradeFacts,
)

# The feature flags 4.3 requires that not every older release has; with every stable flag of
# the running release they must be enabled before the upgrade (4.3.0 release notes).
REQUIRED_BY_4_3 = (
    "rabbitmq_4.0.0",
    "rabbitmq_4.1.0",
    "rabbitmq_4.2.0",
    "khepri_db",
    "quorum_queue_non_voters",
    "message_containers_deaths_v2",
)
UPGRADE_GUIDE = "https://www.rabbitmq.com/docs/upgrade"


def _facts(inp: DoctorInput) -> UpgradeFacts:
    if inp.upgrade is None:  # run_doctor always reads them with a target; a check alone may not
        raise CheckSkipped("no upgrade target given (--target)")
    return inp.upgrade


def _version(inp: DoctorInput) -> str:
    return ".".join(map(str, inp.snapshot.version))


def _all_queues(inp: DoctorInput) -> list[QueueView]:
    """Exclusive queues too: what refuses their declare breaks the application that owns them."""
    return [q for _, q in sorted(inp.snapshot.queues.items())]


def _policies(inp: DoctorInput) -> Iterator[tuple[str, str, dict[str, Any]]]:
    """(kind, name, definition) of every user and operator policy of the vhost."""
    for kind, rows in (
        ("policy", inp.snapshot.policies),
        ("operator-policy", inp.snapshot.operator_policies),
    ):
        for row in rows:
            definition = row.get("definition")
            if isinstance(definition, dict):
                yield kind, str(row.get("name")), definition


# --- upgrade-path ------------------------------------------------------------------------------
def upgrade_path(inp: DoctorInput) -> list[Finding]:
    """4.3 upgrades in place only from 4.2.x: critical on anything older."""
    target = _facts(inp).target
    if inp.snapshot.version[:2] >= (4, 2):
        return []
    want = ".".join(map(str, target))
    return [
        Finding(
            "upgrade-path",
            "critical",
            "vhost",
            inp.snapshot.vhost,
            f"RabbitMQ {_version(inp)}: {want} upgrades in place only from the latest 4.2.x",
            "upgrade step by step to the latest 4.2.x first (each step with every feature flag "
            f"enabled; {UPGRADE_GUIDE} lists the steps), or move to a new {want} cluster "
            "(blue-green: import the definitions, then drain or shovel the queues)",
        )
    ]


# --- feature-flags -----------------------------------------------------------------------------
def feature_flags(inp: DoctorInput) -> list[Finding]:
    """Every stable feature flag must be enabled before the upgrade (critical); ``khepri_db``
    too, because 4.3 has no Mnesia: critical wherever the running release has it disabled."""
    facts = _facts(inp)
    if facts.feature_flags is None:
        raise CheckSkipped(
            "the management user may not read /api/feature-flags (it needs the administrator "
            "tag on 3.x): run `rabbitmqctl list_feature_flags` on a node"
        )
    vhost = inp.snapshot.vhost
    found: list[Finding] = []
    disabled = sorted(
        name
        for name, (state, stability) in facts.feature_flags.items()
        if state != "enabled"
        and (stability in ("stable", "required") or name in REQUIRED_BY_4_3)
        and name != "khepri_db"
    )
    if disabled:
        found.append(
            Finding(
                "feature-flags",
                "critical",
                "vhost",
                vhost,
                f"feature flags not enabled on {_version(inp)}: {', '.join(disabled)} — an "
                "upgrade with a stable flag disabled is refused at node start",
                "`rabbitmqctl enable_feature_flag all` on one node before the next upgrade step",
            )
        )
    khepri = facts.feature_flags.get("khepri_db")
    if khepri is not None and khepri[0] != "enabled":
        found.append(
            Finding(
                "feature-flags",
                "critical",
                "vhost",
                vhost,
                f"khepri_db is {khepri[0]} ({khepri[1]}): 4.3 stores its metadata in Khepri "
                "only (Mnesia is removed)",
                "on the latest 4.2.x, with every node up: `rabbitmqctl enable_feature_flag "
                "khepri_db` (the migration needs a majority of the nodes, see khepri-majority)",
            )
        )
    return found


# --- khepri-majority ---------------------------------------------------------------------------
def khepri_majority(inp: DoctorInput) -> list[Finding]:
    """Khepri is a Raft store: every metadata change (declare, bind, policy, user) needs a
    majority of the cluster's nodes. Critical with a node down now, warning for two nodes
    (the loss of either stops every declare)."""
    _facts(inp)
    nodes = inp.snapshot.nodes
    if nodes is None:
        raise CheckSkipped(
            "the management user may not read /api/nodes (it needs the monitoring tag): "
            "the cluster's size is unknown"
        )
    total, running = len(nodes), [n.name for n in nodes if n.running]
    majority = total // 2 + 1
    down = sorted(n.name for n in nodes if not n.running)
    if down:
        severity: Severity = "critical" if len(running) < majority else "warning"
        return [
            Finding(
                "khepri-majority",
                severity,
                "node",
                ", ".join(down),
                f"{len(running)} of {total} nodes running: on 4.3 metadata changes need "
                f"{majority} of {total}; the khepri_db migration needs them all",
                "bring the nodes back, or remove the ones that are gone for good "
                "(`rabbitmqctl forget_cluster_node`), before the upgrade",
            )
        ]
    if total == 2:
        return [
            Finding(
                "khepri-majority",
                "warning",
                "node",
                ", ".join(running),
                "a 2-node cluster: on 4.3 a majority is both nodes, so losing either stops "
                "every declare, bind and policy change (no more tolerance than one node)",
                "run 3 (or 5) nodes before the upgrade",
            )
        ]
    return []


# --- global-qos --------------------------------------------------------------------------------
def global_qos(inp: DoctorInput) -> list[Finding]:
    """A channel with ``basic.qos(global=true)``: 4.3 takes it as a per-consumer prefetch (seen
    on 4.3.6), so a channel's N consumers may hold N times the limit unacked (warning)."""
    facts = _facts(inp)
    if facts.channels is None:
        raise CheckSkipped("the management user may not read the vhost's channels (monitoring tag)")
    if inp.snapshot.version[:2] >= (4, 0):
        raise CheckSkipped(
            f"RabbitMQ {_version(inp)}'s management API does not report global QoS: look for "
            "'global_qos' in the broker log's deprecation warnings"
        )
    found: list[Finding] = []
    for channel in facts.channels:
        limit = count(channel.get("global_prefetch_count"))
        if not limit:
            continue
        consumers = count(channel.get("consumer_count")) or 0
        details = channel.get("connection_details")
        client = details.get("name") if isinstance(details, dict) else None
        found.append(
            Finding(
                "global-qos",
                "warning",
                "channel",
                str(channel.get("name")),
                f"basic.qos(global=true) prefetch {limit} shared by {consumers} consumer(s) of "
                f"user {channel.get('user')!r}{f' ({client})' if client else ''}: 4.3 applies "
                f"it per consumer, up to {max(consumers, 1) * limit} unacked on this channel",
                "set the prefetch per consumer (basic.qos global=false) to what each consumer "
                "may hold",
            )
        )
    return found


# --- transient-queues --------------------------------------------------------------------------
def transient_queues(inp: DoctorInput) -> list[Finding]:
    """Non-durable, non-exclusive queues: the deprecated feature ``transient_nonexcl_queues``
    (4.3.0's notes deny it by default, 4.3.6 still permits it; to be removed): warning."""
    _facts(inp)
    return [
        Finding(
            "transient-queues",
            "warning",
            "queue",
            queue.name,
            "durable=false and exclusive=false: a deprecated queue kind (transient_nonexcl_"
            "queues) that 4.3 refuses where the operator denies it, and a later release removes",
            "declare it durable (with x-expires if it should go away unused) or exclusive",
        )
        for queue in _all_queues(inp)
        if not queue.durable and not queue.exclusive
    ]


# --- classic-queue-v1 --------------------------------------------------------------------------
def classic_queue_v1(inp: DoctorInput) -> list[Finding]:
    """CQv1 is removed: ``x-queue-version: 1`` is refused (critical: the application that
    declares the queue fails); ``x-queue-mode`` and the policy keys are ignored (warning)."""
    _facts(inp)
    found: list[Finding] = []
    for queue in _all_queues(inp):
        if count(queue.arguments.get("x-queue-version")) == 1:
            found.append(
                Finding(
                    "classic-queue-v1",
                    "critical",
                    "queue",
                    queue.name,
                    "argument x-queue-version 1: 4.3 refuses the declare (PRECONDITION_FAILED, "
                    "unsupported queue version '1'), so its application fails on start",
                    "drop x-queue-version from the application's declare (4.3 has only "
                    "version 2; the queue itself is converted on the way to 4.2)",
                )
            )
        if "x-queue-mode" in queue.arguments:
            found.append(
                Finding(
                    "classic-queue-v1",
                    "warning",
                    "queue",
                    queue.name,
                    f"argument x-queue-mode {queue.arguments['x-queue-mode']!r}: there is no "
                    "queue mode on 4.3 (accepted and ignored by 4.3.6; 4.3.0's notes refuse it)",
                    "drop x-queue-mode from the application's declare",
                )
            )
    for kind, name, definition in _policies(inp):
        stale = [
            key
            for key in ("queue-mode", "queue-version")
            if key in definition and (key == "queue-mode" or count(definition.get(key)) == 1)
        ]
        if stale:
            found.append(
                Finding(
                    "classic-queue-v1",
                    "warning",
                    kind,
                    name,
                    f"sets {', '.join(f'{k}={definition[k]!r}' for k in stale)}: classic queue "
                    "version 1 and lazy mode are gone on 4.3 (the keys have no effect)",
                    f"remove {' and '.join(stale)} from the {kind}",
                )
            )
    return found


# --- queue-master-locator ----------------------------------------------------------------------
def queue_master_locator(inp: DoctorInput) -> list[Finding]:
    """The deprecated ``queue_master_locator`` is denied on 4.3: the argument closes the
    declaring connection (541 INTERNAL_ERROR), the policy key fails validation: critical."""
    _facts(inp)
    found = [
        Finding(
            "queue-master-locator",
            "critical",
            "queue",
            queue.name,
            f"argument x-queue-master-locator {queue.arguments['x-queue-master-locator']!r}: "
            "4.3 closes the connection that declares it (541 INTERNAL_ERROR, deprecated "
            "feature queue_master_locator)",
            "declare it with x-queue-leader-locator (client-local or balanced) instead",
        )
        for queue in _all_queues(inp)
        if "x-queue-master-locator" in queue.arguments
    ]
    found += [
        Finding(
            "queue-master-locator",
            "critical",
            kind,
            name,
            f"sets queue-master-locator={definition['queue-master-locator']!r}: 4.3 refuses "
            "this definition (400, use of deprecated queue-master-locator is not permitted), so "
            "a definitions import or a re-apply of it fails",
            f"replace the key with queue-leader-locator in the {kind}",
        )
        for kind, name, definition in _policies(inp)
        if "queue-master-locator" in definition
    ]
    return found


# --- classic-consumer-timeout ------------------------------------------------------------------
def classic_consumer_timeout(inp: DoctorInput) -> list[Finding]:
    """4.3 refuses ``x-consumer-timeout`` on a classic queue (PRECONDITION_FAILED, invalid
    arg, seen on 4.3.6): critical."""
    _facts(inp)
    return [
        Finding(
            "classic-consumer-timeout",
            "critical",
            "queue",
            queue.name,
            "classic queue with argument x-consumer-timeout "
            f"{queue.arguments['x-consumer-timeout']}: 4.3 refuses the declare "
            "(PRECONDITION_FAILED, invalid arg for a classic queue)",
            "drop the argument (on 4.3 a consumer may pass x-consumer-timeout on its own "
            "basic.consume), or make the queue a quorum queue",
        )
        for queue in _all_queues(inp)
        if queue.type == "classic" and "x-consumer-timeout" in queue.arguments
    ]


# --- delivery-limit-counting -------------------------------------------------------------------
def delivery_limit_counting(inp: DoctorInput) -> list[Finding]:
    """On 4.3 ``basic.nack(requeue=true)`` and consumer-timeout returns no longer count toward
    a quorum queue's delivery limit (reject and a closed channel still do): a consumer relying
    on the limit to stop a poison message may loop (warning). Queues the topology file names
    as work queues are left out: `rmqkit consume` counts attempts in its own header."""
    facts = _facts(inp)
    found: list[Finding] = []
    for queue in _all_queues(inp):
        if queue.type != "quorum" or queue.delivery_limit is None or queue.exclusive:
            continue
        if queue.name in facts.rmqkit_queues or inp.role(queue.name) in (
            "wait",
            "parking",
            "delay",
        ):
            continue
        found.append(
            Finding(
                "delivery-limit-counting",
                "warning",
                "queue",
                queue.name,
                f"delivery limit {queue.delivery_limit} ({queue.delivery_limit_source}): on 4.3 "
                "a basic.nack with requeue and a consumer timeout no longer count toward it, so "
                "a consumer that nacks or hangs on a poison message redelivers it without end",
                "return messages with basic.reject (requeue) or count attempts in the consumer "
                "(`rmqkit consume` does; `doctor --topology` leaves its work queues out)",
            )
        )
    return found


UPGRADE_CHECKS: tuple[Check, ...] = (
    Check("upgrade-path", "an in-place upgrade path to the target", upgrade_path),
    Check("feature-flags", "feature flags the target requires", feature_flags),
    Check("khepri-majority", "a node majority for Khepri", khepri_majority),
    Check("queue-master-locator", "queue-master-locator (denied)", queue_master_locator),
    Check("classic-queue-v1", "classic queue version 1 and queue mode", classic_queue_v1),
    Check(
        "classic-consumer-timeout",
        "consumer timeout arguments on classic queues",
        classic_consumer_timeout,
    ),
    Check("transient-queues", "transient non-exclusive queues", transient_queues),
    Check("global-qos", "channels with global QoS", global_qos),
    Check(
        "delivery-limit-counting",
        "delivery limits relied on for nacks and timeouts",
        delivery_limit_counting,
    ),
)
"""The preflight for ``--target 4.3``, in report order."""

__all__ = ["REQUIRED_BY_4_3", "UPGRADE_CHECKS"]

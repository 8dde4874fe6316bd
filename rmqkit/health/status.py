"""`rmqkit status`: depth, consumers and rates per queue, grouped per work queue.

Everything comes from the management API in one read, but for what it lacks
(rmqkit.health.fill): a ready count its stats do not have yet is read by passive declare. The
oldest message's age is the queue's ``head_message_timestamp`` where the broker keeps one
(classic queues whose messages carry a timestamp; never quorum queues); it is never read by
taking the head message, which would spend a delivery attempt. For parking queues the true
age is opt-in: ``parking_age=True`` browses each non-empty one
(``rmqkit.parking.ops.parking_stats``), which reads every message and returns them all, in
order (a parking queue has no delivery limit).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import Any

from rmqkit.broker.identity import broker_identity
from rmqkit.broker.management import ManagementClient, management
from rmqkit.broker.snapshot import QueueView, Snapshot, number, read_snapshot
from rmqkit.health.alarms import NodeAlarm, node_alarms
from rmqkit.health.backlog import HeldBacklog, held_backlog, held_count
from rmqkit.health.delayed import DelayedView, find_ladders, ladder_target, rung_names
from rmqkit.health.quorum import QuorumState, quorum_state
from rmqkit.health.roles import Role, classify, flow_parent
from rmqkit.names import tier_of
from rmqkit.settings import Settings
from rmqkit.topology import Topology
from rmqkit.topology.expand import expand

# rows with an oldest column
AGED_ROLES: tuple[Role, ...] = ("work", "parking", "archive", "other")
_ROLE_ORDER = {"work": 0, "wait": 1, "parking": 2, "archive": 3, "delay": 4, "other": 5}


@dataclass(frozen=True)
class QueueStatus:
    """One queue's numbers; None where the broker does not say (stats off, queue missing)."""

    name: str
    role: Role
    owner: str  # the work queue it belongs to (itself for work and unrelated queues)
    exists: bool = True
    type: str | None = None
    ready: int | None = None
    unacked: int | None = None
    messages: int | None = None
    consumers: int | None = None
    publish_rate: float | None = None
    deliver_rate: float | None = None
    ack_rate: float | None = None
    oldest_age_s: float | None = None
    oldest_age_from: str | None = None  # "head timestamp" | "browse"
    ready_from: str = "management"  # or "passive declare": the management API had none yet
    note: str = ""
    delay_ms: int | None = None  # wait queues: the TTL in effect
    quorum: QuorumState | None = None  # quorum queues: leader and members, when the broker says
    # Dead letters held for a target that has not taken them (messages_dlx; rmqkit.health.
    # backlog): not ready, so a wait queue holding retries for a full work queue shows ready 0.
    dead_letter_held: int | None = None
    held_for: tuple[str, ...] = ()  # the queues they are dead-lettered to
    held_cause: str = ""  # why they have not gone (e.g. "hb.work full (…)")

    @property
    def tier(self) -> str | None:
        """Wait queues: the tier's main queue name (jitter slots collapse into it); delay
        ladder rungs: the ladder's name (its rungs collapse into it)."""
        if self.role == "delay":
            return self.name.rpartition(".")[0]
        return tier_of(self.name) if self.role == "wait" else None

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready form."""
        return {
            "name": self.name,
            "role": self.role,
            "owner": self.owner,
            "exists": self.exists,
            "type": self.type,
            "ready": self.ready,
            "unacked": self.unacked,
            "messages": self.messages,
            "consumers": self.consumers,
            "publish_rate": self.publish_rate,
            "deliver_rate": self.deliver_rate,
            "ack_rate": self.ack_rate,
            "oldest_age_s": self.oldest_age_s,
            "oldest_age_from": self.oldest_age_from,
            "ready_from": self.ready_from,
            "delay_ms": self.delay_ms,
            "dead_letter_held": self.dead_letter_held,
            "dead_letter_held_for": list(self.held_for),
            "note": self.note,
            **(
                self.quorum.as_dict()
                if self.quorum is not None
                else dict.fromkeys(("leader", "members", "online", "offline", "majority"))
            ),
        }


def _sum(values: list[int | None]) -> int | None:
    known = [v for v in values if v is not None]
    return sum(known) if known else None


def _rate_sum(values: list[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return sum(known) if known else None


@dataclass(frozen=True)
class GroupStatus:
    """A work queue with its lanes or partitions, wait and parking queues, and its own delay
    ladder if it has one."""

    work: str
    queues: list[QueueStatus]

    def _of(self, role: Role) -> list[QueueStatus]:
        return [q for q in self.queues if q.role == role]

    def as_dict(self) -> dict[str, Any]:
        """Totals per role: what an operator (or a dashboard) looks at first. The work
        numbers add up the work queue and its lanes or partitions (``work_queues``);
        ``delayed`` is what the queue's own delay ladder holds (None: it has none)."""
        work = self._of("work")
        wait, parking, delay = self._of("wait"), self._of("parking"), self._of("delay")
        archive = self._of("archive")
        ages = [q.oldest_age_s for q in parking if q.oldest_age_s is not None]
        return {
            "work": self.work,
            "work_queues": [q.name for q in work],
            "ready": _sum([q.ready for q in work]),
            "unacked": _sum([q.unacked for q in work]),
            "consumers": _sum([q.consumers for q in work]),
            "publish_rate": _rate_sum([q.publish_rate for q in work]),
            "deliver_rate": _rate_sum([q.deliver_rate for q in work]),
            "waiting": _sum([q.messages for q in wait]),
            "wait_queues": len(wait),
            "delayed": _sum([q.messages for q in delay]) if delay else None,
            "parked": _sum([q.messages for q in parking]),
            "parking": [q.name for q in parking],
            # set aside by `parking archive`, expiring by the archive's retention (None: no archive)
            "archived": _sum([q.messages for q in archive]) if archive else None,
            "parked_oldest_age_s": max(ages) if ages else None,
            # dead letters its queues hold for a target that refuses them (work queue full)
            "dead_letter_held": _sum(
                [q.dead_letter_held for q in self.queues if q.role != "delay"]
            ),
        }


@dataclass(frozen=True)
class StatusReport:
    """Every queue of the vhost (or of the topology), grouped per work queue."""

    vhost: str
    broker_version: tuple[int, int, int]
    taken_at: datetime
    queues: list[QueueStatus]
    groups: list[GroupStatus] = field(default_factory=list)
    rates_kept: bool = True
    source: str | None = None  # the topology file, if one selected the queues
    # AMQP unreachable, or another cluster than the management API (see broker.identity)
    broker_warning: str | None = None
    # Memory/disk alarms of the cluster's nodes; None: /api/nodes not readable (monitoring tag)
    alarms: list[NodeAlarm] | None = field(default_factory=list)
    # The vhost's delay ladders (docs/delay.md): delayed messages are their own state
    delayed: list[DelayedView] = field(default_factory=list)

    def delayed_dict(self) -> dict[str, Any]:
        """Delayed messages in total, stuck ones, and per ladder (``for``: its work queue)."""
        return {
            "total": sum(v.waiting + v.stuck for v in self.delayed),
            "waiting": sum(v.waiting for v in self.delayed),
            "stuck": sum(v.stuck for v in self.delayed),
            "ladders": [v.as_dict() for v in self.delayed],
        }

    @property
    def without_majority(self) -> list[QuorumState]:
        """Quorum queues with fewer members online than a majority: they cannot work."""
        return [q.quorum for q in self.queues if q.quorum is not None and not q.quorum.has_majority]

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready form (``warning`` only when there is one; ``alarms`` null when the
        nodes could not be read)."""
        warning = {"warning": self.broker_warning} if self.broker_warning else {}
        return {
            **warning,
            "alarms": None if self.alarms is None else [a.as_dict() for a in self.alarms],
            "without_majority": [q.queue for q in self.without_majority],
            "vhost": self.vhost,
            "broker_version": ".".join(map(str, self.broker_version)),
            "taken_at": self.taken_at.isoformat(),
            "topology": self.source,
            "rates_kept": self.rates_kept,
            "delayed": self.delayed_dict(),
            "groups": [g.as_dict() for g in self.groups],
            "queues": [q.as_dict() for q in self.queues],
        }


def _head_age_s(queue: QueueView, now: datetime) -> float | None:
    stamp = number(queue.raw.get("head_message_timestamp"))
    if stamp is None or stamp <= 0:
        return None
    return max(0.0, now.timestamp() - stamp)


def queue_status(
    queue: QueueView, role: Role, owner: str, now: datetime, backlog: HeldBacklog | None = None
) -> QueueStatus:
    """The status row of one live queue; ``backlog``: the dead letters it holds, if any
    (``rmqkit.health.backlog.held_backlog``), said in its note."""
    # The head message's timestamp, where the broker keeps one (classic queues, for messages
    # published with a timestamp). Never read by taking the head message: a get with requeue
    # spends a delivery attempt of a quorum queue's message.
    age = _head_age_s(queue, now) if role in AGED_ROLES else None
    ttl = queue.settings.get("message-ttl")
    return QueueStatus(
        name=queue.name,
        role=role,
        owner=owner,
        type=queue.type,
        ready=queue.ready,
        unacked=queue.unacked,
        messages=queue.messages,
        consumers=queue.consumers,
        publish_rate=queue.publish_rate,
        deliver_rate=queue.deliver_rate,
        ack_rate=queue.ack_rate,
        oldest_age_s=age,
        oldest_age_from="head timestamp" if age is not None else None,
        delay_ms=int(ttl) if role == "wait" and isinstance(ttl, int) else None,
        quorum=quorum_state(queue),
        dead_letter_held=held_count(queue),
        held_for=tuple(backlog.target_names) if backlog is not None else (),
        held_cause=backlog.cause() if backlog is not None else "",
        note=backlog.note() if backlog is not None else "",
    )


def _order(row: QueueStatus) -> tuple[int, int, str]:
    return (_ROLE_ORDER[row.role], row.delay_ms or 0, row.name)


def build_status(
    snapshot: Snapshot, topology: Topology | None = None, now: datetime | None = None
) -> StatusReport:
    """Rows and groups from a snapshot (pure). With a topology: its queues only, in its
    grouping, missing ones marked; without: every queue, grouped by the roles inferred from
    dead-letter wiring."""
    now = now or datetime.now(UTC)
    rows: list[QueueStatus] = []
    rungs = rung_names(snapshot)
    if topology is not None:
        desired = expand(topology, broker_version=snapshot.version)
        known: dict[str, tuple[Role, str]] = {
            q.name: (q.role, _parent(topology, q.owner)) for q in desired.queues
        }
        for spec in desired.queues:
            if spec.name in rungs:
                continue  # a rung the expansion lists: shown with its ladder below
            live = snapshot.queues.get(spec.name)
            if live is None:
                rows.append(
                    QueueStatus(
                        spec.name,
                        spec.role,
                        known[spec.name][1],
                        exists=False,
                        note="not declared",
                        delay_ms=spec.delay_ms,
                    )
                )
            else:
                backlog = held_backlog(snapshot, live, known)
                rows.append(queue_status(live, spec.role, known[spec.name][1], now, backlog))
        # The delay ladders on the vhost, whether the file declares them or not: a message
        # in a rung is delayed, not lost in an unknown queue.
        for name, base in sorted(rungs.items()):
            owner = ladder_target(base, snapshot, rungs) or base
            rows.append(queue_status(snapshot.queues[name], "delay", owner, now))
            known.setdefault(name, ("delay", owner))
    else:
        roles = classify(snapshot)
        # lanes and partitions are grouped under their work queue
        known = {
            name: (role, flow_parent(owner, roles, snapshot.queues))
            for name, (role, owner) in roles.items()
        }
        for name, queue in sorted(snapshot.queues.items()):
            role, owner = known[name]
            backlog = held_backlog(snapshot, queue, roles) if role != "delay" else None
            rows.append(queue_status(queue, role, owner, now, backlog))
    groups: dict[str, list[QueueStatus]] = {}
    for row in rows:
        groups.setdefault(row.owner, []).append(row)
    ordered: list[GroupStatus] = []
    flat: list[QueueStatus] = []
    for owner in sorted(groups):
        members = sorted(groups[owner], key=_order)
        flat.extend(members)
        # a work queue's group; a partitioned one has no queue of its name, only partitions
        if known.get(owner, ("other", owner))[0] == "work" or any(
            m.role == "work" for m in members
        ):
            ordered.append(GroupStatus(owner, members))
    return StatusReport(
        vhost=snapshot.vhost,
        broker_version=snapshot.version,
        taken_at=now,
        queues=flat,
        groups=ordered,
        rates_kept=snapshot.rates_kept,
        source=topology.source if topology is not None else None,
        alarms=None if snapshot.nodes is None else node_alarms(snapshot.nodes),
        delayed=find_ladders(snapshot),
    )


def _parent(topology: Topology, owner: str) -> str:
    """The file's work queue a lane or partition queue serves (``Topology.parent_of``)."""
    return topology.parent_of(owner) or owner


async def read_status(
    api: ManagementClient,
    *,
    topology: Topology | None = None,
    settings: Settings | None = None,
    parking_age: bool = False,
    check_broker: bool = False,
) -> StatusReport:
    """One status reading through an open management client (``--watch`` keeps it open).

    ``parking_age`` needs ``settings`` (it browses over AMQP). ``check_broker`` (with
    ``settings``): also connect over AMQP and set ``broker_warning`` when that fails or
    reaches another cluster than the management API (the numbers would be another broker's).
    With ``settings``, a ready count the management API does not have yet (its stats lag a
    new queue's first messages) is read by passive declare (``with_amqp_counts``)."""
    report = build_status(await read_snapshot(api), topology)
    if check_broker and settings is not None:
        identity = await broker_identity(settings, await api.overview())
        problem = (
            f"AMQP at {identity.amqp_url} is unreachable ({identity.amqp_error})"
            if identity.amqp_error
            else identity.mismatch
        )
        if problem is not None:
            report = replace(report, broker_warning=f"{problem} — {identity.fix()}")
    from rmqkit.health.fill import with_amqp_counts, with_parking_ages  # they build on this

    if settings is not None and report.broker_warning is None:
        # not when AMQP is unreachable or reaches another cluster (its counts are not these)
        report = await with_amqp_counts(settings, report)
    if parking_age and settings is not None:
        report = await with_parking_ages(settings, report)
    return report


async def read_status_once(
    settings: Settings, *, topology: Topology | None = None, parking_age: bool = False
) -> StatusReport:
    """One status reading of the vhost the settings point at."""
    async with management(settings) as api:
        return await read_status(
            api, topology=topology, settings=settings, parking_age=parking_age, check_broker=True
        )


__all__ = [
    "AGED_ROLES",
    "GroupStatus",
    "QueueStatus",
    "StatusReport",
    "build_status",
    "queue_status",
    "read_status",
    "read_status_once",
]

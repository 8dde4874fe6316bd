"""`rmqkit doctor`: a live vhost against the reliability checklist.

``run_doctor`` fetches once (management API), samples the ready count of idle queues twice
over AMQP (immediate, unlike management stats), plans the topology file if one is given, then
runs the pure checks of ``rmqkit.health.checks``. The report's status follows the Nagios
convention: 0 ok, 1 warning, 2 critical.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Literal

from rmqkit.broker.identity import BrokerIdentity, broker_identity
from rmqkit.broker.management import management
from rmqkit.broker.session import session
from rmqkit.broker.snapshot import Snapshot, count, read_snapshot
from rmqkit.consumer.config import DEFAULT_HANDLER_TIMEOUT_S
from rmqkit.errors import DataError
from rmqkit.health.checks import CHECKS, DEDUPE_CHECK
from rmqkit.health.checks.traffic import transient_candidates
from rmqkit.health.checks.upgrade import UPGRADE_CHECKS
from rmqkit.health.dedupe import read_dedupe_window
from rmqkit.health.findings import (
    SEVERITY_RANK,
    Check,
    CheckSkipped,
    DoctorInput,
    Finding,
    Severity,
    UpgradeFacts,
)
from rmqkit.health.roles import Role, classify
from rmqkit.health.upgrade import read_upgrade_facts
from rmqkit.settings import Settings
from rmqkit.topology import Topology
from rmqkit.topology.desired import Via
from rmqkit.topology.expand import expand
from rmqkit.topology.plan import LiveState, Plan, compute_plan

CheckStatus = Literal["ok", "warning", "critical", "skipped"]
MAX_SAMPLED_QUEUES = 500  # keep doctor fast on a vhost with thousands of idle queues
# transient-messages is confirmed by a second read this much later: longer than the management
# stats interval (collect_statistics_interval, 5 s by default), so it is a fresh sample.
TRANSIENT_RECHECK_S = 6.0


def worst_severity(findings: list[Finding]) -> Severity:
    """The worst severity among ``findings`` ("ok" for none)."""
    worst: Severity = "ok"
    for finding in findings:
        if SEVERITY_RANK[finding.severity] > SEVERITY_RANK[worst]:
            worst = finding.severity
    return worst


@dataclass(frozen=True)
class CheckResult:
    """One check's verdict and its findings."""

    id: str
    title: str
    status: CheckStatus
    findings: list[Finding] = field(default_factory=list)
    note: str = ""

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready form (without the findings, which the report lists once)."""
        return {
            "id": self.id,
            "title": self.title,
            "status": self.status,
            "findings": len(self.findings),
            "note": self.note,
        }


@dataclass(frozen=True)
class DoctorReport:
    """Every check's result for one vhost."""

    vhost: str
    broker_version: tuple[int, int, int]
    checked_at: datetime
    checks: list[CheckResult]
    target: tuple[int, int] | None = None  # --target: an upgrade preflight for that version

    @property
    def findings(self) -> list[Finding]:
        """All findings, worst first."""
        found = [f for c in self.checks for f in c.findings]
        return sorted(found, key=lambda f: -SEVERITY_RANK[f.severity])

    @property
    def status(self) -> Severity:
        """The worst severity found ("ok" if nothing)."""
        return worst_severity(self.findings)

    @property
    def exit_code(self) -> int:
        """Nagios plugin convention: 0 ok, 1 warning, 2 critical."""
        return SEVERITY_RANK[self.status]

    def counts(self) -> dict[str, int]:
        """Findings per severity."""
        out = {"critical": 0, "warning": 0}
        for finding in self.findings:
            if finding.severity in out:
                out[finding.severity] += 1
        return out

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready form."""
        return {
            "vhost": self.vhost,
            "broker_version": ".".join(map(str, self.broker_version)),
            "target": None if self.target is None else ".".join(map(str, self.target)),
            "checked_at": self.checked_at.isoformat(),
            "status": self.status,
            "exit_code": self.exit_code,
            "counts": self.counts(),
            "findings": [f.as_dict() for f in self.findings],
            "checks": [c.as_dict() for c in self.checks],
        }


def run_checks(inp: DoctorInput, checks: tuple[Check, ...] = CHECKS) -> list[CheckResult]:
    """Run ``checks`` over ``inp`` (pure: no I/O)."""
    results: list[CheckResult] = []
    for check in checks:
        try:
            findings = check.run(inp)
        except CheckSkipped as skipped:
            results.append(CheckResult(check.id, check.title, "skipped", note=str(skipped)))
            continue
        results.append(CheckResult(check.id, check.title, worst_severity(findings), findings))
    return results


def topology_roles(topology: Topology, snapshot: Snapshot) -> dict[str, tuple[Role, str]]:
    """Roles the topology file gives its queues (work, wait, parking, archive; owner work
    queue)."""
    desired = expand(topology, broker_version=snapshot.version)
    return {q.name: (q.role, q.owner) for q in desired.queues}


def topology_plan(snapshot: Snapshot, topology: Topology, via: Via) -> Plan:
    """What `rmqkit plan` reports for ``topology``, computed from the snapshot already read
    (the same ``compute_plan`` as ``plan_topology``, without a second connection and read)."""
    live = LiveState(
        queues={name: q.raw for name, q in snapshot.queues.items()},
        exchanges={name: x for name, x in snapshot.exchanges.items() if name},
        bindings=list(snapshot.bindings),
        policies={str(p.get("name")): p for p in snapshot.policies},
        operator_policies=list(snapshot.operator_policies),
        version=snapshot.version,
    )
    desired = expand(topology, via=via, broker_version=snapshot.version)
    return compute_plan(desired, live, source=topology.source, vhost=snapshot.vhost)


def idle_growth_candidates(snapshot: Snapshot, roles: dict[str, tuple[Role, str]]) -> list[str]:
    """Queues meant to be consumed that have no consumer (their ready counts get sampled).

    Management counts lag; a queue it shows as empty may not be, so ready counts are not
    used to narrow this down.
    """
    names = [
        name
        for name, queue in sorted(snapshot.queues.items())
        if not queue.exclusive
        and roles.get(name, ("other", name))[0] not in ("wait", "parking", "archive", "delay")
        and queue.consumers in (0, None)
    ]
    return names[:MAX_SAMPLED_QUEUES]


async def sample_ready(
    settings: Settings, names: list[str], interval_s: float
) -> dict[str, tuple[int, int]]:
    """Ready counts read by AMQP passive declare (immediate, where management counts lag by
    the stats interval): once for ``names``, then, ``interval_s`` later, again for those that
    held messages. Empty queues and queues that vanish in between are left out, so a vhost
    without idle messages costs no wait."""
    if not names:
        return {}
    async with session(settings, name="rmqkit doctor") as probes:

        async def read(queues: list[str]) -> dict[str, int]:
            out: dict[str, int] = {}
            for name in queues:
                try:
                    out[name] = (await probes.queue_depth(name)).ready
                except DataError:  # the queue went away (the session reopens its probe channel)
                    continue
            return out

        before = {name: n for name, n in (await read(names)).items() if n > 0}
        if not before:
            return {}
        await asyncio.sleep(interval_s)
        after = await read(sorted(before))
    return {name: (before[name], after[name]) for name in before if name in after}


async def _nothing() -> dict[str, tuple[int, int]]:
    return {}


async def reread_transient(
    settings: Settings, snapshot: Snapshot, roles: dict[str, tuple[Role, str]], interval_s: float
) -> dict[str, tuple[int | None, int | None]]:
    """The transient-messages candidates' (messages, messages_persistent), read again
    ``interval_s`` later (management API): the counters lag while messages arrive, so one read
    can show persistent messages as transient. No candidate: no wait."""
    names = [q.name for q in transient_candidates(DoctorInput(snapshot, roles))]
    if not names:
        return {}
    await asyncio.sleep(interval_s)
    out: dict[str, tuple[int | None, int | None]] = {}
    async with management(settings) as api:
        for name in names:
            found = await api.queue(name)
            if found is not None:
                out[name] = (count(found.get("messages")), count(found.get("messages_persistent")))
    return out


def topology_handler_timeouts(topology: Topology) -> dict[str, tuple[float, str]]:
    """Each work queue's handler_timeout from the file (seconds, source), queues without one
    left out. Lane and partition queues carry their parent's; a partitioned parent is no
    queue on the broker, so it has no entry."""
    out: dict[str, tuple[float, str]] = {}
    for name in topology.work_queue_names():
        spec = topology.queue_spec(name)
        if spec.handler_timeout is not None:
            out[name] = (spec.handler_timeout / 1000, "topology handler_timeout")
    return out


async def run_doctor(
    settings: Settings,
    *,
    topology: Topology | None = None,
    via: Via = "policy",
    handler_timeout_s: float | None = None,
    sample_interval_s: float = 1.0,
    dedupe_dsn: str | None = None,
    replay_horizon_s: float | None = None,
    transient_recheck_s: float = TRANSIENT_RECHECK_S,
    target: tuple[int, int] | None = None,
) -> DoctorReport:
    """Check the vhost the settings point at.

    ``handler_timeout_s`` is the consumers' handler timeout (default: each work queue's
    ``handler_timeout`` in the topology file, else the consumer's default). A
    ``sample_interval_s`` of 0 skips the second read of idle queues (growth is then judged
    from management rates alone). ``transient_recheck_s`` is how long after the first read
    the transient-messages candidates are read again (the finding must hold on both).

    With ``dedupe_dsn`` (an idempotent-consumer store) the ``dedupe-window-short`` check runs
    too: the store's window against the longest retry path plus ``replay_horizon_s``, the
    parking replay horizon the operator declares. A store that cannot be read is an error
    (69 unreachable, 78 not initialised), as the broker is.

    With ``target`` (e.g. ``(4, 3)``) doctor is the upgrade preflight instead: what that
    release refuses or does differently for this vhost (``checks.upgrade``), not the
    reliability checklist.
    """
    async with management(settings) as api:
        snapshot = await read_snapshot(api)
        overview = await api.overview()
        if target is not None:
            work = frozenset(topology.work_queue_names()) if topology is not None else frozenset()
            facts = await read_upgrade_facts(api, target, work)
    identity = await broker_identity(settings, overview)
    if target is not None:
        return _preflight(snapshot, identity, topology, facts)
    known = topology_roles(topology, snapshot) if topology is not None else None
    roles = classify(snapshot, known)
    handler_timeouts: dict[str, tuple[float, str]] = {}
    if handler_timeout_s is None and topology is not None:
        handler_timeouts = topology_handler_timeouts(topology)
    sampling = sample_interval_s > 0 and identity.amqp_error is None
    samples, reread = await asyncio.gather(
        sample_ready(settings, idle_growth_candidates(snapshot, roles), sample_interval_s)
        if sampling
        else _nothing(),
        reread_transient(settings, snapshot, roles, transient_recheck_s),
    )
    plan = topology_plan(snapshot, topology, via) if topology is not None else None
    dedupe = None
    if dedupe_dsn is not None:
        dedupe = await read_dedupe_window(dedupe_dsn, replay_horizon_s, snapshot, roles, topology)
    inp = DoctorInput(
        snapshot=snapshot,
        roles=roles,
        handler_timeout_s=(
            handler_timeout_s if handler_timeout_s is not None else DEFAULT_HANDLER_TIMEOUT_S
        ),
        handler_timeout_source=(
            "--handler-timeout" if handler_timeout_s is not None else "the consumer's default"
        ),
        handler_timeouts=handler_timeouts,
        ready_samples=samples,
        sample_interval_s=sample_interval_s,
        plan=plan,
        dedupe=dedupe,
        transient_reread=reread,
    )
    checks = CHECKS if dedupe is None else (*CHECKS, DEDUPE_CHECK)
    return DoctorReport(
        vhost=snapshot.vhost,
        broker_version=snapshot.version,
        checked_at=datetime.now(UTC),
        checks=[connection_check(identity, snapshot.vhost), *run_checks(inp, checks)],
    )


def _preflight(
    snapshot: Snapshot, identity: BrokerIdentity, topology: Topology | None, facts: UpgradeFacts
) -> DoctorReport:
    known = topology_roles(topology, snapshot) if topology is not None else None
    inp = DoctorInput(snapshot=snapshot, roles=classify(snapshot, known), upgrade=facts)
    return DoctorReport(
        vhost=snapshot.vhost,
        broker_version=snapshot.version,
        checked_at=datetime.now(UTC),
        checks=[connection_check(identity, snapshot.vhost), *run_checks(inp, UPGRADE_CHECKS)],
        target=facts.target,
    )


CONNECTION_CHECK = ("amqp-connection", "AMQP reaches the broker the management API describes")


def connection_check(identity: BrokerIdentity, vhost: str) -> CheckResult:
    """Critical when the AMQP port does not answer (nothing can consume or publish, whatever
    the management API says) or answers for another cluster than the management API."""
    check_id, title = CONNECTION_CHECK
    problem = (
        f"AMQP at {identity.amqp_url} is unreachable ({identity.amqp_error}) while the "
        f"management API at {identity.management_url} answers"
        if identity.amqp_error is not None
        else identity.mismatch
    )
    if problem is None:
        return CheckResult(check_id, title, "ok")
    finding = Finding(check_id, "critical", "vhost", vhost, problem, identity.fix())
    return CheckResult(check_id, title, "critical", [finding])


__all__ = [
    "CheckResult",
    "DoctorReport",
    "connection_check",
    "idle_growth_candidates",
    "run_checks",
    "run_doctor",
    "sample_ready",
    "topology_plan",
    "topology_roles",
    "worst_severity",
]

"""Plan and declare a topology against a live broker."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from rmqkit.broker.amqp import Connection, connection, parse_version, server_version
from rmqkit.broker.management import ManagementClient, management
from rmqkit.broker.session import Session
from rmqkit.broker.vhosts import create_vhost as make_vhost
from rmqkit.broker.vhosts import management_user, vhost_exists
from rmqkit.errors import BrokerUnavailable, ConfigError, TopologyConflict
from rmqkit.settings import Settings
from rmqkit.topology.desired import DesiredState, Via
from rmqkit.topology.expand import expand_all
from rmqkit.topology.model import Topology
from rmqkit.topology.permissions import (
    LivePermissions,
    apply_permissions,
    desired_permissions,
    user_names,
)
from rmqkit.topology.plan import PLUGINS, Change, LiveState, Plan, compute_plan, read_live_state


@dataclass(frozen=True)
class DeclareResult:
    """What ``declare_topology`` did (or, with ``dry_run``, would do)."""

    plan: Plan
    applied: list[Change]
    dry_run: bool
    verified: bool  # False when no management API could confirm the existing objects

    @property
    def changed(self) -> bool:
        return bool(self.applied)


Topologies = Topology | Sequence[Topology]


def _several(topology: Topologies) -> list[Topology]:
    return [topology] if isinstance(topology, Topology) else list(topology)


def source_of(topology: Topologies) -> str:
    """The file names as a plan shows them: several files space-separated, as typed."""
    return " ".join(t.source for t in _several(topology))


def _desired(topology: Topologies, via: Via, version: tuple[int, int, int]) -> DesiredState:
    files = _several(topology)
    desired = expand_all(files, via=via, broker_version=version)
    return replace(desired, permissions=desired_permissions(files))


async def _plan_with(
    api: ManagementClient,
    topology: Topologies,
    via: Via,
    version: tuple[int, int, int],
    settings: Settings,
) -> Plan:
    desired = _desired(topology, via, version)
    asking = management_user(settings) if desired.permissions else None
    live = await read_live_state(api, permissions_of=asking)
    return compute_plan(desired, live, source=source_of(topology), vhost=api.vhost)


async def plan_topology(settings: Settings, topology: Topologies, *, via: Via = "policy") -> Plan:
    """Compare ``topology`` with the broker the settings point at (management API).

    Several topologies (files meant for one vhost) are planned as their union: every file's
    objects are "ours", so none is reported as another's orphan."""
    async with connection(settings, name="rmqkit plan") as conn:
        version = server_version(conn)
    async with management(settings) as api:
        return await _plan_with(api, topology, via, version, settings)


def conflict_error(plan: Plan) -> TopologyConflict:
    """One line for the first conflict, with the fix and a pointer to the rest."""
    first = plan.conflicts[0]
    more = len(plan.conflicts) - 1
    tail = f" ({more} more conflict(s): run `rmqkit plan {plan.source}`)" if more else ""
    return TopologyConflict(
        f"{plan.source}: {first.kind} {first.name!r}: {first.detail} — fix: {first.fix}; "
        f"nothing was changed{tail}"
    )


async def declare_topology(
    settings: Settings,
    topology: Topologies,
    *,
    via: Via = "policy",
    dry_run: bool = False,
    create_vhost: bool = False,
) -> DeclareResult:
    """Make the broker match ``topology`` (one or several files, as their union); stop before
    changing anything on a conflict.

    Order matters: exchanges, then policies (so a queue never exists without its dead-letter
    wiring), then queues, then bindings, then the users' permissions (last: a file that
    narrows the declaring user's own cannot stop its declaration halfway). Existing objects
    are not redeclared. ``create_vhost``: a missing vhost is created first (administrator
    tag), the declaring user given full permissions on it.
    """
    created: list[Change] = []
    if create_vhost:
        async with management(settings) as api:
            if not await vhost_exists(api):
                # Planned before the vhost is made: a conflict (a user the file names that
                # does not exist) leaves the broker as it was, the vhost not created either.
                fresh = await _fresh_vhost_plan(api, topology, via, management_user(settings))
                if fresh.conflicts:
                    raise conflict_error(fresh)
                if dry_run:
                    return DeclareResult(fresh, fresh.pending, dry_run=True, verified=True)
                await make_vhost(api, management_user(settings))
                created.append(Change("vhost", api.vhost, "create", "--create-vhost"))
    async with connection(settings, name="rmqkit declare") as conn:
        version = server_version(conn)
        try:
            async with management(settings) as api:
                plan = await _plan_with(api, topology, via, version, settings)
                if plan.conflicts:
                    raise conflict_error(plan)
                if dry_run:
                    return DeclareResult(plan, plan.pending, dry_run=True, verified=True)
                await _apply(conn, api, plan)
                plan = replace(plan, changes=[*created, *plan.changes])
                return DeclareResult(plan, plan.pending, dry_run=False, verified=True)
        except BrokerUnavailable:
            if via == "policy":
                raise
            if _has_permissions(topology):
                raise ConfigError(
                    f"{source_of(topology)}: [vhost.permissions] are set over the management "
                    "API, which does not answer — enable it (rabbitmq-plugins enable "
                    "rabbitmq_management) or set RMQKIT_MANAGEMENT_URL"
                ) from None
        # --via arguments without a management API: the broker itself checks equivalence
        # (406 on a mismatch), so redeclaring everything is safe and idempotent.
        plan = await _blind_plan(conn, topology, version)
        if not dry_run:
            await _apply(conn, None, plan)
        return DeclareResult(plan, plan.pending, dry_run=dry_run, verified=False)


def _has_permissions(topology: Topologies) -> bool:
    return any(t.model.vhost.permissions for t in _several(topology))


async def _fresh_vhost_plan(
    api: ManagementClient, topology: Topologies, via: Via, asking: str
) -> Plan:
    """The plan for a vhost that does not exist yet: everything would be created, the vhost
    first; the users the file names are looked up all the same."""
    overview = await api.overview()
    version = parse_version(str(overview.get("rabbitmq_version") or "0.0.0"))
    types = frozenset(str(t.get("name")) for t in overview.get("exchange_types") or [])
    desired = _desired(topology, via, version)
    permissions = None
    if desired.permissions:
        permissions = LivePermissions(asking, {}, await user_names(api))
    live = LiveState(
        queues={},
        exchanges={},
        bindings=[],
        policies={},
        version=version,
        exchange_types=types or None,
        permissions=permissions,
    )
    plan = compute_plan(desired, live, source=source_of(topology), vhost=api.vhost)
    vhost = Change("vhost", api.vhost, "create", "does not exist yet: --create-vhost creates it")
    return replace(plan, changes=[vhost, *plan.changes])


async def _blind_plan(
    conn: Connection, topology: Topologies, version: tuple[int, int, int]
) -> Plan:
    """A plan from passive declares only (existence, not settings)."""
    desired = expand_all(_several(topology), via="arguments", broker_version=version)
    probes = Session.of(conn)  # passive declares on the session's probe channel
    changes: list[Change] = []
    for exchange in desired.exchanges:
        exists = await probes.exchange_exists(exchange.name)
        changes.append(
            Change(
                "exchange",
                exchange.name,
                "change" if exists else "create",
                "redeclared (not verified: no management API)" if exists else "",
            )
        )
    for queue in desired.all_queues():
        exists = await probes.queue_exists(queue.name)
        changes.append(
            Change(
                "queue",
                queue.name,
                "change" if exists else "create",
                "redeclared (not verified: no management API)" if exists else "",
            )
        )
    for binding in desired.bindings:
        changes.append(Change("binding", binding.label, "change", "bound (idempotent)"))
    return Plan(source=source_of(topology), vhost="", desired=desired, changes=changes)


async def _apply(conn: Connection, api: ManagementClient | None, plan: Plan) -> None:
    desired: DesiredState = plan.desired
    todo = {(c.kind, c.name) for c in plan.pending}
    broker = Session.of(conn)  # the declarations go through rmqkit.broker (issue 11)
    # Exchanges of a plugin's type first: without the plugin the broker closes the connection
    # (3.10: 503 COMMAND_INVALID; 4.3: 406 PRECONDITION_FAILED, mapped to TopologyConflict;
    # both say "unknown exchange type") before anything else of the file was declared.
    standard = ("direct", "topic", "fanout", "headers")
    exchanges = sorted(
        (e for e in desired.exchanges if ("exchange", e.name) in todo),
        key=lambda e: e.type in standard,
    )
    try:
        await broker.declare(
            [
                {
                    "exchange": exchange.name,
                    "exchange_type": exchange.type,
                    "durable": exchange.durable,
                    "auto_delete": exchange.auto_delete,
                    "internal": exchange.internal,
                    "arguments": exchange.arguments,
                }
                for exchange in exchanges
            ],
            [],
            [],
        )
    except (BrokerUnavailable, TopologyConflict) as exc:
        missing = next(
            (e for e in exchanges if f"unknown exchange type '{e.type}'" in str(exc)), None
        )
        if missing is None:
            raise
        plugin = PLUGINS.get(missing.type)
        enable = f": rabbitmq-plugins enable {plugin}" if plugin else ""
        raise TopologyConflict(
            f"{plan.source}: exchange {missing.name!r}: exchange type {missing.type} is not "
            f"available on this broker{enable}"
        ) from None
    if api is not None:  # after the exchanges, before the queues: no queue without its wiring
        for policy in desired.policies:
            if ("policy", policy.name) in todo:
                await api.put_policy(
                    policy.name,
                    policy.pattern,
                    policy.definition,
                    policy.priority,
                    policy.apply_to,
                )
    bindings: list[dict[str, Any]] = []
    for binding in desired.bindings:
        if ("binding", binding.label) in todo:
            ends = (
                {"queue": binding.destination, "exchange": binding.source}
                if binding.destination_type == "queue"
                else {"destination": binding.destination, "source": binding.source}
            )
            bindings.append(
                {
                    "label": binding.label,
                    **ends,
                    "routing_key": binding.routing_key,
                    "arguments": binding.arguments,
                }
            )
    await broker.declare(
        [],
        [
            {"queue": queue.name, "durable": True, "arguments": queue.arguments(desired.via)}
            for queue in desired.all_queues()
            if ("queue", queue.name) in todo
        ],
        bindings,
    )
    if api is not None:
        await apply_permissions(
            api, desired.permissions, {c.name for c in plan.pending if c.kind == "permission"}
        )


__all__ = ["DeclareResult", "LiveState", "declare_topology", "plan_topology"]

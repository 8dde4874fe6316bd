"""Plan: the topology file against the live broker, object by object.

Pure functions over the management API's view (``LiveState``), so every conflict rule is
unit-testable; ``read_live_state`` is the only I/O here.
"""

from __future__ import annotations

from typing import Any

from rmqkit.broker.amqp import parse_version
from rmqkit.broker.management import ManagementClient
from rmqkit.broker.policies import (
    Policy,
    applying_policy,
    as_policy,
    resolve,
)
from rmqkit.topology.desired import (
    MANAGED_KEYS,
    BindingSpec,
    DesiredState,
    ExchangeSpec,
    FixedQueueSpec,
    PolicySpec,
    QueueSpec,
    policy_name,
)
from rmqkit.topology.live import (
    DEFAULT_VERSION,
    Action,
    Change,
    Kind,
    LiveState,
    Plan,
    managed_settings,
    queue_settings,
)
from rmqkit.topology.orphans import find_orphans
from rmqkit.topology.partitions import CONSISTENT_HASH, MODULUS_HASH, keep_live_hashing
from rmqkit.topology.permissions import permission_changes, read_permissions
from rmqkit.topology.retry_engine import SINCE
from rmqkit.topology.retry_engine import TYPE_KEY as RETRY_TYPE_KEY

# Exchange types that come with a plugin: a missing one is named in the conflict's fix.
PLUGINS = {"x-consistent-hash": "rabbitmq_consistent_hash_exchange"}


def _fmt(value: Any) -> str:
    return repr(value) if isinstance(value, str) else str(value)


def _exchange_change(
    spec: ExchangeSpec, live: dict[str, Any] | None, types: frozenset[str] | None = None
) -> Change:
    if live is None and types is not None and spec.type not in types:
        plugin = PLUGINS.get(spec.type)
        fix = f"rabbitmq-plugins enable {plugin}" if plugin else "use a type the broker offers"
        if spec.type == CONSISTENT_HASH and MODULUS_HASH in types:
            fix += (
                ', or partition by the routing key (partition_by = "routing_key": '
                f"{MODULUS_HASH}, built in)"
            )
        return Change(
            "exchange",
            spec.name,
            "conflict",
            f"exchange type {spec.type} is not available on this broker"
            + (f" (plugin {plugin} is not enabled)" if plugin else ""),
            fix,
        )
    if live is None:
        return Change("exchange", spec.name, "create", f"type {spec.type}")
    diffs = []
    for attr, want in (
        ("type", spec.type),
        ("durable", spec.durable),
        ("auto_delete", spec.auto_delete),
        ("internal", spec.internal),
        ("arguments", spec.arguments),
    ):
        have = live.get(attr, {} if attr == "arguments" else None)
        if have != want:
            diffs.append(f"{attr} is {_fmt(have)} on the broker, {_fmt(want)} in the file")
    if not diffs:
        return Change("exchange", spec.name, "in-sync")
    return Change(
        "exchange",
        spec.name,
        "conflict",
        "; ".join(diffs) + " (redeclaring fails with 406 PRECONDITION_FAILED)",
        "exchange settings are fixed at creation: change the file to match, or delete the "
        "exchange (its bindings go with it) and declare again",
    )


def _queue_changes(
    spec: QueueSpec, desired: DesiredState, live: LiveState, exchanges: set[str]
) -> list[Change]:
    changes: list[Change] = []
    found = live.queues.get(spec.name)
    ours = policy_name(spec.name)
    # A queue to be created will be a quorum queue; an existing one has the type it has.
    qtype = "quorum" if found is None else str(found.get("type") or "classic")
    others = [p for p in live.policies.values() if p.get("name") != ours]
    # Each file's policies keep that file's priority (several files are planned together).
    priority = next(
        (p.priority for p in desired.policies if p.name == ours), desired.policy_priority
    )
    top = applying_policy(others, spec.name, qtype)
    top_other = next((p for p in others if as_policy(p) == top), None) if top else None
    operator = applying_policy(live.operator_policies, spec.name, qtype)

    if found is None:
        action: Action = "create"
        detail = "quorum queue"
        live_args: dict[str, Any] = {}
    else:
        action, detail = "in-sync", ""
        live_args = dict(found.get("arguments") or {})
        if qtype != "quorum":
            return [
                Change(
                    "queue",
                    spec.name,
                    "conflict",
                    f"exists as a {qtype} queue; rmqkit needs a quorum queue and a queue's type "
                    "cannot change in place",
                    "move its messages elsewhere (shovel), delete it, then declare again — or "
                    "rename the queue in the file",
                )
            ]
        sac = _sac_conflict(spec, live_args)
        if sac is not None:
            return [sac]
        if desired.via == "arguments":
            want_args = spec.arguments("arguments")
            keys = sorted(set(want_args) | {k for k in live_args if k[2:] in MANAGED_KEYS})
            diffs = [
                f"{k} is {_fmt(live_args.get(k))} on the broker, "
                f"{_fmt(want_args.get(k))} in the file"
                for k in keys
                if live_args.get(k) != want_args.get(k)
            ]
            if diffs:
                return [
                    Change(
                        "queue",
                        spec.name,
                        "conflict",
                        "; ".join(diffs) + " (redeclaring fails with 406 PRECONDITION_FAILED "
                        "inequivalent arg)",
                        "x-arguments are fixed at creation: declare with --via policy (the "
                        "default) after removing them, i.e. drain and delete the queue first; "
                        "or make the file match the broker",
                    )
                ]
    # What would be in effect after declare: our policy applies unless another outranks it.
    if desired.via == "policy":
        if top_other is not None and int(top_other.get("priority", 0)) >= priority:
            return [
                *changes,
                Change(
                    "queue",
                    spec.name,
                    "conflict",
                    f"policy {top_other.get('name')!r} (priority {top_other.get('priority')}) "
                    f"matches this queue and outranks rmqkit's (priority "
                    f"{priority}); only one policy applies, so ours would be "
                    "silently ignored",
                    f"set policy_priority in the topology file above {top_other.get('priority')}, "
                    f"or narrow the pattern of policy {top_other.get('name')!r} to exclude this "
                    "queue",
                ),
            ]
        after = resolve(
            qtype, live_args, Policy(ours, definition=spec.settings), operator, live.version
        )
    else:
        wanted = {"x-" + key: value for key, value in spec.settings.items()}
        after = resolve(qtype, wanted, top, operator, live.version)
    effective = managed_settings(after)
    wrong = {
        key: (effective.get(key), spec.settings.get(key))
        for key in MANAGED_KEYS
        if effective.get(key) != spec.settings.get(key)
    }
    if wrong:
        parts = []
        for key, (have, want) in wrong.items():
            label = after.sources.get(key, "")
            source = "an x-argument on the queue"
            if label.startswith("operator policy"):
                source = "an operator policy"
            elif label.startswith("policy") and desired.via == "arguments" and top is not None:
                source = f"policy {top.name!r}"
            parts.append(f"{key} would be {_fmt(have)} (set by {source}), not {_fmt(want)}")
        dlx = effective.get("dead-letter-exchange")
        if dlx and dlx not in exchanges:
            parts.append(f"dead-letter-exchange {dlx!r} does not exist: dead letters are dropped")
        return [
            Change(
                "queue",
                spec.name,
                "conflict",
                "; ".join(parts),
                "x-arguments beat policies for dead-letter keys and the lower number wins for "
                "limits: drain and delete the queue so it can be declared without them, or "
                "remove the competing policy",
            )
        ]
    changes.append(Change("queue", spec.name, action, detail))
    return changes


def _sac_conflict(spec: QueueSpec, live_args: dict[str, Any]) -> Change | None:
    """x-single-active-consumer is set at declaration only: a queue that has it otherwise than
    the file says cannot be fixed by declare."""
    have = bool(live_args.get("x-single-active-consumer", False))
    if have == spec.single_active_consumer:
        return None
    return Change(
        "queue",
        spec.name,
        "conflict",
        f"x-single-active-consumer is {have} on the broker, {spec.single_active_consumer} in "
        "the file; it is fixed when a queue is declared",
        "move its messages elsewhere (shovel) and delete the queue so declare can create it "
        "again, or make the file match the broker",
    )


def _fixed_queue_change(spec: FixedQueueSpec, live: dict[str, Any] | None) -> Change:
    """A delay ladder rung: its x-arguments must be exactly the ladder's."""
    if live is None:
        return Change("queue", spec.name, "create", "delay ladder rung")
    have = dict(live.get("arguments") or {})
    want = spec.arguments("arguments")
    diffs = [
        f"{k} is {_fmt(have.get(k))} on the broker, {_fmt(want.get(k))} for the ladder"
        for k in sorted(set(have) | set(want))
        if have.get(k) != want.get(k)
    ]
    if not diffs:
        return Change("queue", spec.name, "in-sync")
    return Change(
        "queue",
        spec.name,
        "conflict",
        "; ".join(diffs) + " (redeclaring fails with 406 PRECONDITION_FAILED)",
        "a rung's x-arguments are fixed: wait until it is empty, delete it and declare again",
    )


def _policy_change(spec: PolicySpec, live: dict[str, Any] | None) -> Change:
    if live is None:
        return Change("policy", spec.name, "create", _fmt_def(spec.definition))
    diffs = []
    if live.get("definition") != spec.definition:
        diffs.append(f"{_fmt_def(live.get('definition') or {})} → {_fmt_def(spec.definition)}")
    if live.get("pattern") != spec.pattern:
        diffs.append(f"pattern {live.get('pattern')!r} → {spec.pattern!r}")
    if int(live.get("priority", 0)) != spec.priority:
        diffs.append(f"priority {live.get('priority')} → {spec.priority}")
    if live.get("apply-to") != spec.apply_to:
        diffs.append(f"apply-to {live.get('apply-to')!r} → {spec.apply_to!r}")
    if diffs:
        return Change("policy", spec.name, "change", "; ".join(diffs))
    return Change("policy", spec.name, "in-sync")


def _fmt_def(definition: dict[str, Any]) -> str:
    return ", ".join(f"{k}={_fmt(v)}" for k, v in sorted(definition.items()))


def _binding_key(
    source: str, dest: str, dtype: str, key: str, args: dict[str, Any]
) -> tuple[Any, ...]:
    return (source, dest, dtype, key, tuple(sorted((k, repr(v)) for k, v in args.items())))


def compute_plan(desired: DesiredState, live: LiveState, *, source: str, vhost: str) -> Plan:
    """Compare ``desired`` with ``live``; pure, so it can be tested without a broker."""
    changes: list[Change] = []
    desired = keep_live_hashing(desired, live.exchanges)
    exchange_names = set(live.exchanges) | {e.name for e in desired.exchanges}
    for exchange in desired.exchanges:
        changes.append(
            _exchange_change(exchange, live.exchanges.get(exchange.name), live.exchange_types)
        )
    for policy in desired.policies:
        changes.append(_policy_change(policy, live.policies.get(policy.name)))
    for queue in desired.queues:
        changes.extend(_queue_changes(queue, desired, live, exchange_names))
        if queue.role == "work" and RETRY_TYPE_KEY in queue.settings and live.version < SINCE:
            shown = ".".join(map(str, live.version))
            changes.append(
                Change(
                    "queue",
                    queue.name,
                    "conflict",
                    f'retry_engine = "broker" needs RabbitMQ 4.3 (delayed retry on quorum '
                    f"queues); this broker is {shown}, which refuses its policy keys and "
                    "ignores its x-arguments (every retry would come back at once)",
                    'retry_engine = "queues" (wait queues, every version), or upgrade to 4.3',
                )
            )
    for fixed in desired.fixed_queues:
        changes.append(_fixed_queue_change(fixed, live.queues.get(fixed.name)))
    have_bindings = {
        _binding_key(
            b.get("source", ""),
            b.get("destination", ""),
            b.get("destination_type", "queue"),
            b.get("routing_key", ""),
            b.get("arguments") or {},
        )
        for b in live.bindings
    }
    for binding in desired.bindings:
        key = _binding_key(
            binding.source,
            binding.destination,
            binding.destination_type,
            binding.routing_key,
            binding.arguments,
        )
        action: Action = "in-sync" if key in have_bindings else "create"
        changes.append(Change("binding", binding.label, action))
    changes.extend(permission_changes(desired.permissions, live.permissions))
    changes.extend(find_orphans(desired, live, vhost))
    return Plan(source=source, vhost=vhost, desired=desired, changes=changes)


async def read_live_state(api: ManagementClient, *, permissions_of: str | None = None) -> LiveState:
    """Read queues, exchanges, bindings and policies of the client's vhost; with
    ``permissions_of`` (the user asking), its permissions too."""
    queues = await api.queues()
    exchanges = await api.exchanges()
    bindings = await api.bindings()
    policies = await api.policies()
    operator = await api.operator_policies()
    overview = await api.overview()
    return LiveState(
        queues={q["name"]: q for q in queues},
        exchanges={e["name"]: e for e in exchanges if e.get("name")},
        bindings=[b for b in bindings if b.get("source")],
        policies={p["name"]: p for p in policies},
        operator_policies=operator,
        version=parse_version(str(overview.get("rabbitmq_version") or "0.0.0")),
        exchange_types=frozenset(
            str(t.get("name")) for t in overview.get("exchange_types") or [] if t.get("name")
        )
        or None,
        permissions=(
            await read_permissions(api, permissions_of) if permissions_of is not None else None
        ),
    )


__all__ = [
    "DEFAULT_VERSION",
    "PLUGINS",
    "Action",
    "BindingSpec",
    "Change",
    "Kind",
    "LiveState",
    "Plan",
    "compute_plan",
    "queue_settings",
    "read_live_state",
]

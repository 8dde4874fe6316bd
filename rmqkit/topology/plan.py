"""Plan: the topology file against the live broker, object by object.

Pure functions over the management API's view (``LiveState``), so every conflict rule is
unit-testable; ``read_live_state`` is the only I/O here.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass, field
from typing import Any, Literal

from rmqkit.broker.amqp import parse_version
from rmqkit.broker.management import ManagementClient
from rmqkit.broker.policies import (
    Effective,
    Policy,
    Version,
    applying_policy,
    as_policy,
    resolve,
    resolve_queue,
)
from rmqkit.topology.expand import (
    MANAGED_KEYS,
    POLICY_PREFIX,
    BindingSpec,
    DesiredState,
    ExchangeSpec,
    FixedQueueSpec,
    PolicySpec,
    QueueSpec,
    policy_name,
)
from rmqkit.topology.flow import PARTITION_EXCHANGE_SUFFIX

Action = Literal["create", "change", "in-sync", "conflict", "orphan"]
Kind = Literal["exchange", "queue", "policy", "binding"]
# Exchange types that come with a plugin: a missing one is named in the conflict's fix.
PLUGINS = {"x-consistent-hash": "rabbitmq_consistent_hash_exchange"}
# Without the broker's version (a LiveState built by hand), plan assumes expand's default.
DEFAULT_VERSION: Version = (3, 10, 0)


@dataclass(frozen=True)
class LiveState:
    """What the broker holds in one vhost, as the management API reports it."""

    queues: dict[str, dict[str, Any]]
    exchanges: dict[str, dict[str, Any]]
    bindings: list[dict[str, Any]]
    policies: dict[str, dict[str, Any]]
    operator_policies: list[dict[str, Any]] = field(default_factory=list)
    # The broker's version (``/api/overview``): the delivery-limit rules differ on 4.x.
    version: Version = DEFAULT_VERSION
    # The exchange types the broker offers (``/api/overview``); None: not known (not checked).
    exchange_types: frozenset[str] | None = None


@dataclass(frozen=True)
class Change:
    """One object's verdict: what would be done to it, or why it cannot be."""

    kind: Kind
    name: str
    action: Action
    detail: str = ""
    fix: str = ""

    def as_dict(self) -> dict[str, str]:
        return {
            "kind": self.kind,
            "name": self.name,
            "action": self.action,
            "detail": self.detail,
            "fix": self.fix,
        }


@dataclass(frozen=True)
class Plan:
    """The verdicts for every object of a topology, plus objects rmqkit left behind."""

    source: str
    vhost: str
    desired: DesiredState
    changes: list[Change]

    @property
    def conflicts(self) -> list[Change]:
        return [c for c in self.changes if c.action == "conflict"]

    @property
    def pending(self) -> list[Change]:
        return [c for c in self.changes if c.action in ("create", "change")]

    @property
    def in_sync(self) -> list[Change]:
        return [c for c in self.changes if c.action == "in-sync"]

    def summary(self) -> dict[str, int]:
        counts = {"create": 0, "change": 0, "in-sync": 0, "conflict": 0, "orphan": 0}
        for change in self.changes:
            counts[change.action] += 1
        return counts


def _managed(found: Effective) -> dict[str, Any]:
    return {key: value for key, value in found.settings.items() if key in MANAGED_KEYS}


def queue_settings(live: LiveState, name: str) -> dict[str, Any]:
    """The managed settings in effect now on existing queue ``name``, as plan sees them (the
    same resolver as doctor's ``effective_queue``); {} for a queue that does not exist."""
    found = live.queues.get(name)
    if found is None:
        return {}
    policies = list(live.policies.values())
    return _managed(resolve_queue(found, policies, live.operator_policies, live.version))


def _fmt(value: Any) -> str:
    return repr(value) if isinstance(value, str) else str(value)


def _exchange_change(
    spec: ExchangeSpec, live: dict[str, Any] | None, types: frozenset[str] | None = None
) -> Change:
    if live is None and types is not None and spec.type not in types:
        plugin = PLUGINS.get(spec.type)
        return Change(
            "exchange",
            spec.name,
            "conflict",
            f"exchange type {spec.type} is not available on this broker"
            + (f" (plugin {plugin} is not enabled)" if plugin else ""),
            f"rabbitmq-plugins enable {plugin}" if plugin else "use a type the broker offers",
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
    effective = _managed(after)
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
    exchange_names = set(live.exchanges) | {e.name for e in desired.exchanges}
    for exchange in desired.exchanges:
        changes.append(
            _exchange_change(exchange, live.exchanges.get(exchange.name), live.exchange_types)
        )
    for policy in desired.policies:
        changes.append(_policy_change(policy, live.policies.get(policy.name)))
    for queue in desired.queues:
        changes.extend(_queue_changes(queue, desired, live, exchange_names))
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
    changes.extend(_orphans(desired, live, vhost))
    return Plan(source=source, vhost=vhost, desired=desired, changes=changes)


def _family_owner(name: str, roots: set[str]) -> str | None:
    """The file's work queue whose derived queue ``name`` is, by its name alone: a wait queue
    (``W.wait.…``), a lane (``W.lane.L``, ``W.lane.L.wait.…``) or a partition (``W.pN``,
    ``W.pN.wait.…``) of a work queue ``W`` of the file (``roots``), if any."""
    for root in sorted(roots, key=len, reverse=True):
        rest = name[len(root) :] if name.startswith(root + ".") else None
        if rest is None:
            continue
        if rest.startswith((".wait.", ".lane.")) or re.fullmatch(r"\.p\d+(\.wait\..+)?", rest):
            return root
    return None


def _family_member(target: str, root: str) -> bool:
    """``target`` is ``root`` itself or one of its lanes or partitions (a queue that a wait
    queue of ``root``'s family returns messages to)."""
    return (
        target == root
        or re.fullmatch(re.escape(root) + r"\.(lane\.[^.]+|p\d+)", target) is not None
    )


def _dead_letters_home(settings: dict[str, Any], root: str, parkings: set[str]) -> bool:
    """Whether a queue that dead-letters with ``settings`` (its managed settings, or a policy
    definition) belongs to ``root``'s family: a wait queue returns to a member, a lane or
    partition parks in ``root``'s parking queue. Without dead-letter settings the name decides.
    A work queue of another file named like a derived queue (``orders.wait.list`` beside
    ``orders``) dead-letters into its own parking queue: not ours."""
    target = settings.get("dead-letter-routing-key")
    if not isinstance(target, str):
        return True
    return _family_member(target, root) or target in parkings


def _orphans(desired: DesiredState, live: LiveState, vhost: str) -> list[Change]:
    """rmqkit-made objects the file no longer names: reported, never deleted (they may hold
    messages, and a wait queue without its policy would keep them forever). Their fixes name
    the vhost (``-p``) and quote for the shell, so they can be pasted as they are.

    Ownership follows the names rmqkit derives: a file owns its work queues and the queues
    derived from them — wait queues (``W.wait.…``), lanes (``W.lane.L``) and partitions
    (``W.pN``) with their wait queues, the partition exchange ``W.partition`` — and the
    policies ``rmqkit.<those>``. An object derived from another work queue belongs to whichever
    topology declares that work queue (another file in the same vhost), so it is never this
    file's orphan; nor is a queue whose dead-lettering leads out of ``W``'s family (another
    file's work queue that merely starts with ``W.wait.``). The name is the marker: it needs
    nothing added to a queue (x-arguments cannot change on a live queue) and works with
    ``--via arguments``.
    """
    where = f"-p {shlex.quote(vhost or '/')}"
    wanted_queues = {q.name for q in desired.queues} | {q.name for q in desired.fixed_queues}
    wanted_policies = {p.name for p in desired.policies}
    roots = {w.name for w in desired.work_queues}
    parkings: dict[str, set[str]] = {}
    for w in desired.work_queues:
        parkings.setdefault(w.name, set()).add(w.parking)
    out: list[Change] = []
    for name, queue in sorted(live.queues.items()):
        owner = _family_owner(name, roots)
        if not owner or name in wanted_queues:
            continue
        if not _dead_letters_home(queue_settings(live, name), owner, parkings[owner]):
            continue
        out.append(
            Change(
                "queue",
                name,
                "orphan",
                f"no longer in the file; left in place with {queue.get('messages', 0)} "
                f"message(s), which still return to {owner}",
                f"delete it once empty: rabbitmqctl delete_queue {where} {shlex.quote(name)}",
            )
        )
    for work in desired.work_queues:
        if work.partitions and work.name in live.queues:
            out.append(
                Change(
                    "queue",
                    work.name,
                    "orphan",
                    f"{work.name} is partitioned now ({work.partition_exchange}); this queue "
                    f"holds {live.queues[work.name].get('messages', 0)} message(s) and still gets "
                    "new ones through its old bindings",
                    "unbind it from its exchanges, let a consumer drain it, then: rabbitmqctl "
                    f"delete_queue {where} {shlex.quote(work.name)}",
                )
            )
    wanted_exchanges = {e.name for e in desired.exchanges}
    for name, exchange in sorted(live.exchanges.items()):
        owner = name.removesuffix(PARTITION_EXCHANGE_SUFFIX)
        if (
            owner in roots
            and name != owner
            and name not in wanted_exchanges
            and exchange.get("type") == "x-consistent-hash"
        ):
            out.append(
                Change(
                    "exchange",
                    name,
                    "orphan",
                    f"no longer in the file ({owner} is not partitioned now); messages "
                    "published to it still go to the partitions it is bound to",
                    "delete it once nothing publishes to it: rabbitmqadmin "
                    f"--vhost={shlex.quote(vhost or '/')} delete exchange "
                    f"name={shlex.quote(name)}",
                )
            )
    if desired.via == "policy":
        for name in sorted(live.policies):
            governed = name.removeprefix(POLICY_PREFIX)
            owner = _family_owner(governed, roots)
            if not name.startswith(POLICY_PREFIX) or name in wanted_policies or owner is None:
                continue
            definition = dict(live.policies[name].get("definition") or {})
            if not _dead_letters_home(definition, owner, parkings[owner]):
                continue
            out.append(
                Change(
                    "policy",
                    name,
                    "orphan",
                    "no longer in the file; left in place so the queue it governs keeps "
                    "its TTL and dead-letter wiring",
                    f"delete it after its queue: rabbitmqctl clear_policy {where} "
                    f"{shlex.quote(name)}",
                )
            )
    return out


async def read_live_state(api: ManagementClient) -> LiveState:
    """Read queues, exchanges, bindings and policies of the client's vhost."""
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
    )


__all__ = [
    "BindingSpec",
    "Change",
    "LiveState",
    "Plan",
    "compute_plan",
    "queue_settings",
    "read_live_state",
]

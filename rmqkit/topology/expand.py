"""Expansion of a topology file into the concrete broker objects it stands for."""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from rmqkit.durations import format_duration_ms
from rmqkit.errors import TopologyFileError
from rmqkit.topology.model import BUILTIN_EXCHANGE_PREFIX, Topology, format_retention_ms

Via = Literal["policy", "arguments"]
QueueRole = Literal["work", "wait", "parking"]
POLICY_PREFIX = "rmqkit."

# The queue settings rmqkit manages, in policy-key form (an x-argument is "x-" + key).
MANAGED_KEYS = (
    "message-ttl",
    "dead-letter-exchange",
    "dead-letter-routing-key",
    "dead-letter-strategy",
    "overflow",
    "delivery-limit",
    "max-length",
    "max-length-bytes",
    "expires",
)


@dataclass(frozen=True)
class ExchangeSpec:
    """An exchange as the broker should hold it."""

    name: str
    type: str
    durable: bool = True
    auto_delete: bool = False
    internal: bool = False
    arguments: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class QueueSpec:
    """A quorum queue and the mutable settings rmqkit wants in effect on it."""

    name: str
    role: QueueRole
    owner: str  # the work queue this queue serves
    settings: dict[str, Any]
    delay_ms: int | None = None  # wait queues: the TTL of this jitter slot
    tier_index: int | None = None

    def arguments(self, via: Via) -> dict[str, Any]:
        """The x-arguments to declare the queue with: settings go in them only ``via`` arguments."""
        args: dict[str, Any] = {"x-queue-type": "quorum"}
        if via == "arguments":
            args.update({f"x-{key}": value for key, value in self.settings.items()})
        return args


@dataclass(frozen=True)
class BindingSpec:
    """A binding from an exchange to a queue or exchange."""

    source: str
    destination: str
    destination_type: Literal["queue", "exchange"]
    routing_key: str
    arguments: dict[str, Any] = field(default_factory=dict)

    @property
    def label(self) -> str:
        return f"{self.source} → {self.destination} ({self.routing_key or '<empty key>'})"


@dataclass(frozen=True)
class PolicySpec:
    """A policy carrying one queue's mutable settings."""

    name: str
    queue: str
    definition: dict[str, Any]
    priority: int
    apply_to: str = "queues"

    @property
    def pattern(self) -> str:
        return "^" + re.escape(self.queue) + "$"


@dataclass(frozen=True)
class WorkQueueSummary:
    """What happens to a work queue's messages, as ``plan`` states it: the retry ladder, the
    attempts, the retention and where they park."""

    name: str
    retry_delays_ms: tuple[int, ...]
    default_retries: bool  # the file does not say retry_delays: the default ladder applies
    max_attempts: int
    retention_ms: int | None
    parking: str

    def text(self) -> str:
        """``orders.work: retries 1s, 5s (max_attempts 3); retention 4d; parks in …``."""
        if self.retry_delays_ms:
            ladder = ", ".join(format_duration_ms(d) for d in self.retry_delays_ms)
            retries = f"retries {ladder}" + (
                " (the default ladder)" if self.default_retries else ""
            )
            retries += f", max_attempts {self.max_attempts}"
        else:
            retries = "no retries (retry_delays = []): a transient failure parks at once"
        retention = (
            f"retention {format_retention_ms(self.retention_ms)}, then parked as expired"
            if self.retention_ms is not None
            else "no retention limit"
        )
        return f"{self.name}: {retries}; {retention}; parks in {self.parking}"

    def as_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "retry_delays_ms": list(self.retry_delays_ms),
            "default_retries": self.default_retries,
            "max_attempts": self.max_attempts,
            "retention_ms": self.retention_ms,
            "parking": self.parking,
        }


@dataclass(frozen=True)
class DesiredState:
    """Everything a topology file asks the broker to hold, for one declaration mode."""

    exchanges: list[ExchangeSpec]
    queues: list[QueueSpec]
    bindings: list[BindingSpec]
    policies: list[PolicySpec]
    via: Via
    policy_priority: int
    work_queues: list[WorkQueueSummary] = field(default_factory=list)


def policy_name(queue: str) -> str:
    """The name of the policy rmqkit keeps for ``queue``."""
    return POLICY_PREFIX + queue


def jitter_slot_delays(delay_ms: int, jitter: float, slots: int) -> list[int]:
    """TTLs of a tier's wait queues, spread evenly over ``[delay*(1-jitter), delay]``.

    The last one is the full delay, so no retry waits longer than its tier.
    """
    if slots <= 1 or jitter == 0:
        return [delay_ms]
    low = delay_ms * (1.0 - jitter)
    step = (delay_ms - low) / (slots - 1)
    delays = [max(1, round(low + step * i)) for i in range(slots - 1)] + [delay_ms]
    return sorted(set(delays))


def wait_queue_names(topology: Topology, queue: str) -> list[list[tuple[str, int]]]:
    """Per tier, the (name, ttl_ms) of its jitter slot queues; the last slot is the full delay."""
    spec = topology.model.queues[queue]
    tiers: list[list[tuple[str, int]]] = []
    for delay in spec.retry_delays:
        main = topology.wait_name(queue, delay)
        slots = []
        for ttl in jitter_slot_delays(delay, spec.jitter, spec.jitter_slots):
            name = main if ttl == delay else f"{main}.slot-{format_duration_ms(ttl)}"
            slots.append((name, ttl))
        tiers.append(slots)
    return tiers


def expand(
    topology: Topology, *, via: Via = "policy", broker_version: tuple[int, int, int] = (3, 10, 0)
) -> DesiredState:
    """The concrete objects for ``topology`` on a broker of ``broker_version``.

    Version matters for parking queues: quorum queues get a default delivery limit of 20 from
    4.0, so parking sets ``delivery-limit: -1`` there; 3.x rejects -1 and has no default.
    """
    model = topology.model
    exchanges = [
        ExchangeSpec(
            name=name,
            type=ex.type,
            durable=ex.durable,
            auto_delete=ex.auto_delete,
            internal=ex.internal,
            arguments={
                **ex.arguments,
                **({"alternate-exchange": ex.alternate_exchange} if ex.alternate_exchange else {}),
            },
        )
        for name, ex in model.exchanges.items()
    ]
    queues: list[QueueSpec] = []
    bindings: list[BindingSpec] = []
    seen_parking: set[str] = set()
    for name, spec in model.queues.items():
        parking = topology.parking_name(name)
        work_settings: dict[str, Any] = {
            "dead-letter-exchange": "",
            "dead-letter-routing-key": parking,
            "dead-letter-strategy": "at-least-once",
            "overflow": "reject-publish",
            "delivery-limit": spec.delivery_limit,
        }
        if spec.max_length is not None:
            work_settings["max-length"] = spec.max_length
        if spec.max_length_bytes is not None:
            work_settings["max-length-bytes"] = spec.max_length_bytes
        if spec.retention is not None:
            # Queue-level TTL: it counts from when a message entered this queue, so a retry
            # coming back from a wait queue starts a new window, and dead-lettering strips any
            # per-message expiration (kept as x-death original-expiration): no retry is
            # expired for time it spent elsewhere. Expired → DLX above → parking, at-least-once.
            work_settings["message-ttl"] = spec.retention
        queues.append(QueueSpec(name, "work", name, work_settings))
        for tier_index, slots in enumerate(wait_queue_names(topology, name)):
            for wait_name, ttl in slots:
                wait_settings: dict[str, Any] = {
                    "message-ttl": ttl,
                    "dead-letter-exchange": "",
                    "dead-letter-routing-key": name,
                    "dead-letter-strategy": "at-least-once",
                    "overflow": "reject-publish",
                }
                queues.append(QueueSpec(wait_name, "wait", name, wait_settings, ttl, tier_index))
        if parking not in seen_parking:
            seen_parking.add(parking)
            # reject-publish: should anyone bound parking later, producers get a nack
            # instead of the oldest parked message being dropped (drop-head).
            parking_settings: dict[str, Any] = {"overflow": "reject-publish"}
            if broker_version >= (4, 0, 0):
                parking_settings["delivery-limit"] = -1
            queues.append(QueueSpec(parking, "parking", name, parking_settings))
        for bind in spec.bind:
            bindings.append(
                BindingSpec(bind.exchange, name, "queue", bind.routing_key, dict(bind.arguments))
            )
    summaries = [
        WorkQueueSummary(
            name=name,
            retry_delays_ms=tuple(spec.retry_delays),
            default_retries="retry_delays" not in spec.model_fields_set,
            max_attempts=spec.max_attempts,
            retention_ms=spec.retention,
            parking=topology.parking_name(name),
        )
        for name, spec in model.queues.items()
    ]
    for binding in model.bindings:
        bindings.append(
            BindingSpec(
                binding.source,
                binding.destination,
                binding.destination_type,
                binding.routing_key,
                dict(binding.arguments),
            )
        )
    policies = (
        [
            PolicySpec(policy_name(q.name), q.name, dict(q.settings), model.policy_priority)
            for q in queues
        ]
        if via == "policy"
        else []
    )
    return DesiredState(
        exchanges=[e for e in exchanges if not e.name.startswith(BUILTIN_EXCHANGE_PREFIX)],
        queues=queues,
        bindings=bindings,
        policies=policies,
        via=via,
        policy_priority=model.policy_priority,
        work_queues=summaries,
    )


def expand_all(
    topologies: Sequence[Topology],
    *,
    via: Via = "policy",
    broker_version: tuple[int, int, int] = (3, 10, 0),
) -> DesiredState:
    """The union of several topology files meant for one vhost (``plan a.toml b.toml``).

    An object two files both name must be the same in both (an exchange both bind to, a parking
    queue lanes share); otherwise the files disagree and neither can be applied: TopologyFileError
    naming both files. ``policy_priority`` is the first file's; each policy keeps its own file's.
    """
    states = [(t.source, expand(t, via=via, broker_version=broker_version)) for t in topologies]
    if not states:
        raise ValueError("expand_all needs at least one topology")
    if len(states) == 1:
        return states[0][1]
    exchanges: dict[str, tuple[str, ExchangeSpec]] = {}
    queues: dict[str, tuple[str, QueueSpec]] = {}
    policies: dict[str, tuple[str, PolicySpec]] = {}
    bindings: list[BindingSpec] = []
    for source, state in states:
        for exchange in state.exchanges:
            _keep_one(exchanges, exchange.name, source, exchange, exchange, "exchange")
        for queue in state.queues:
            # Lanes of two files may share one parking queue: its settings must agree, the
            # work queue it was first expanded for does not matter.
            same = (queue.role, queue.settings, queue.delay_ms)
            _keep_one(queues, queue.name, source, queue, same, "queue")
        for policy in state.policies:
            _keep_one(policies, policy.name, source, policy, policy.definition, "policy")
        bindings.extend(b for b in state.bindings if b not in bindings)
    first = states[0][1]
    return DesiredState(
        exchanges=[spec for _, spec in exchanges.values()],
        queues=[spec for _, spec in queues.values()],
        bindings=bindings,
        policies=[spec for _, spec in policies.values()],
        via=via,
        policy_priority=first.policy_priority,
        work_queues=[w for _, state in states for w in state.work_queues],
    )


def _keep_one(
    seen: dict[str, tuple[str, Any]], name: str, source: str, spec: Any, same: Any, kind: str
) -> None:
    """Record ``spec`` under ``name`` unless an earlier file has it; a different one is an error."""
    if name not in seen:
        seen[name] = (source, spec)
        return
    first_source, first = seen[name]
    first_same: Any
    if kind == "queue":
        first_same = (first.role, first.settings, first.delay_ms)
    elif kind == "policy":
        first_same = first.definition
    else:
        first_same = first
    if first_same != same:
        raise TopologyFileError(
            source,
            f"{kind} {name!r} is also in {first_source}, with other settings: one vhost can hold "
            "only one of them (make the files agree, or rename it in one)",
        )

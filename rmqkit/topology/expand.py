"""Expansion of a topology file into the concrete broker objects it stands for."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from rmqkit import names
from rmqkit.errors import TopologyFileError
from rmqkit.topology.desired import (
    BindingSpec,
    DesiredState,
    ExchangeSpec,
    FixedQueueSpec,
    PolicySpec,
    QueueSpec,
    Via,
    policy_name,
)
from rmqkit.topology.ladder import default_ladder, delay_targets
from rmqkit.topology.model import Topology
from rmqkit.topology.partitions import partition_hashing
from rmqkit.topology.retry_engine import broker_retry_settings
from rmqkit.topology.schema import BUILTIN_EXCHANGE_PREFIX, QueueModel
from rmqkit.topology.summary import summarize

# The weight of each partition's binding to its consistent-hash exchange (its routing key): all
# equal, so keys spread evenly; the broker parses it as an integer.
PARTITION_WEIGHT = "1"


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
    """Per tier, the (name, ttl_ms) of its jitter slot queues; the last slot is the full delay.
    ``queue``: a work queue of the file, or one of its lanes or partitions."""
    spec = topology.queue_spec(queue)
    tiers: list[list[tuple[str, int]]] = []
    if spec.retry_engine == "broker":
        return tiers  # the broker holds retries back in the work queue itself
    for delay in spec.retry_delays:
        main = topology.wait_name(queue, delay)
        slots = []
        for ttl in jitter_slot_delays(delay, spec.jitter, spec.jitter_slots):
            name = main if ttl == delay else names.slot_queue(main, ttl)
            slots.append((name, ttl))
        tiers.append(slots)
    return tiers


def _work_settings(spec: QueueModel, parking: str) -> dict[str, Any]:
    settings: dict[str, Any] = {
        "dead-letter-exchange": "",
        "dead-letter-routing-key": parking,
        "dead-letter-strategy": "at-least-once",
        "overflow": "reject-publish",
        "delivery-limit": spec.delivery_limit,
    }
    if spec.max_length is not None:
        settings["max-length"] = spec.max_length
    if spec.max_length_bytes is not None:
        settings["max-length-bytes"] = spec.max_length_bytes
    if spec.retry_engine == "broker":
        settings.update(broker_retry_settings(spec))
    if spec.retention is not None:
        # Queue-level TTL: it counts from when a message entered this queue, so a retry
        # coming back from a wait queue starts a new window, and dead-lettering strips any
        # per-message expiration (kept as x-death original-expiration): no retry is
        # expired for time it spent elsewhere. Expired → DLX above → parking, at-least-once.
        settings["message-ttl"] = spec.retention
    return settings


def _work_queue_family(topology: Topology, queue: str) -> list[QueueSpec]:
    """A work queue (the file's, a lane or a partition) and its wait queues."""
    spec = topology.queue_spec(queue)
    out = [
        QueueSpec(
            queue,
            "work",
            queue,
            _work_settings(spec, topology.parking_name(queue)),
            single_active_consumer=spec.single_active_consumer,
        )
    ]
    for tier_index, slots in enumerate(wait_queue_names(topology, queue)):
        for wait_name, ttl in slots:
            wait_settings: dict[str, Any] = {
                "message-ttl": ttl,
                "dead-letter-exchange": "",
                # back to this very queue: a lane's retry stays in its lane, a partition's in
                # its partition (not through the hash exchange, which would pick the same one)
                "dead-letter-routing-key": queue,
                "dead-letter-strategy": "at-least-once",
                "overflow": "reject-publish",
            }
            out.append(QueueSpec(wait_name, "wait", queue, wait_settings, ttl, tier_index))
    return out


def _partition_objects(
    topology: Topology, name: str, broker_version: tuple[int, int, int]
) -> tuple[ExchangeSpec, list[BindingSpec]]:
    """The hash exchange of a partitioned work queue and its bindings: weight 1 to each
    partition, and the file's ``bind`` entries re-pointed at it (exchange-to-exchange)."""
    spec = topology.model.queues[name]
    exchange = names.partition_exchange(name)
    bindings = [
        # the routing key of a consistent-hash binding is the partition's weight; the modulus
        # hash ignores it (the same bindings serve both, so a switch re-creates none)
        BindingSpec(exchange, queue, "queue", PARTITION_WEIGHT)
        for queue in topology.partitions_of(name)
    ]
    bindings += [
        BindingSpec(bind.exchange, exchange, "exchange", bind.routing_key, dict(bind.arguments))
        for bind in spec.bind
    ]
    kind, arguments = partition_hashing(spec, broker_version)
    return ExchangeSpec(exchange, kind, arguments=arguments), bindings


def expand(
    topology: Topology, *, via: Via = "policy", broker_version: tuple[int, int, int] = (3, 10, 0)
) -> DesiredState:
    """The concrete objects for ``topology`` on a broker of ``broker_version`` (``_expand_file``
    plus the delay ladder if a queue has a ``delay``)."""
    state = _expand_file(topology, via, broker_version)
    return _with_ladder(state, delay_targets(topology))


def _expand_file(
    topology: Topology, via: Via, broker_version: tuple[int, int, int]
) -> DesiredState:
    """The concrete objects for ``topology`` on a broker of ``broker_version``.

    Version matters for parking queues: quorum queues get a default delivery limit of 20 from
    4.0, so parking sets ``delivery-limit: -1`` there; 3.x rejects -1 and has no default.

    A work queue with lanes becomes itself plus one work queue per lane (each with its own wait
    queues, not bound to the file's exchanges); a partitioned one becomes N single-active-
    consumer work queues behind a hash exchange (``partition_hashing``; the name itself is no
    queue). All
    of them dead-letter to the work queue's one parking queue. A queue with a ``delay`` brings
    in the default delay ladder (rmqkit.topology.ladder).
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
        members = [name] if not spec.partitions else []
        members += [lane.queue for lane in topology.lanes_of(name)]
        members += topology.partitions_of(name)
        for member in members:
            queues.extend(_work_queue_family(topology, member))
        if parking not in seen_parking:
            seen_parking.add(parking)
            # reject-publish: should anyone bound parking later, producers get a nack
            # instead of the oldest parked message being dropped (drop-head).
            parking_settings: dict[str, Any] = {"overflow": "reject-publish"}
            if broker_version >= (4, 0, 0):
                parking_settings["delivery-limit"] = -1
            queues.append(QueueSpec(parking, "parking", name, parking_settings))
            archive = topology.archive_name(name)
            if archive is not None and spec.archive is not None:
                # What `parking archive` set aside, kept for the retention and then dropped
                # (no dead-letter: expiring is the point); reject-publish and no delivery limit
                # as on parking, since `restore` browses it the same way.
                queues.append(
                    QueueSpec(
                        archive, "archive", name, {**parking_settings, "message-ttl": spec.archive}
                    )
                )
        if spec.partitions:
            hashing, hash_bindings = _partition_objects(topology, name, broker_version)
            exchanges.append(hashing)
            bindings.extend(hash_bindings)
            continue
        for bind in spec.bind:
            bindings.append(
                BindingSpec(bind.exchange, name, "queue", bind.routing_key, dict(bind.arguments))
            )
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
        work_queues=[
            summarize(topology, name, partition_hashing(spec, broker_version)[0])
            for name, spec in model.queues.items()
        ],
    )


def _with_ladder(state: DesiredState, targets: list[tuple[str, str]]) -> DesiredState:
    """``state`` plus the default delay ladder and its exits to ``targets`` (none: unchanged).
    The ladder's own objects first, so its exchanges exist before the exits are bound."""
    if not targets:
        return state
    ladder = default_ladder()
    objects = ladder.objects(targets)
    exchanges = [ExchangeSpec(e.name, "headers", internal=e.internal) for e in objects.exchanges]
    bindings = [
        BindingSpec(b.source, b.destination, b.destination_type, "", b.arguments, text=b.label)
        for b in objects.bindings
    ]
    return replace(
        state,
        exchanges=[*state.exchanges, *exchanges],
        bindings=[*state.bindings, *bindings],
        fixed_queues=[FixedQueueSpec(q.name, q.arguments) for q in objects.queues],
        ladder=ladder.base,
        ladder_targets=list(targets),
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
    if not topologies:
        raise ValueError("expand_all needs at least one topology")
    if len(topologies) == 1:
        return expand(topologies[0], via=via, broker_version=broker_version)
    states = [(t.source, _expand_file(t, via, broker_version)) for t in topologies]
    # one ladder for the vhost, with the exits every file needs
    targets: list[tuple[str, str]] = []
    for topology in topologies:
        targets += [t for t in delay_targets(topology) if t not in targets]
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
            same = (queue.role, queue.settings, queue.delay_ms, queue.single_active_consumer)
            _keep_one(queues, queue.name, source, queue, same, "queue")
        for policy in state.policies:
            _keep_one(policies, policy.name, source, policy, policy.definition, "policy")
        bindings.extend(b for b in state.bindings if b not in bindings)
    first = states[0][1]
    merged = DesiredState(
        exchanges=[spec for _, spec in exchanges.values()],
        queues=[spec for _, spec in queues.values()],
        bindings=bindings,
        policies=[spec for _, spec in policies.values()],
        via=via,
        policy_priority=first.policy_priority,
        work_queues=[w for _, state in states for w in state.work_queues],
    )
    return _with_ladder(merged, targets)


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
        first_same = (first.role, first.settings, first.delay_ms, first.single_active_consumer)
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

"""Flow control in a topology file: the names of lanes, partitions and their hash exchange, which
lane a message takes, and which work queues a publish reaches (docs/topology.md).

Pure functions over the validated schema (rmqkit.topology.schema); ``Topology``
(rmqkit.topology.model) exposes them as methods.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from rmqkit.names import lane_queue, partition_exchange, partition_queue
from rmqkit.topology.retry_engine import broker_retry_problem
from rmqkit.topology.schema import LaneModel, QueueModel, TopologyModel

# The broker's built-in exchanges and their types: a file binds to them without declaring them.
BUILTIN_TYPES = {
    "amq.direct": "direct",
    "amq.topic": "topic",
    "amq.fanout": "fanout",
    "amq.headers": "headers",
    "amq.match": "headers",
}


@dataclass(frozen=True)
class LaneSpec:
    """A lane of a work queue as the consumer and publishers see it."""

    name: str  # as in the file: [queues.W.lanes.NAME]
    queue: str  # the lane's own work queue: "W.lane.NAME"
    prefetch: int  # the lane's, else the work queue's
    concurrency: int | None  # the lane's; None: the consumer's own (as for the work queue)


def derived_queues(model: TopologyModel) -> dict[str, str]:
    """Every lane and partition queue of the file → the work queue (as in the file) it serves."""
    out: dict[str, str] = {}
    for name, spec in model.queues.items():
        for lane in spec.lanes:
            out[lane_queue(name, lane)] = name
        for index in range(spec.partitions or 0):
            out[partition_queue(name, index)] = name
    return out


def lane_specs(work_queue: str, spec: QueueModel) -> list[LaneSpec]:
    """The lanes of ``work_queue`` in file order (the order they are matched in)."""
    return [
        LaneSpec(
            name=lane,
            queue=lane_queue(work_queue, lane),
            prefetch=model.prefetch or spec.prefetch,
            concurrency=model.concurrency,
        )
        for lane, model in spec.lanes.items()
    ]


def _text(value: Any) -> str:
    """A header value as the file writes it: AMQP hands strings back as bytes sometimes."""
    if isinstance(value, bytes | bytearray):
        return bytes(value).decode("utf-8", "replace")
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def lane_matches(lane: LaneModel, headers: Mapping[str, Any], body_size: int) -> bool:
    """Every given header has the given value, and the body is over ``body_over`` if set."""
    for key, want in lane.header.items():
        if key not in headers or _text(headers[key]) != _text(want):
            return False
    return lane.body_over is None or body_size > lane.body_over


def choose_lane(
    work_queue: str, spec: QueueModel, headers: Mapping[str, Any] | None, body_size: int
) -> str:
    """The queue a message for ``work_queue`` goes to: the first matching lane, else itself."""
    for lane, model in spec.lanes.items():
        if lane_matches(model, headers or {}, body_size):
            return lane_queue(work_queue, lane)
    return work_queue


def topic_matches(pattern: str, routing_key: str) -> bool:
    """AMQP topic matching: ``*`` one word, ``#`` zero or more words, words split on dots."""
    words = routing_key.split(".") if routing_key else []
    parts = pattern.split(".") if pattern else []

    def match(p: int, w: int) -> bool:
        if p == len(parts):
            return w == len(words)
        if parts[p] == "#":
            return any(match(p + 1, k) for k in range(w, len(words) + 1))
        if w == len(words):
            return False
        return (parts[p] == "*" or parts[p] == words[w]) and match(p + 1, w + 1)

    return match(0, 0)


def headers_match(arguments: Mapping[str, Any], headers: Mapping[str, Any] | None) -> bool:
    """A headers-exchange binding: ``x-match`` all (default) or any over the non-``x-`` keys."""
    mode = _text(arguments.get("x-match", "all"))
    tests = {k: v for k, v in arguments.items() if not k.startswith("x-")}
    have = headers or {}
    results = [k in have and (v is None or _text(have[k]) == _text(v)) for k, v in tests.items()]
    if mode.startswith("any"):
        return any(results)
    return all(results)


def binding_matches(
    exchange_type: str,
    binding_key: str,
    arguments: Mapping[str, Any],
    routing_key: str,
    headers: Mapping[str, Any] | None,
) -> bool:
    """Whether one binding of an exchange of ``exchange_type`` takes the message."""
    if exchange_type == "fanout":
        return True
    if exchange_type == "topic":
        return topic_matches(binding_key, routing_key)
    if exchange_type == "headers":
        return headers_match(arguments, headers)
    return binding_key == routing_key  # direct, and anything unknown treated as direct


def work_queues_for(
    model: TopologyModel,
    exchange: str,
    routing_key: str,
    headers: Mapping[str, Any] | None = None,
    exchange_type: Callable[[str], str | None] | None = None,
) -> list[str]:
    """The work queues of the file (as named in it) a publish to ``exchange`` with
    ``routing_key`` reaches: the work queues' ``bind`` entries, exchange-to-exchange
    ``[[bindings]]`` and alternate exchanges followed; ``""`` = the queue named ``routing_key``.

    A partitioned work queue is not a queue on the broker: it is reached through its binds, or
    through its partition exchange or one of its partitions named directly; a lane queue named
    directly (default exchange) reaches its work queue too. So a message sent past the file's
    exchanges still gets its work queue's encryption and default delay. ``headers`` matter for
    headers exchanges only (without them no headers binding matches).
    """

    def type_of(name: str) -> str | None:
        if name in model.exchanges:
            return model.exchanges[name].type
        if exchange_type is not None:
            return exchange_type(name)
        return BUILTIN_TYPES.get(name)

    if exchange == "":
        spec = model.queues.get(routing_key)
        if spec is not None:
            return [] if spec.partitions else [routing_key]
        parent = derived_queues(model).get(routing_key)  # a lane or partition queue
        return [parent] if parent is not None else []
    found: list[str] = []
    seen: set[str] = set()
    hashing = {partition_exchange(q): q for q, spec in model.queues.items() if spec.partitions}

    def visit(name: str) -> None:
        if name in seen:
            return
        seen.add(name)
        if name in hashing:  # every message it takes goes to one of the queue's partitions
            if hashing[name] not in found:
                found.append(hashing[name])
            return
        kind = type_of(name)
        if kind is None:
            return
        routed = False
        for queue, spec in model.queues.items():
            for bind in spec.bind:
                if bind.exchange == name and binding_matches(
                    kind, bind.routing_key, bind.arguments, routing_key, headers
                ):
                    routed = True
                    if queue not in found:
                        found.append(queue)
        for binding in model.bindings:
            if binding.source != name or not binding_matches(
                kind, binding.routing_key, binding.arguments, routing_key, headers
            ):
                continue
            if binding.destination_type == "exchange":
                routed = True
                visit(binding.destination)
            elif binding.destination in model.queues:
                routed = True
                if binding.destination not in found:
                    found.append(binding.destination)
            else:
                routed = True  # a wait or parking queue: reached, but not a work queue
        alternate = model.exchanges[name].alternate_exchange if name in model.exchanges else None
        if not routed and alternate:
            visit(alternate)

    visit(exchange)
    return found


def flow_problems(model: TopologyModel) -> list[tuple[tuple[int | str, ...], str]]:
    """What is wrong with the flow keys of a file, as (key location, detail), first first."""
    problems: list[tuple[tuple[int | str, ...], str]] = []
    taken = set(model.queues) | set(model.exchanges)
    for name, spec in model.queues.items():
        loc: tuple[int | str, ...] = ("queues", name)
        if spec.retry_engine == "broker":
            problem = broker_retry_problem(spec)
            if problem is not None:
                problems.append(((*loc, "retry_engine"), problem))
        if spec.partition_by == "routing_key":
            problems += _routing_key_partition_problems(model, loc, spec)
        elif (spec.partitions is None) != (spec.partition_key is None):
            problems.append(
                (
                    (*loc, "partitions" if spec.partitions is None else "partition_key"),
                    "partitions = N and partition_key = HEADER go together (or partitions = N "
                    'with partition_by = "routing_key")',
                )
            )
        if spec.partition_key is not None and not spec.partition_key.strip():
            problems.append(((*loc, "partition_key"), "partition_key must name a header"))
        if spec.partitions and spec.lanes:
            problems.append(
                (
                    (*loc, "lanes"),
                    "a partitioned work queue cannot have lanes (a lane would take messages out "
                    "of their partition's order)",
                )
            )
        for lane in spec.lanes:
            if not re.fullmatch(r"[A-Za-z0-9_-]+", lane):
                problems.append(
                    ((*loc, "lanes", lane), "lane names use letters, digits, '-' and '_' only")
                )
        extra = sorted(set(spec.blind_index) - set(spec.sensitive_fields))
        if extra:
            problems.append(
                (
                    (*loc, "blind_index"),
                    f"{', '.join(extra)} not in sensitive_fields: a blind index is kept only "
                    "for a sensitive field",
                )
            )
        if spec.encrypt and not spec.sensitive_fields:
            problems.append(
                ((*loc, "encrypt"), "encrypt = true needs sensitive_fields (what to encrypt)")
            )
        if spec.partitions:
            exchange = partition_exchange(name)
            if exchange in taken:
                problems.append(
                    ((*loc, "partitions"), f"the partition exchange {exchange!r} clashes")
                )
            taken.add(exchange)
    return problems


def _routing_key_partition_problems(
    model: TopologyModel, loc: tuple[int | str, ...], spec: QueueModel
) -> list[tuple[tuple[int | str, ...], str]]:
    """``partition_by = "routing_key"``: the routing key is the key, so no header is named, and
    no ``bind`` entry may give every message it takes one routing key (a direct binding, or a
    topic pattern without a wildcard): all of them would land in one partition."""
    problems: list[tuple[tuple[int | str, ...], str]] = []
    if spec.partitions is None:
        problems.append(
            ((*loc, "partition_by"), 'partition_by = "routing_key" needs partitions = N')
        )
    if spec.partition_key is not None:
        problems.append(
            (
                (*loc, "partition_key"),
                'partition_by = "routing_key" hashes the routing key: drop partition_key (or '
                'use partition_by = "header" to hash that header)',
            )
        )
    for index, bind in enumerate(spec.bind):
        declared = model.exchanges.get(bind.exchange)
        kind = declared.type if declared is not None else BUILTIN_TYPES.get(bind.exchange)
        fixed = "*" not in bind.routing_key and "#" not in bind.routing_key
        if kind == "direct" or (kind == "topic" and fixed):
            problems.append(
                (
                    (*loc, "bind", index),
                    f"every message this binding takes has routing key {bind.routing_key!r}, "
                    "so all of them would land in one partition: bind with a topic pattern "
                    '(e.g. "account.#"), a fanout or headers exchange, or publish to the '
                    "partition exchange with the key as routing key",
                )
            )
    return problems

"""One vhost as the management API shows it: queues with their settings in effect, policies.

Everything here is pure over the fetched JSON (``read_snapshot`` is the only I/O): the
settings in effect on each queue (arguments, the applying policy and operator policy, by the
broker's precedence rules) and where each queue dead-letters to. Each queue's role in the
work → wait → parking pattern is ``rmqkit.health.roles``. Statistics may be missing (metrics
collection off, a queue that never saw a message); every accessor returns None for a number it
cannot know.

The settings in effect come from ``rmqkit.broker.policies`` (the resolver plan and the parking
commands use too). It lives in the broker layer because doctor and status (health) and the
consumer's start-up wiring check all read it, and the consumer sits below health.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

from rmqkit.broker import policies as policies_mod
from rmqkit.broker.amqp import parse_version
from rmqkit.broker.management import ManagementClient
from rmqkit.broker.policies import (
    QUORUM_DEFAULT_DELIVERY_LIMIT_4X,
    Version,
    as_policy,
    resolve_queue,
)


def number(value: Any) -> float | None:
    """``value`` as a number, or None (absent, null, or not numeric)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value)


def count(value: Any) -> int | None:
    """``value`` as a whole count, or None."""
    found = number(value)
    return None if found is None else int(found)


def rate(stats: dict[str, Any] | None, key: str) -> float | None:
    """``message_stats[key + "_details"]["rate"]`` or None when the broker keeps no stats."""
    details = (stats or {}).get(f"{key}_details")
    return number(details.get("rate")) if isinstance(details, dict) else None


def _names(value: Any) -> list[str] | None:
    if not isinstance(value, list):
        return None
    return sorted(str(item) for item in value)


def policy_applies(policy: dict[str, Any], name: str, queue_type: str | None) -> bool:
    """Whether ``policy`` (a user or operator policy) matches queue ``name`` of ``queue_type``.

    ``queue_type`` None means an exchange.
    """
    return as_policy(policy).applies_to(name, queue_type)


def applying_policy(
    policies: list[dict[str, Any]], name: str, queue_type: str | None
) -> dict[str, Any] | None:
    """The one policy the broker applies (``rmqkit.broker.policies.applying_policy``), as the
    management API listed it."""
    chosen = policies_mod.applying_policy(policies, name, queue_type)
    if chosen is None:
        return None
    return next(p for p in policies if as_policy(p) == chosen)


@dataclass(frozen=True)
class QueueView:
    """One queue: identity, effective settings and the statistics the broker reported."""

    name: str
    type: str
    durable: bool
    exclusive: bool
    auto_delete: bool
    arguments: dict[str, Any]
    settings: dict[str, Any]  # in effect, policy-key form ("message-ttl", …)
    sources: dict[str, str]  # setting → where it comes from ("argument", "policy 'p'", …)
    raw: dict[str, Any] = field(repr=False)
    # The delivery limit the broker enforces (quorum): None = none; 20 on 4.x unless set.
    delivery_limit: int | None = None
    delivery_limit_source: str = ""  # e.g. "argument", "policy 'p'", "the 4.x default"

    @property
    def ready(self) -> int | None:
        return count(self.raw.get("messages_ready"))

    @property
    def unacked(self) -> int | None:
        return count(self.raw.get("messages_unacknowledged"))

    @property
    def messages(self) -> int | None:
        return count(self.raw.get("messages"))

    @property
    def messages_persistent(self) -> int | None:
        return count(self.raw.get("messages_persistent"))

    @property
    def consumers(self) -> int | None:
        return count(self.raw.get("consumers"))

    @property
    def stats(self) -> dict[str, Any]:
        found = self.raw.get("message_stats")
        return found if isinstance(found, dict) else {}

    @property
    def publish_rate(self) -> float | None:
        return rate(self.stats, "publish")

    @property
    def deliver_rate(self) -> float | None:
        return rate(self.stats, "deliver_get")

    @property
    def ack_rate(self) -> float | None:
        return rate(self.stats, "ack")

    @property
    def growth_rate(self) -> float | None:
        """Change of the message count per second (``messages_details.rate``)."""
        details = self.raw.get("messages_details")
        return number(details.get("rate")) if isinstance(details, dict) else None

    @property
    def leader(self) -> str | None:
        """Quorum queues: the node of the current leader (None: not said, or none)."""
        value = self.raw.get("leader")
        return value if isinstance(value, str) and value else None

    @property
    def members(self) -> list[str] | None:
        """Quorum queues: the nodes holding a replica; None when the broker does not say."""
        return _names(self.raw.get("members"))

    @property
    def online(self) -> list[str] | None:
        """Quorum queues: the members that are up; None when the broker does not say."""
        return _names(self.raw.get("online"))

    @property
    def dead_letter_exchange(self) -> str | None:
        value = self.settings.get("dead-letter-exchange")
        return value if isinstance(value, str) else None

    @property
    def dead_letter_routing_key(self) -> str | None:
        value = self.settings.get("dead-letter-routing-key")
        return value if isinstance(value, str) else None

    def source(self, key: str) -> str:
        """Where setting ``key`` comes from, for evidence lines."""
        return self.sources.get(key, "default")


def effective_queue(
    raw: dict[str, Any],
    policies: list[dict[str, Any]],
    operator_policies: list[dict[str, Any]],
    version: Version,
) -> QueueView:
    """A queue's settings in effect, by the broker's rules (``rmqkit.broker.policies``).

    Worked out from the policy list rather than ``effective_policy_definition``, which lags a
    policy change by up to the stats interval.
    """
    found = resolve_queue(raw, policies, operator_policies, version)
    return QueueView(
        name=str(raw.get("name", "")),
        type=str(raw.get("type") or "classic"),
        durable=bool(raw.get("durable", True)),
        exclusive=bool(raw.get("exclusive", False)),
        auto_delete=bool(raw.get("auto_delete", False)),
        arguments=dict(raw.get("arguments") or {}),
        settings=found.settings,
        sources=found.sources,
        raw=raw,
        delivery_limit=found.delivery_limit,
        delivery_limit_source=found.delivery_limit_source,
    )


@dataclass(frozen=True)
class NodeView:
    """One node of the cluster as ``/api/nodes`` shows it: running, and its resource alarms
    with the usage and limit behind each (None where the broker does not say)."""

    name: str
    running: bool
    mem_alarm: bool = False
    disk_free_alarm: bool = False
    mem_used: int | None = None
    mem_limit: int | None = None
    disk_free: int | None = None
    disk_free_limit: int | None = None

    @classmethod
    def of(cls, raw: dict[str, Any]) -> NodeView:
        """From one row of ``/api/nodes``."""
        return cls(
            name=str(raw.get("name", "")),
            running=bool(raw.get("running", False)),
            mem_alarm=bool(raw.get("mem_alarm", False)),
            disk_free_alarm=bool(raw.get("disk_free_alarm", False)),
            mem_used=count(raw.get("mem_used")),
            mem_limit=count(raw.get("mem_limit")),
            disk_free=count(raw.get("disk_free")),
            disk_free_limit=count(raw.get("disk_free_limit")),
        )


@dataclass(frozen=True)
class Snapshot:
    """Everything `doctor` and `status` read from one vhost, fetched once."""

    vhost: str
    version: Version
    queues: dict[str, QueueView]
    exchanges: dict[str, dict[str, Any]]
    bindings: list[dict[str, Any]]
    policies: list[dict[str, Any]]
    operator_policies: list[dict[str, Any]]
    vhost_stats: dict[str, Any] | None  # the vhost's message_stats; None when not kept
    rates_mode: str | None = None  # "none" when the broker keeps counts but no rates
    stats_disabled: bool = False  # management.disable_stats: no message stats at all
    # The cluster's nodes (/api/nodes); None when the user may not read them (monitoring tag).
    nodes: list[NodeView] | None = None

    @property
    def rates_kept(self) -> bool:
        """Whether the broker computes message rates (and message_stats) at all."""
        return not self.stats_disabled and self.rates_mode != "none"

    def exchange_exists(self, name: str) -> bool:
        """The default exchange ("") always exists."""
        return name == "" or name in self.exchanges

    def exchange_setting(self, name: str, key: str) -> Any:
        """An exchange setting from its arguments, else from the policy that applies to it."""
        exchange = self.exchanges.get(name) or {}
        arguments = exchange.get("arguments") or {}
        if arguments.get(key) is not None:
            return arguments[key]
        policy = applying_policy(self.policies, name, None)
        return ((policy or {}).get("definition") or {}).get(key)

    def dead_letter_targets(self, queue: QueueView) -> list[str] | None:
        """The queues ``queue`` dead-letters into; None if it has no dead-letter exchange.

        Through the default exchange the target is the dead-letter routing key (or, without
        one, each message's own key: unknown, so []). Through a named exchange: the queues
        bound to it, following exchange-to-exchange bindings; for direct exchanges only the
        bindings whose key equals the dead-letter routing key, when one is set.
        """
        dlx = queue.dead_letter_exchange
        if dlx is None:
            return None
        key = queue.dead_letter_routing_key
        if dlx == "":
            return [key] if key and key in self.queues else []
        found: list[str] = []
        seen: set[str] = set()
        todo = [dlx]
        while todo:
            exchange = todo.pop()
            if exchange in seen:
                continue
            seen.add(exchange)
            direct = (self.exchanges.get(exchange) or {}).get("type") == "direct"
            for binding in self.bindings:
                if binding.get("source") != exchange:
                    continue
                if direct and key is not None and binding.get("routing_key") != key:
                    continue
                destination = str(binding.get("destination", ""))
                if binding.get("destination_type") == "exchange":
                    todo.append(destination)
                elif destination in self.queues and destination not in found:
                    found.append(destination)
        return found


async def read_snapshot(api: ManagementClient) -> Snapshot:
    """Fetch the vhost's queues, exchanges, bindings, policies and stats, and the cluster's
    nodes (management API)."""
    # Eight independent reads, in flight together.
    lists = asyncio.gather(
        api.policies(), api.operator_policies(), api.queues(), api.exchanges(), api.bindings()
    )
    (
        overview,
        info,
        nodes,
        (policies, operator, raw_queues, exchanges, bindings),
    ) = await asyncio.gather(api.overview(), api.vhost_info(), api.nodes(), lists)
    version = parse_version(str(overview.get("rabbitmq_version") or "0.0.0"))
    stats = info.get("message_stats")
    return Snapshot(
        vhost=api.vhost,
        version=version,
        queues={
            str(q.get("name")): effective_queue(q, policies, operator, version) for q in raw_queues
        },
        exchanges={str(e.get("name", "")): e for e in exchanges},
        bindings=[b for b in bindings if b.get("source")],
        policies=policies,
        operator_policies=operator,
        vhost_stats=stats if isinstance(stats, dict) else None,
        rates_mode=str(overview["rates_mode"]) if overview.get("rates_mode") else None,
        stats_disabled=bool(overview.get("disable_stats", False)),
        nodes=None if nodes is None else [NodeView.of(row) for row in nodes],
    )


__all__ = [
    "QUORUM_DEFAULT_DELIVERY_LIMIT_4X",
    "NodeView",
    "QueueView",
    "Snapshot",
    "Version",
    "applying_policy",
    "count",
    "effective_queue",
    "number",
    "policy_applies",
    "rate",
    "read_snapshot",
]

"""What a topology file asks the broker to hold, as plain specs: exchanges, queues (with their
role), bindings and policies (``DesiredState``), and the names and keys rmqkit manages. Built by
rmqkit.topology.expand, compared with the broker's by rmqkit.topology.plan."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Literal

from rmqkit.topology.permissions import PermissionSpec
from rmqkit.topology.summary import WorkQueueSummary

Via = Literal["policy", "arguments"]
QueueRole = Literal["work", "wait", "parking", "archive"]
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
    # retry_engine = "broker" (rmqkit.topology.retry_engine)
    "delayed-retry-type",
    "delayed-retry-min",
    "delayed-retry-max",
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
    # x-single-active-consumer: a declaration-time argument only (no policy key), so it is in
    # the arguments whatever ``via`` says, and cannot change on an existing queue.
    single_active_consumer: bool = False

    def arguments(self, via: Via) -> dict[str, Any]:
        """The x-arguments to declare the queue with: settings go in them only ``via`` arguments."""
        args: dict[str, Any] = {"x-queue-type": "quorum"}
        if self.single_active_consumer:
            args["x-single-active-consumer"] = True
        if via == "arguments":
            args.update({f"x-{key}": value for key, value in self.settings.items()})
        return args


@dataclass(frozen=True)
class FixedQueueSpec:
    """A queue declared with fixed x-arguments and no policy, whatever ``via`` says: the delay
    ladder's rungs (docs/delay.md: a policy on a rung would be the only one applying)."""

    name: str
    fixed_arguments: dict[str, Any]

    def arguments(self, via: Via) -> dict[str, Any]:
        """The x-arguments to declare it with (``via`` does not matter)."""
        return dict(self.fixed_arguments)


@dataclass(frozen=True)
class BindingSpec:
    """A binding from an exchange to a queue or exchange."""

    source: str
    destination: str
    destination_type: Literal["queue", "exchange"]
    routing_key: str
    arguments: dict[str, Any] = field(default_factory=dict)
    text: str = ""  # the label, when the routing key alone does not tell bindings apart

    @property
    def label(self) -> str:
        if self.text:
            return self.text
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
class DesiredState:
    """Everything a topology file asks the broker to hold, for one declaration mode."""

    exchanges: list[ExchangeSpec]
    queues: list[QueueSpec]
    bindings: list[BindingSpec]
    policies: list[PolicySpec]
    via: Via
    policy_priority: int
    work_queues: list[WorkQueueSummary] = field(default_factory=list)
    # The delay ladder's rungs (fixed x-arguments, no policy); its exchanges and bindings are
    # in ``exchanges`` and ``bindings``. Empty when no queue of the file has a ``delay``.
    fixed_queues: list[FixedQueueSpec] = field(default_factory=list)
    ladder: str | None = None  # the ladder's base name, for plan's summary
    ladder_targets: list[tuple[str, str]] = field(default_factory=list)
    # The users' permissions in the vhost (``[vhost.permissions]`` of every file).
    permissions: list[PermissionSpec] = field(default_factory=list)

    def all_queues(self) -> list[QueueSpec | FixedQueueSpec]:
        """Every queue to declare: the file's, then the delay ladder's rungs."""
        return [*self.queues, *self.fixed_queues]


def policy_name(queue: str) -> str:
    """The name of the policy rmqkit keeps for ``queue``."""
    return POLICY_PREFIX + queue

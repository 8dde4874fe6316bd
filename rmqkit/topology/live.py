"""What ``plan`` compares a topology with, and its verdicts: the broker's state in one vhost as
the management API reports it (``LiveState``), one object's verdict (``Change``) and the whole
``Plan``. Data only; rmqkit.topology.plan computes them."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from rmqkit.broker.policies import Effective, Version, resolve_queue
from rmqkit.topology.desired import MANAGED_KEYS, DesiredState
from rmqkit.topology.permissions import LivePermissions

Action = Literal["create", "change", "in-sync", "conflict", "orphan"]
Kind = Literal["exchange", "queue", "policy", "binding", "permission", "vhost"]
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
    # The vhost's permissions, read only when a file names some (``[vhost.permissions]``).
    permissions: LivePermissions | None = None


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


def managed_settings(found: Effective) -> dict[str, Any]:
    """The settings rmqkit manages (MANAGED_KEYS) out of a resolved queue's effective ones."""
    return {key: value for key, value in found.settings.items() if key in MANAGED_KEYS}


def queue_settings(live: LiveState, name: str) -> dict[str, Any]:
    """The managed settings in effect now on existing queue ``name``, as plan sees them (the
    same resolver as doctor's ``effective_queue``); {} for a queue that does not exist."""
    found = live.queues.get(name)
    if found is None:
        return {}
    policies = list(live.policies.values())
    return managed_settings(resolve_queue(found, policies, live.operator_policies, live.version))

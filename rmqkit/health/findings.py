"""What a doctor check produces and reads: findings, severities, and the input bundle.

Kept apart from the checks themselves (``rmqkit.health.checks``) so that the report, the
CLI and tests can use these types without the checklist.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

from rmqkit.broker.snapshot import QueueView, Snapshot
from rmqkit.health.roles import Role
from rmqkit.topology.plan import Plan

Severity = Literal["ok", "warning", "critical"]
SEVERITY_RANK: dict[str, int] = {"ok": 0, "warning": 1, "critical": 2}


@dataclass(frozen=True)
class Finding:
    """One problem: which check found it, how bad, on what, what shows it, how to fix it."""

    check: str
    severity: Severity
    kind: str  # queue | exchange | policy | operator-policy | vhost | binding | node
    object: str
    evidence: str
    fix: str

    def as_dict(self) -> dict[str, str]:
        """JSON-ready form."""
        return {
            "check": self.check,
            "severity": self.severity,
            "kind": self.kind,
            "object": self.object,
            "evidence": self.evidence,
            "fix": self.fix,
        }


class CheckSkipped(Exception):
    """A check could not run; the message says why (e.g. the broker keeps no stats)."""


@dataclass(frozen=True)
class DedupeWindow:
    """What the ``dedupe-window-short`` check compares (``doctor --dedupe DSN``): the store's
    retention window against how late a copy of a message can come back."""

    store: str  # the DSN, masked
    window_s: float | None  # recorded by `rmqkit dedupe init` (None: none recorded)
    replay_horizon_s: float | None  # --replay-horizon as declared (None: not declared)
    # work queue → (its longest retry path in seconds, how it was computed)
    retry_paths: dict[str, tuple[float, str]] = field(default_factory=dict)


@dataclass(frozen=True)
class UpgradeFacts:
    """What the upgrade preflight (``doctor --target``) reads beyond the snapshot; None where
    the broker does not say or this user may not read it."""

    target: tuple[int, int]  # the version the vhost is to run on, e.g. (4, 3)
    # /api/vhosts/V/channels: name, user, prefetch_count, global_prefetch_count, consumer_count
    channels: list[dict[str, Any]] | None = None
    # /api/feature-flags: name → (state, stability); None: refused (administrator on 3.x)
    feature_flags: dict[str, tuple[str, str]] | None = None
    # work queues the topology file names (`doctor --topology`): consumed by `rmqkit consume`
    rmqkit_queues: frozenset[str] = frozenset()


@dataclass(frozen=True)
class DoctorInput:
    """Everything the checks look at, fetched beforehand so the checks stay pure."""

    snapshot: Snapshot
    roles: dict[str, tuple[Role, str]]  # queue → (role, its work queue)
    handler_timeout_s: float = 30.0
    handler_timeout_source: str = "the consumer's default"
    handler_timeouts: dict[str, tuple[float, str]] = field(default_factory=dict)  # per queue
    ready_samples: dict[str, tuple[int, int]] = field(default_factory=dict)  # before, after
    sample_interval_s: float = 0.0
    plan: Plan | None = None
    dedupe: DedupeWindow | None = None
    # transient-messages: the candidates' (messages, messages_persistent) read again a stats
    # interval later; None: not read again (the first read alone decides)
    transient_reread: dict[str, tuple[int | None, int | None]] | None = None
    upgrade: UpgradeFacts | None = None  # doctor --target: the preflight's extra reads

    def role(self, name: str) -> Role:
        """The role of queue ``name`` ("other" if unknown)."""
        return self.roles.get(name, ("other", name))[0]

    def queues_with_role(self, role: Role) -> list[QueueView]:
        """The queues of one role, by name."""
        return [q for name, q in sorted(self.snapshot.queues.items()) if self.role(name) == role]

    def handler_timeout_for(self, queue: str) -> tuple[float, str]:
        """The handler timeout the consumer of ``queue`` runs with, and where it comes from."""
        return self.handler_timeouts.get(
            queue, (self.handler_timeout_s, self.handler_timeout_source)
        )


@dataclass(frozen=True)
class Check:
    """A check of the reliability checklist."""

    id: str
    title: str
    run: Callable[[DoctorInput], list[Finding]]


__all__ = [
    "SEVERITY_RANK",
    "Check",
    "CheckSkipped",
    "DedupeWindow",
    "DoctorInput",
    "Finding",
    "Severity",
    "UpgradeFacts",
]

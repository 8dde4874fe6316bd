"""Dead letters a queue holds because their target has not taken them, for `rmqkit status` and
`rmqkit doctor` (docs/doctor.md: dead-letter-backlog-held).

A quorum queue that dead-letters at-least-once (``dead-letter-strategy = at-least-once``, what
`rmqkit declare` sets on work and wait queues) keeps each dead letter until the target queue
confirms it. A target bounded with ``overflow = reject-publish`` refuses them while it is full;
so do a target that routes nowhere and one without a leader. The broker then holds them in
the source queue, counted as ``messages_dlx`` by the management API (and inside ``messages``,
never in ``messages_ready``): no consumer sees them, and the broker retries the hop only when
its dead-letter worker's confirm timeout has passed (``dead_letter_worker_publisher_confirm_
timeout``, 3 min by default; seen on 3.10.8: 24 held for ~6 min after the work queue was
emptied). A full work queue thus holds its retries in the wait queue for minutes.

Delay ladder rungs hold due messages the same way; they have their own view and check
(``rmqkit.health.delayed``, ``delayed-stuck``) and are left out here.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from rmqkit.broker.snapshot import QueueView, Snapshot, count
from rmqkit.health.roles import Role

RETRY_TEXT = (
    "the broker retries a refused dead letter only every few minutes (its dead-letter "
    "worker's confirm timeout, dead_letter_worker_publisher_confirm_timeout, 3 min by default)"
)


def held_count(queue: QueueView) -> int | None:
    """Dead letters ``queue`` holds for a target that has not taken them (``messages_dlx``);
    None where the broker does not say (classic queues, stats off)."""
    return count(queue.raw.get("messages_dlx"))


@dataclass(frozen=True)
class TargetState:
    """A dead-letter target as the snapshot shows it: its length bounds and its fill."""

    name: str
    role: Role
    messages: int | None
    max_length: int | None
    message_bytes: int | None
    max_length_bytes: int | None
    overflow: str

    @property
    def refuses_when_full(self) -> bool:
        """Bounded with reject-publish: it refuses (nacks) what does not fit."""
        bounded = self.max_length is not None or self.max_length_bytes is not None
        return bounded and self.overflow == "reject-publish"

    @property
    def full(self) -> bool:
        """At or over one of its bounds, as far as the (up to ~5 s old) counts tell."""
        over_length = (
            self.max_length is not None
            and self.messages is not None
            and self.messages >= self.max_length
        )
        over_bytes = (
            self.max_length_bytes is not None
            and self.message_bytes is not None
            and self.message_bytes >= self.max_length_bytes
        )
        return over_length or over_bytes

    def bound_text(self, *, fill: bool = True) -> str:
        """``6 of max-length 5, overflow reject-publish`` (``fill``: with the count, if known)."""
        parts: list[str] = []
        if self.max_length is not None:
            now = f"{self.messages} of " if fill and self.messages is not None else ""
            parts.append(f"{now}max-length {self.max_length}")
        if self.max_length_bytes is not None:
            now = f"{self.message_bytes} of " if fill and self.message_bytes is not None else ""
            parts.append(f"{now}max-length-bytes {self.max_length_bytes}")
        return ", ".join(parts) + f", overflow {self.overflow}"

    def refused_text(self) -> str:
        """A target that refuses when full but has room now: what happened, and its fill."""
        now = f"; {self.messages} in it now" if self.messages is not None else ""
        return f"{self.name} refused them while full ({self.bound_text(fill=False)}{now})"


@dataclass(frozen=True)
class HeldBacklog:
    """Dead letters held in one queue, where they are going and why they have not gone."""

    queue: str
    role: Role
    held: int
    held_bytes: int | None
    targets: list[TargetState] = field(default_factory=list)  # empty: routed to no queue

    @property
    def target_names(self) -> list[str]:
        """The queues the held messages are dead-lettered to."""
        return [t.name for t in self.targets]

    @property
    def refusing(self) -> list[TargetState]:
        """Targets that refuse messages when full (bounded, reject-publish)."""
        return [t for t in self.targets if t.refuses_when_full]

    def cause(self) -> str:
        """Why they are held, in a few words (a status note)."""
        if not self.targets:
            return "their dead-letter target routes them to no queue"
        full = [t for t in self.refusing if t.full]
        if full:
            return "; ".join(f"{t.name} full ({t.bound_text()})" for t in full)
        if self.refusing:
            refused = "; ".join(t.refused_text() for t in self.refusing)
            return f"{refused}; the broker retries every few minutes"
        return f"{', '.join(self.target_names)} has not confirmed them (no leader? an alarm?)"

    def note(self) -> str:
        """``24 dead letters held for hb.work: hb.work full (6 of max-length 5, …)``."""
        where = f" for {', '.join(self.target_names)}" if self.targets else ""
        return f"{self.held} dead letters held{where}: {self.cause()}"

    def evidence(self) -> str:
        """What the broker shows and what it means, for a doctor finding."""
        size = f", {self.held_bytes} bytes" if self.held_bytes else ""
        head = (
            f"{self.held} dead-lettered message(s){size} are held in {self.queue} "
            "(messages_dlx: not ready, invisible to consumers and to `rmqkit parking`)"
        )
        if not self.targets:
            return f"{head}: its dead-letter exchange routes them to no queue"
        full = [t for t in self.refusing if t.full]
        if full:
            why = "; ".join(f"{t.name} is full ({t.bound_text()}) and refuses them" for t in full)
            return f"{head}: {why}; even once it has room, {RETRY_TEXT}"
        if self.refusing:
            why = "; ".join(t.refused_text() for t in self.refusing)
            return f"{head}: {why}; it has room now, but {RETRY_TEXT}"
        return (
            f"{head}: {', '.join(self.target_names)} has not confirmed them (a quorum queue "
            f"without a leader, a node in memory or disk alarm); {RETRY_TEXT}"
        )

    def fix(self) -> str:
        """What to do, by what the target is."""
        steps: list[str] = []
        for target in self.refusing or self.targets:
            if target.role == "parking":
                steps.append(
                    f"make room in parking queue {target.name}: replay or purge what is "
                    "fixed (`rmqkit parking replay|purge`), and remove its length bound (a "
                    "parking queue should have none)"
                )
            else:
                steps.append(
                    f"make room in {target.name}: scale its consumers (more `rmqkit consume` "
                    "processes or --concurrency) so it drains, or raise its max_length "
                    "(topology file, then `rmqkit declare`; policy key max-length)"
                )
        if not self.targets:
            steps.append(
                "route them to a queue: fix the dead-letter exchange or routing key "
                "(see dead-letter-target-missing)"
            )
        return (
            "; ".join(steps)
            + f". The held messages then move on at the broker's next retry (within a few "
            f"minutes); do not delete {self.queue}: that drops them"
        )

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready form."""
        return {
            "queue": self.queue,
            "held": self.held,
            "held_bytes": self.held_bytes,
            "for": self.target_names,
            "cause": self.cause(),
        }


def _int_setting(queue: QueueView, key: str) -> int | None:
    value = queue.settings.get(key)
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def target_state(queue: QueueView, role: Role) -> TargetState:
    """A queue's bounds and fill, as a dead-letter target."""
    return TargetState(
        name=queue.name,
        role=role,
        messages=queue.messages,
        max_length=_int_setting(queue, "max-length"),
        message_bytes=count(queue.raw.get("message_bytes")),
        max_length_bytes=_int_setting(queue, "max-length-bytes"),
        overflow=str(queue.settings.get("overflow") or "drop-head"),
    )


def held_backlog(
    snapshot: Snapshot, queue: QueueView, roles: Mapping[str, tuple[Role, str]]
) -> HeldBacklog | None:
    """What ``queue`` holds for its dead-letter target; None when it holds nothing."""
    held = held_count(queue)
    if not held:
        return None
    targets = [
        target_state(snapshot.queues[name], roles.get(name, ("other", name))[0])
        for name in snapshot.dead_letter_targets(queue) or []
        if name in snapshot.queues
    ]
    return HeldBacklog(
        queue=queue.name,
        role=roles.get(queue.name, ("other", queue.name))[0],
        held=held,
        held_bytes=count(queue.raw.get("message_bytes_dlx")),
        targets=targets,
    )


def held_backlogs(snapshot: Snapshot, roles: Mapping[str, tuple[Role, str]]) -> list[HeldBacklog]:
    """Every queue of the snapshot holding dead letters, by name; delay ladder rungs left out
    (``delayed-stuck`` covers them)."""
    found: list[HeldBacklog] = []
    for name, queue in sorted(snapshot.queues.items()):
        if roles.get(name, ("other", name))[0] == "delay":
            continue
        backlog = held_backlog(snapshot, queue, roles)
        if backlog is not None:
            found.append(backlog)
    return found


__all__ = [
    "RETRY_TEXT",
    "HeldBacklog",
    "TargetState",
    "held_backlog",
    "held_backlogs",
    "held_count",
    "target_state",
]

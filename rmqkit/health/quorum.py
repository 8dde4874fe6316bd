"""Quorum queues' leaders and members, as `status` shows them and `doctor` judges them.

A quorum queue is a Raft group: its members (replicas) sit on some of the cluster's nodes, one
of them leads. It works — takes publishes, confirms them, delivers — only while a majority of
its members is online; without one it has no leader, publishes are not confirmed and deliveries
stop (its messages are still on the members that are down: do not delete it). ``/api/queues``
gives ``leader``, ``members`` and ``online`` per quorum queue (statistics: they may be a few
seconds old, and absent when the broker keeps no stats). Pure over ``QueueView``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from rmqkit.broker.snapshot import QueueView, count

RUNBOOK = "docs/runbooks/node-loss.md"
# RabbitMQ's quorum_cluster_size: a new quorum queue gets this many members (or one per node in
# a smaller cluster) unless x-quorum-initial-group-size says otherwise [seen on 3.10.8].
DEFAULT_GROUP_SIZE = 3


@dataclass(frozen=True)
class QuorumState:
    """Where one quorum queue's replicas are, which are up, and who leads."""

    queue: str
    leader: str | None
    members: list[str]
    online: list[str]

    @property
    def offline(self) -> list[str]:
        """Members that are not online (their node is down, or cut off)."""
        return [m for m in self.members if m not in self.online]

    @property
    def majority(self) -> int:
        """How many members must be online for the queue to work."""
        return len(self.members) // 2 + 1

    @property
    def has_majority(self) -> bool:
        """Whether enough members are online to elect a leader."""
        return len([m for m in self.online if m in self.members]) >= self.majority

    @property
    def members_text(self) -> str:
        """``3/3 online`` or ``1/3 online, NO MAJORITY (offline: rabbit@b, rabbit@c)``."""
        up = len(self.members) - len(self.offline)
        text = f"{up}/{len(self.members)} online"
        if not self.has_majority:
            text += ", NO MAJORITY"
        if self.offline:
            text += f" (offline: {', '.join(self.offline)})"
        return text

    @property
    def problem(self) -> str | None:
        """One line when the queue has lost its majority (it cannot work), else None."""
        if self.has_majority:
            return None
        return (
            f"quorum queue {self.queue} has {len(self.members) - len(self.offline)} of "
            f"{len(self.members)} members online (offline: {', '.join(self.offline)}), fewer "
            f"than a majority ({self.majority}): no leader — publishes to it are not confirmed "
            "and deliveries stop until the nodes are back; do not delete it, its messages are "
            f"on the offline members ({RUNBOOK})"
        )

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready form."""
        return {
            "leader": self.leader,
            "members": self.members,
            "online": self.online,
            "offline": self.offline,
            "majority": self.has_majority,
        }


def quorum_state(queue: QueueView) -> QuorumState | None:
    """The replicas of a quorum queue; None for other queues, or when the broker does not
    say (no stats yet, stats off)."""
    if queue.type != "quorum" or queue.members is None:
        return None
    online = queue.online if queue.online is not None else []
    return QuorumState(queue.name, queue.leader, queue.members, online)


def intended_size(queue: QueueView, cluster_nodes: int) -> int:
    """How many members the queue is meant to have: its ``x-quorum-initial-group-size`` (else
    the broker's default, 3), or one per node when the cluster is smaller."""
    wanted = count(queue.arguments.get("x-quorum-initial-group-size"))
    return min(cluster_nodes, wanted if wanted and wanted > 0 else DEFAULT_GROUP_SIZE)


__all__ = ["DEFAULT_GROUP_SIZE", "RUNBOOK", "QuorumState", "intended_size", "quorum_state"]

"""Resource alarms of the cluster's nodes, as `status` shows them and `doctor` judges them.

A memory or disk alarm on *any* node makes RabbitMQ block every publishing connection of the
cluster (consumers still receive): publishers hang until it clears. The management API's
``/api/nodes`` says which node, which resource, and the usage against the limit; everything
here is pure over ``Snapshot.nodes``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from rmqkit.broker.snapshot import NodeView

Resource = Literal["memory", "disk"]
RUNBOOK = "docs/runbooks/memory-alarm.md"


def size_text(value: int | None) -> str:
    """Bytes for a person: ``1.2 GB``, ``640 MB`` (decimal units, as RabbitMQ prints them)."""
    if value is None:
        return "?"
    for unit, scale in (("TB", 10**12), ("GB", 10**9), ("MB", 10**6), ("kB", 10**3)):
        if abs(value) >= scale:
            return f"{value / scale:.1f} {unit}"
    return f"{value} B"


@dataclass(frozen=True)
class NodeAlarm:
    """One resource alarm on one node."""

    node: str
    resource: Resource
    value: int | None  # memory used, or disk free
    limit: int | None  # the memory limit (high watermark), or the free-disk limit

    @property
    def usage(self) -> str:
        """``1.2 GB used, limit 0.8 GB`` / ``20.0 MB free, limit 50.0 MB``."""
        if self.resource == "memory":
            return f"{size_text(self.value)} used, limit {size_text(self.limit)}"
        return f"{size_text(self.value)} free, limit {size_text(self.limit)}"

    @property
    def text(self) -> str:
        """One line: which node, which resource, usage, and what it means."""
        return (
            f"{self.resource} alarm on node {self.node} ({self.usage}): the broker blocks every "
            "publishing connection of the cluster until it clears"
        )

    @property
    def fix(self) -> str:
        """What the operator does about it."""
        if self.resource == "memory":
            free = "free memory: let consumers drain the backlog, move a big parking lane to a file"
        else:
            free = f"free disk on {self.node} (the alarm clears once free space is above the limit)"
        return f"{free}; `rabbitmq-diagnostics -n {self.node} alarms` shows it ({RUNBOOK})"

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready form."""
        key = "mem_used" if self.resource == "memory" else "disk_free"
        limit = "mem_limit" if self.resource == "memory" else "disk_free_limit"
        return {
            "node": self.node,
            "resource": self.resource,
            key: self.value,
            limit: self.limit,
            "message": self.text,
        }


def node_alarms(nodes: list[NodeView] | None) -> list[NodeAlarm]:
    """Every alarm on every node, by node name (memory before disk)."""
    found: list[NodeAlarm] = []
    for node in sorted(nodes or [], key=lambda n: n.name):
        if node.mem_alarm:
            found.append(NodeAlarm(node.name, "memory", node.mem_used, node.mem_limit))
        if node.disk_free_alarm:
            found.append(NodeAlarm(node.name, "disk", node.disk_free, node.disk_free_limit))
    return found


__all__ = ["RUNBOOK", "NodeAlarm", "Resource", "node_alarms", "size_text"]

"""Doctor checks of the cluster's nodes (docs/doctor.md: broker-alarm).

They read ``/api/nodes``, which needs the management user's monitoring tag: without it they
are skipped, saying so, not passed."""

from __future__ import annotations

from rmqkit.health.alarms import node_alarms
from rmqkit.health.findings import CheckSkipped, DoctorInput, Finding

NODES_UNREADABLE = (
    "the management user may not read /api/nodes (it needs the monitoring tag): "
    "node alarms and cluster size are unknown"
)


# --- broker-alarm ------------------------------------------------------------------------------
def broker_alarm(inp: DoctorInput) -> list[Finding]:
    """A memory or disk alarm on any node blocks every publisher of the cluster: critical."""
    if inp.snapshot.nodes is None:
        raise CheckSkipped(NODES_UNREADABLE)
    return [
        Finding("broker-alarm", "critical", "node", alarm.node, alarm.text, alarm.fix)
        for alarm in node_alarms(inp.snapshot.nodes)
    ]


__all__ = ["NODES_UNREADABLE", "broker_alarm"]

"""Doctor checks of the cluster's nodes and where quorum queues live on them (docs/doctor.md:
broker-alarm, quorum-members).

Node alarms come from ``/api/nodes``, which needs the management user's monitoring tag:
without it broker-alarm is skipped, saying so, not passed, and quorum-members judges only what
``/api/queues`` shows (members and which are online), not the cluster's size."""

from __future__ import annotations

from rmqkit.health.alarms import node_alarms
from rmqkit.health.checks.common import plain_queues
from rmqkit.health.findings import CheckSkipped, DoctorInput, Finding
from rmqkit.health.quorum import RUNBOOK, intended_size, quorum_state

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


# --- quorum-members ----------------------------------------------------------------------------
def quorum_members(inp: DoctorInput) -> list[Finding]:
    """Per quorum queue: critical without a majority of its members online (no leader: it
    takes nothing and delivers nothing); warning with a member offline (one node loss less
    from stopping) or with fewer members than it is meant to have (on fewer nodes than the
    cluster, and than its initial group size: it tolerates fewer node losses than intended)."""
    nodes = inp.snapshot.nodes
    cluster = len(nodes) if nodes else None
    states = [(q, quorum_state(q)) for q in plain_queues(inp) if q.type == "quorum"]
    if states and all(state is None for _, state in states):
        raise CheckSkipped("the broker does not report quorum queue members (no stats yet?)")
    found: list[Finding] = []
    vhost = inp.snapshot.vhost
    for queue, state in states:
        if state is None:
            continue
        members = ", ".join(state.members)
        if not state.has_majority:
            found.append(
                Finding(
                    "quorum-members",
                    "critical",
                    "queue",
                    queue.name,
                    f"{len(state.members) - len(state.offline)} of {len(state.members)} members "
                    f"online (offline: {', '.join(state.offline)}), a majority is "
                    f"{state.majority}: no leader, publishes are not confirmed and deliveries stop",
                    "bring the offline nodes back; do not delete or recreate the queue, its "
                    f"messages are on the offline members ({RUNBOOK})",
                )
            )
            continue
        if state.offline:
            found.append(
                Finding(
                    "quorum-members",
                    "warning",
                    "queue",
                    queue.name,
                    f"member(s) offline: {', '.join(state.offline)} ({len(state.online)} of "
                    f"{len(state.members)} online, leader {state.leader or 'none'}): losing "
                    f"{len(state.online) - state.majority + 1} more node(s) stops the queue",
                    "bring the node back; if it is gone for good, replace its member: "
                    f"`rabbitmq-queues delete_member --vhost '{vhost}' '{queue.name}' NODE` then "
                    f"`rabbitmq-queues add_member --vhost '{vhost}' '{queue.name}' NEW_NODE`",
                )
            )
        if cluster is None or nodes is None:
            continue
        wanted = intended_size(queue, cluster)
        if len(state.members) < wanted:
            missing = [n.name for n in nodes if n.name not in state.members]
            found.append(
                Finding(
                    "quorum-members",
                    "warning",
                    "queue",
                    queue.name,
                    f"members on {len(state.members)} of the cluster's {cluster} nodes "
                    f"({members}), meant to have {wanted}: it survives fewer node losses "
                    "(declared while nodes were missing, or a member was removed)",
                    "add a member on another node: "
                    + "; ".join(
                        f"`rabbitmq-queues add_member --vhost '{vhost}' '{queue.name}' '{node}'`"
                        for node in missing[: wanted - len(state.members)]
                    ),
                )
            )
    return found


__all__ = ["NODES_UNREADABLE", "broker_alarm", "quorum_members"]

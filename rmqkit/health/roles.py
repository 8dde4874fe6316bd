"""Each queue's role in the work → wait → parking pattern, derived from a broker snapshot."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Literal

from rmqkit import names
from rmqkit.broker.snapshot import Snapshot
from rmqkit.health.delayed import ladder_target, rung_names

Role = Literal["work", "wait", "parking", "archive", "delay", "other"]


def classify(
    snapshot: Snapshot, known: dict[str, tuple[Role, str]] | None = None
) -> dict[str, tuple[Role, str]]:
    """Each queue's role and the work queue it belongs to (itself for work queues).

    ``known`` (from a topology file) wins. Otherwise: a *parking* queue is named ``*.parking``
    or is a dead-letter target that dead-letters nowhere itself; a *wait* queue has a message
    TTL and dead-letters to a queue that is not parking (back to its work queue); a *work*
    queue dead-letters into a parking queue.
    """
    roles: dict[str, tuple[Role, str]] = {}
    rungs = rung_names(snapshot)
    targets = {name: snapshot.dead_letter_targets(q) for name, q in snapshot.queues.items()}
    # what a ladder's rungs deliver into are its targets (work queues, or plain queues that
    # dead-letter nowhere), not parking queues
    dl_targets = {t for name, found in targets.items() if name not in rungs for t in (found or [])}
    parking = {
        name
        for name, q in snapshot.queues.items()
        if names.is_parking_name(name) or (name in dl_targets and q.dead_letter_exchange is None)
    }
    for name, queue in snapshot.queues.items():
        found = targets[name] or []
        if name in rungs:
            base = rungs[name]
            roles[name] = ("delay", ladder_target(base, snapshot, rungs) or base)
        elif name in parking:
            roles[name] = ("parking", name)
        elif names.archived_from(name) in parking:
            roles[name] = ("archive", name)  # its owner: set below, once parking's is known
        elif found and not (set(found) & parking) and "message-ttl" in queue.settings:
            roles[name] = ("wait", found[0])
        elif set(found) & parking:
            roles[name] = ("work", name)
        else:
            roles[name] = ("other", name)
    # A parking queue belongs to the work queue that dead-letters into it (the first, sorted).
    for name, (role, _) in sorted(roles.items()):
        if role == "work":
            for target in targets[name] or []:
                if target in parking and roles[target][1] == target:
                    roles[target] = ("parking", name)
    for name, (role, _) in roles.items():
        if role == "archive":
            roles[name] = ("archive", roles[names.archived_from(name) or name][1])
    roles.update({name: value for name, value in (known or {}).items() if name in roles})
    return roles


def flow_parent(owner: str, roles: dict[str, tuple[Role, str]], queues: Iterable[str]) -> str:
    """The work queue ``W`` a lane (``W.lane.x``) or partition (``W.pI``) queue serves, for
    grouping (issue 15): when ``W`` is a work queue or, partitioned (no queue of its own),
    ``W.parking`` exists. Any other name is returned as it is. (``classify`` itself keeps
    each lane and partition its own work queue, as a topology's expansion does.)"""
    parent = names.flow_parent(owner)
    if parent is None:
        return owner
    if roles.get(parent, ("other", ""))[0] == "work" or names.parking_queue(parent) in queues:
        return parent
    return owner

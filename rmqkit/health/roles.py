"""Each queue's role in the work → wait → parking pattern, derived from a broker snapshot."""

from __future__ import annotations

from typing import Literal

from rmqkit.broker.snapshot import Snapshot

Role = Literal["work", "wait", "parking", "other"]


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
    targets = {name: snapshot.dead_letter_targets(q) for name, q in snapshot.queues.items()}
    dl_targets = {t for found in targets.values() for t in (found or [])}
    parking = {
        name
        for name, q in snapshot.queues.items()
        if name.endswith(".parking") or (name in dl_targets and q.dead_letter_exchange is None)
    }
    for name, queue in snapshot.queues.items():
        found = targets[name] or []
        if name in parking:
            roles[name] = ("parking", name)
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
    roles.update({name: value for name, value in (known or {}).items() if name in roles})
    return roles

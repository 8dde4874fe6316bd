"""Orphans: rmqkit-made objects a topology no longer names, found by the names rmqkit derives
from a work queue (and where their dead-lettering leads). Reported by ``plan``, never deleted."""

from __future__ import annotations

import shlex
from typing import Any

from rmqkit.names import PARTITION_EXCHANGE_SUFFIX, is_derived_suffix, is_flow_member
from rmqkit.topology.desired import POLICY_PREFIX, DesiredState
from rmqkit.topology.live import Change, LiveState, queue_settings
from rmqkit.topology.partitions import CONSISTENT_HASH, MODULUS_HASH


def _family_owner(name: str, roots: set[str]) -> str | None:
    """The file's work queue whose derived queue ``name`` is, by its name alone: a wait queue
    (``W.wait.5s``, ``W.wait.5s.slot-2500ms``), a lane (``W.lane.L``, ``W.lane.L.wait.…``) or a
    partition (``W.pN``, ``W.pN.wait.…``) of a work queue ``W`` of the file (``roots``), if
    any. ``orders.wait.list`` has no delay where a wait queue has one: not ``orders``'."""
    for root in sorted(roots, key=len, reverse=True):
        if name.startswith(root + ".") and is_derived_suffix(name[len(root) :]):
            return root
    return None


def _family_member(target: str, root: str) -> bool:
    """``target`` is ``root`` itself or one of its lanes or partitions (a queue that a wait
    queue of ``root``'s family returns messages to)."""
    return is_flow_member(target, root)


def _dead_letters_home(settings: dict[str, Any], root: str, parkings: set[str]) -> bool:
    """Whether a queue that dead-letters with ``settings`` (its managed settings, or a policy
    definition) belongs to ``root``'s family: a wait queue returns to a member, a lane or
    partition parks in ``root``'s parking queue. Without dead-letter settings the name decides.
    A work queue of another file named like a derived queue (``orders.wait.list`` beside
    ``orders``) dead-letters into its own parking queue: not ours."""
    target = settings.get("dead-letter-routing-key")
    if not isinstance(target, str):
        return True
    return _family_member(target, root) or target in parkings


def find_orphans(desired: DesiredState, live: LiveState, vhost: str) -> list[Change]:
    """rmqkit-made objects the file no longer names: reported, never deleted (they may hold
    messages, and a wait queue without its policy would keep them forever). Their fixes name
    the vhost (``-p``) and quote for the shell, so they can be pasted as they are.

    Ownership follows the names rmqkit derives: a file owns its work queues and the queues
    derived from them — wait queues (``W.wait.…``), lanes (``W.lane.L``) and partitions
    (``W.pN``) with their wait queues, the partition exchange ``W.partition`` — and the
    policies ``rmqkit.<those>``. An object derived from another work queue belongs to whichever
    topology declares that work queue (another file in the same vhost), so it is never this
    file's orphan; nor is a queue whose dead-lettering leads out of ``W``'s family (another
    file's work queue that merely starts with ``W.wait.``). The name is the marker: it needs
    nothing added to a queue (x-arguments cannot change on a live queue) and works with
    ``--via arguments``.
    """
    where = f"-p {shlex.quote(vhost or '/')}"
    wanted_queues = {q.name for q in desired.queues} | {q.name for q in desired.fixed_queues}
    wanted_policies = {p.name for p in desired.policies}
    roots = {w.name for w in desired.work_queues}
    parkings: dict[str, set[str]] = {}
    for w in desired.work_queues:
        parkings.setdefault(w.name, set()).add(w.parking)
    out: list[Change] = []
    for name, queue in sorted(live.queues.items()):
        owner = _family_owner(name, roots)
        if not owner or name in wanted_queues:
            continue
        if not _dead_letters_home(queue_settings(live, name), owner, parkings[owner]):
            continue
        out.append(
            Change(
                "queue",
                name,
                "orphan",
                f"no longer in the file; left in place with {queue.get('messages', 0)} "
                f"message(s), which still return to {owner}",
                f"delete it once empty: rabbitmqctl delete_queue {where} {shlex.quote(name)}",
            )
        )
    for work in desired.work_queues:
        if work.partitions and work.name in live.queues:
            out.append(
                Change(
                    "queue",
                    work.name,
                    "orphan",
                    f"{work.name} is partitioned now ({work.partition_exchange}); this queue "
                    f"holds {live.queues[work.name].get('messages', 0)} message(s) and still gets "
                    "new ones through its old bindings",
                    "unbind it from its exchanges, let a consumer drain it, then: rabbitmqctl "
                    f"delete_queue {where} {shlex.quote(work.name)}",
                )
            )
    wanted_exchanges = {e.name for e in desired.exchanges}
    for name, exchange in sorted(live.exchanges.items()):
        owner = name.removesuffix(PARTITION_EXCHANGE_SUFFIX)
        if (
            owner in roots
            and name != owner
            and name not in wanted_exchanges
            and exchange.get("type") in (CONSISTENT_HASH, MODULUS_HASH)
        ):
            out.append(
                Change(
                    "exchange",
                    name,
                    "orphan",
                    f"no longer in the file ({owner} is not partitioned now); messages "
                    "published to it still go to the partitions it is bound to",
                    "delete it once nothing publishes to it: rabbitmqadmin "
                    f"--vhost={shlex.quote(vhost or '/')} delete exchange "
                    f"name={shlex.quote(name)}",
                )
            )
    if desired.via == "policy":
        for name in sorted(live.policies):
            governed = name.removeprefix(POLICY_PREFIX)
            owner = _family_owner(governed, roots)
            if not name.startswith(POLICY_PREFIX) or name in wanted_policies or owner is None:
                continue
            definition = dict(live.policies[name].get("definition") or {})
            if not _dead_letters_home(definition, owner, parkings[owner]):
                continue
            out.append(
                Change(
                    "policy",
                    name,
                    "orphan",
                    "no longer in the file; left in place so the queue it governs keeps "
                    "its TTL and dead-letter wiring",
                    f"delete it after its queue: rabbitmqctl clear_policy {where} "
                    f"{shlex.quote(name)}",
                )
            )
    return out

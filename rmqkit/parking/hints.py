"""Fix hints the parking commands print: safe to paste as they are.

Each names the vhost (``-p``), quotes for the shell, uses a regex that matches exactly the
queue (anchored, escaped), and never replaces a policy in effect: only the highest-priority
policy applies to a queue, so a new policy of higher priority must carry what the old one set
(rmqkit's own dead-letter wiring included)."""

from __future__ import annotations

import json
import re
import shlex

from rmqkit.broker.policies import Policy
from rmqkit.topology.desired import POLICY_PREFIX


def limit_fix(
    queue: str,
    source: str,
    vhost: str,
    policy: Policy | None,
    version: tuple[int, int, int],
    *,
    ours: Policy | None = None,
) -> str:
    """A fix that can be pasted: names the vhost, a regex that matches exactly ``queue``, and
    keeps what the policy in effect sets (only one policy applies to a queue, so a new one
    of higher priority replaces it whole: rmqkit's own dead-letter wiring included).

    ``ours`` is rmqkit's own policy for the queue, if one was declared. `rmqkit declare` is
    offered only where it can be the fix: never while a user policy is in effect, since
    declare refuses a queue whose policy outranks rmqkit's (a conflict, exit 65)."""
    if source.startswith("operator policy"):
        return (
            f"{source} sets it, and an operator policy's limit wins over a user policy's -1: "
            "ask the operator to exclude this queue from its pattern"
        )
    if source.startswith("its x-delivery-limit"):
        return (
            "the argument is fixed at declaration: declare a parking queue with `rmqkit declare`, "
            f"move the messages there (shovel), then delete {queue!r}"
        )
    definition = {k: v for k, v in (policy.definition if policy else {}).items()}
    if version >= (4, 0, 0):
        definition["delivery-limit"] = -1
    else:  # 3.x refuses -1 (and sets no default): no delivery-limit key means no limit
        definition.pop("delivery-limit", None)
    pattern = "^" + re.escape(queue) + "$"
    name = f"no-delivery-limit.{queue}"  # not rmqkit.*: `plan` would call it an orphan
    priority = (policy.priority if policy else 0) + 1
    command = (
        f"rabbitmqctl set_policy -p {shlex.quote(vhost or '/')} {shlex.quote(name)} "
        f"{shlex.quote(pattern)} {shlex.quote(json.dumps(definition, sort_keys=True))} "
        f"--apply-to queues --priority {priority}"
    )
    if policy is not None and not policy.name.startswith(POLICY_PREFIX):
        if ours is not None:
            why = (
                f"policy {policy.name!r} (priority {policy.priority}) outranks rmqkit's "
                f"{ours.name!r} (priority {ours.priority}), so `rmqkit declare` refuses this "
                "queue (exit 65)"
            )
        else:
            why = f"policy {policy.name!r} (priority {policy.priority}), not rmqkit's, is in effect"
        return (
            f"{why}: {command} (keeps what policy {policy.name!r} sets), or change policy "
            f"{policy.name!r} itself to leave this queue out (its pattern) or set no "
            "delivery-limit (rabbitmqctl set_policy, or the management UI's Admin > Policies)"
        )
    return (
        "`rmqkit declare` the topology file that declares it (rmqkit's parking policy sets no "
        f"delivery limit), or: {command}"
        + (f" (keeps what policy {policy.name!r} sets)" if policy else "")
    )


__all__ = ["limit_fix"]

"""What `rmqkit doctor --dedupe DSN` reads for the ``dedupe-window-short`` check: the store's
retention window (``rmqkit.idempotency.dedupe_status``) and each work queue's longest retry
path, from the topology file or, without one, from the broker's wait queues."""

from __future__ import annotations

import asyncio

from rmqkit.broker.snapshot import Snapshot
from rmqkit.consumer.config import DEFAULT_MAX_ATTEMPTS, policy_from_topology
from rmqkit.consumer.policy import QueuePolicy
from rmqkit.consumer.wiring import policy_from_snapshot
from rmqkit.errors import ConfigError
from rmqkit.health.findings import DedupeWindow
from rmqkit.health.roles import Role
from rmqkit.idempotency import dedupe_status, format_window
from rmqkit.topology import Topology


def retry_path_s(policy: QueuePolicy) -> float:
    """The longest a transiently failing message can spend in retries, in seconds: every
    retry in the longest tier (a handler may ask for a delay, and gets the tier that fits)."""
    if not policy.retry_delays_ms:
        return 0.0
    return (policy.effective_max_attempts - 1) * max(policy.retry_delays_ms) / 1000


def _path(policy: QueuePolicy, attempts_from: str) -> tuple[float, str]:
    retries = policy.effective_max_attempts - 1
    longest = format_window(max(policy.retry_delays_ms, default=0) / 1000)
    how = f"{retries} retries ({attempts_from}), each up to the longest tier {longest}"
    return retry_path_s(policy), how


def retry_paths(
    snapshot: Snapshot, roles: dict[str, tuple[Role, str]], topology: Topology | None
) -> dict[str, tuple[float, str]]:
    """Each work queue's longest retry path and how it was computed."""
    paths: dict[str, tuple[float, str]] = {}
    if topology is not None:
        # Every queue a consumer serves: lanes and partitions too, a partitioned parent
        # (no queue on the broker) not.
        for name in sorted(topology.work_queue_names()):
            spec = topology.queue_spec(name)
            policy = policy_from_topology(topology, name, None)
            paths[name] = _path(policy, f"max_attempts {spec.max_attempts} in the topology")
        return paths
    for name, (role, _) in sorted(roles.items()):
        if role != "work":
            continue
        try:
            policy, _ = policy_from_snapshot(snapshot, name, None)
        except ConfigError:  # no parking queue through the default exchange: not rmqkit's lane
            continue
        attempts = f"max_attempts {DEFAULT_MAX_ATTEMPTS}, the consumer default"
        paths[name] = _path(policy, attempts)
    return paths


async def read_dedupe_window(
    dsn: str,
    replay_horizon_s: float | None,
    snapshot: Snapshot,
    roles: dict[str, tuple[Role, str]],
    topology: Topology | None,
) -> DedupeWindow:
    """The check's input; the store is read in a thread (its driver blocks)."""
    status = await asyncio.to_thread(dedupe_status, dsn)
    return DedupeWindow(
        store=status.dsn,
        window_s=status.window_s,
        replay_horizon_s=replay_horizon_s,
        retry_paths=retry_paths(snapshot, roles, topology),
    )


__all__ = ["read_dedupe_window", "retry_path_s", "retry_paths"]

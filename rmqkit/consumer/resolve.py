"""A consumer's configuration from its queue, flags, topology file and the broker's wiring.

``resolve_config`` is what ``rmqkit consume`` and the embedded ``rmqkit.Consumer`` both run
before consuming: the queue's lanes or partitions (rmqkit.consumer.lanes), each checked
(rmqkit.consumer.wiring: a wiring in effect that would drop or misroute messages is a
ConfigError, 78) and configured (rmqkit.consumer.config.build_config) like a work queue of
its own.
"""

from __future__ import annotations

from dataclasses import replace

from rmqkit.broker.management import management
from rmqkit.broker.snapshot import Snapshot
from rmqkit.consumer.config import (
    ConsumerConfig,
    ConsumerFlags,
    build_config,
    policy_from_topology,
    refuse_unlocated,
)
from rmqkit.consumer.lanes import Served, served_from_names, served_from_topology
from rmqkit.consumer.loading import LoadedHandler
from rmqkit.consumer.wiring import (
    check_wiring,
    consumer_timeout_s,
    policy_from_snapshot,
    read_wiring,
    wiring_warnings,
)
from rmqkit.errors import AccessRefused, BrokerUnavailable, UsageError
from rmqkit.settings import Settings
from rmqkit.topology.model import Topology

__all__ = ["check_arguments", "resolve_config"]


async def resolve_config(
    settings: Settings,
    loaded: LoadedHandler,
    queue: str,
    flags: ConsumerFlags,
    spec: Topology | None,
    *,
    unlocated: str | None = None,
) -> ConsumerConfig:
    """The consumer's configuration: QUEUE's, with its lanes or partitions as siblings
    (rmqkit.consumer.lanes), each checked and configured like a work queue of its own.

    Without a topology file the management API must answer (BrokerUnavailable 69,
    AccessRefused 77): the tiers and the parking target are read from the broker.
    ``unlocated`` (``rmqkit consume`` found no topology file; the text says where it looked):
    a queue that carries rmqkit wiring is refused (ConfigError 78) — its attempts and
    permanent errors are in a file, and the defaults would silently replace them."""
    # One management API snapshot: the settings in effect on every queue, to check the wiring
    # (and, without a topology, to read the tiers and parking target from).
    snapshot: Snapshot | None
    unchecked: str | None = None
    try:
        async with management(settings) as api:
            snapshot = await read_wiring(api)
    except (BrokerUnavailable, AccessRefused) as exc:
        if spec is None:
            raise
        # With a topology file consuming needs only AMQP; go on, but say what was not checked.
        snapshot = None
        unchecked = (
            f"could not check the queues' wiring through the management API ({exc}); "
            "a policy that removes a dead-letter route would go unnoticed"
        )
    if spec is None and unlocated is not None and snapshot is not None:
        refuse_unlocated(snapshot.queues, queue, unlocated)
    if spec is not None:
        served = served_from_topology(spec, queue)
    else:
        assert snapshot is not None
        served = served_from_names(snapshot.queues, queue)
    configs = [_one(loaded, one, flags, spec, snapshot) for one in served]
    config = configs[0]
    if unchecked is not None:
        config = replace(config, warnings=(*config.warnings, unchecked))
    return replace(config, siblings=tuple(configs[1:]))


def _one(
    loaded: LoadedHandler,
    served: Served,
    flags: ConsumerFlags,
    spec: Topology | None,
    snapshot: Snapshot | None,
) -> ConsumerConfig:
    """One served queue's configuration; a lane's own prefetch/concurrency replace the flags'."""
    queue, handler = served.queue, loaded.spec
    flags = replace(
        flags,
        prefetch=served.prefetch or flags.prefetch,
        concurrency=served.concurrency or flags.concurrency,
    )
    if snapshot is None:
        assert spec is not None
        policy = policy_from_topology(spec, queue, flags.max_attempts)
        return build_config(handler, queue, policy, flags, spec, loaded=loaded)
    if spec is not None:
        policy = policy_from_topology(spec, queue, flags.max_attempts)
        check_wiring(snapshot, policy)
        # The queue's consumer timeout (x-consumer-timeout or a policy) bounds the handler
        # timeout with a topology file too: the file does not say it, the broker does.
        timeout = consumer_timeout_s(snapshot, queue)
        config = build_config(
            handler, queue, policy, flags, spec, timeout, loaded, snapshot.version
        )
    else:
        policy, timeout = policy_from_snapshot(snapshot, queue, flags.max_attempts)
        check_wiring(snapshot, policy, discover_wait=True)
        config = build_config(
            handler, queue, policy, flags, None, timeout, loaded, snapshot.version
        )
    return replace(config, warnings=(*config.warnings, *wiring_warnings(snapshot, policy)))


def check_arguments(
    queue: str,
    prefetch: int | None,
    concurrency: int | None,
    max_attempts: int | None,
    handler_timeout_s: float | None,
    grace_s: float,
    start_timeout_s: float,
) -> None:
    """The limits ``rmqkit consume``'s options have, as UsageError naming the argument."""
    if not isinstance(queue, str) or not queue.strip():
        raise UsageError("queue must name the work queue to consume")
    if prefetch is not None and not 1 <= prefetch <= 65535:
        raise UsageError(f"prefetch must be 1-65535, not {prefetch!r}")
    for name, value in (("concurrency", concurrency), ("max_attempts", max_attempts)):
        if value is not None and value < 1:
            raise UsageError(f"{name} must be at least 1, not {value!r}")
    if handler_timeout_s is not None and not handler_timeout_s > 0:
        raise UsageError(f"handler_timeout_s must be above 0, not {handler_timeout_s!r}")
    if not grace_s >= 0:
        raise UsageError(f"grace_s must be 0 or more, not {grace_s!r}")
    if not start_timeout_s > 0:
        raise UsageError(f"start_timeout_s must be above 0, not {start_timeout_s!r}")

"""Which hash exchange a partitioned work queue gets, and when the broker's own is kept.

By a header (``partition_key``), only the ``rabbitmq_consistent_hash_exchange`` plugin can
hash it. By the routing key (``partition_by = "routing_key"``), RabbitMQ 4.3's built-in
``x-modulus-hash`` does, with no plugin; older brokers use the plugin's consistent hash, which
hashes the routing key when no ``hash-header`` is set. An exchange's type is fixed at
creation, and the two hashes put keys in different partitions, so a broker upgraded to 4.3
keeps the consistent-hash exchange it has (``keep_live_hashing``): switching would send a
key's new messages to another partition than its queued ones. Delete the exchange once the
partitions are drained, and ``declare`` creates the modulus hash.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from rmqkit.names import PARTITION_EXCHANGE_SUFFIX
from rmqkit.topology.desired import DesiredState, ExchangeSpec
from rmqkit.topology.schema import QueueModel

CONSISTENT_HASH = "x-consistent-hash"
MODULUS_HASH = "x-modulus-hash"
MODULUS_HASH_SINCE = (4, 3, 0)
KEPT_NOTE = (
    "kept: x-modulus-hash would move keys to other partitions; to switch, delete the exchange "
    "once the partitions are drained, then declare"
)


def partition_hashing(
    spec: QueueModel, broker_version: tuple[int, int, int]
) -> tuple[str, dict[str, Any]]:
    """The type and arguments of a partitioned queue's exchange on a broker of
    ``broker_version`` (for a queue that is not partitioned: what it would get)."""
    if spec.partition_by == "header":
        return CONSISTENT_HASH, {"hash-header": spec.partition_key}
    if broker_version >= MODULUS_HASH_SINCE:
        return MODULUS_HASH, {}
    return CONSISTENT_HASH, {}


def _kept(spec: ExchangeSpec, live: dict[str, Any] | None) -> bool:
    """A routing-key consistent hash on the broker where the file asks for the modulus hash:
    the same routing by key, only another spread of keys over the partitions."""
    return (
        live is not None
        and spec.type == MODULUS_HASH
        and spec.name.endswith(PARTITION_EXCHANGE_SUFFIX)
        and live.get("type") == CONSISTENT_HASH
        and not live.get("arguments")
        and live.get("durable", True) == spec.durable
        and live.get("auto_delete", False) == spec.auto_delete
        and live.get("internal", False) == spec.internal
    )


def keep_live_hashing(desired: DesiredState, exchanges: dict[str, Any]) -> DesiredState:
    """``desired`` with each partition exchange the broker already holds as a routing-key
    consistent hash kept as it is (type and summary), instead of a conflict with x-modulus-hash."""
    kept = {e.name for e in desired.exchanges if _kept(e, exchanges.get(e.name))}
    if not kept:
        return desired
    return replace(
        desired,
        exchanges=[
            replace(e, type=CONSISTENT_HASH) if e.name in kept else e for e in desired.exchanges
        ],
        work_queues=[
            replace(w, partition_exchange_type=CONSISTENT_HASH, partition_note=KEPT_NOTE)
            if w.partition_exchange in kept
            else w
            for w in desired.work_queues
        ],
    )

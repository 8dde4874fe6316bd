"""A topology as RabbitMQ definitions JSON (``rabbitmqctl import_definitions`` accepts it)."""

from __future__ import annotations

from typing import Any

from rmqkit.topology.desired import Via
from rmqkit.topology.expand import expand
from rmqkit.topology.model import Topology


def export_definitions(
    topology: Topology,
    *,
    vhost: str,
    broker_version: tuple[int, int, int],
    via: Via = "policy",
) -> dict[str, Any]:
    """The definitions document for ``topology`` in ``vhost``.

    Import skips objects that already exist without comparing their arguments, so this suits
    a fresh vhost; use ``rmqkit plan`` against a live one.
    """
    desired = expand(topology, via=via, broker_version=broker_version)
    return {
        "rabbit_version": ".".join(str(p) for p in broker_version),
        "queues": [
            {
                "name": q.name,
                "vhost": vhost,
                "durable": True,
                "auto_delete": False,
                "arguments": q.arguments(via),
            }
            for q in desired.all_queues()
        ],
        "exchanges": [
            {
                "name": e.name,
                "vhost": vhost,
                "type": e.type,
                "durable": e.durable,
                "auto_delete": e.auto_delete,
                "internal": e.internal,
                "arguments": e.arguments,
            }
            for e in desired.exchanges
        ],
        "bindings": [
            {
                "source": b.source,
                "vhost": vhost,
                "destination": b.destination,
                "destination_type": b.destination_type,
                "routing_key": b.routing_key,
                "arguments": b.arguments,
            }
            for b in desired.bindings
        ],
        "policies": [
            {
                "vhost": vhost,
                "name": p.name,
                "pattern": p.pattern,
                "apply-to": p.apply_to,
                "definition": p.definition,
                "priority": p.priority,
            }
            for p in desired.policies
        ],
    }

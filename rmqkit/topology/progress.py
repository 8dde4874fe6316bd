"""What of a topology the broker holds, by name only: the answer to a `declare` stopped midway.

A full plan compares every queue's settings with the policies in effect, which takes many
seconds on a topology of a few thousand objects; after Ctrl-C the user wants a line at once.
Existence is what an interrupted declare leaves undecided (it creates exchanges, then
policies, then queues, then bindings, in that order), so this reads the names the management API
lists and the names the file expands to, nothing more.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from rmqkit.broker.amqp import parse_version
from rmqkit.broker.management import management
from rmqkit.settings import Settings
from rmqkit.topology.desired import Via
from rmqkit.topology.expand import expand_all
from rmqkit.topology.model import Topology


@dataclass(frozen=True)
class Presence:
    """How many of a topology's objects exist, and the ones that do not, in declare order."""

    present: int
    missing: list[tuple[str, str]]  # (kind, name)

    @property
    def total(self) -> int:
        return self.present + len(self.missing)


async def topology_presence(
    settings: Settings, topology: Sequence[Topology], *, via: Via = "policy"
) -> Presence:
    """Which of ``topology``'s exchanges, policies, queues and bindings exist on the broker
    (management API; BrokerUnavailable when it does not answer). Names only: settings are what
    `rmqkit plan` compares."""
    async with management(settings) as api:
        overview = await api.overview()
        exchanges = {e["name"] for e in await api.exchanges()}
        policies = {p["name"] for p in await api.policies()} if via == "policy" else set()
        queues = {q["name"] for q in await api.queues()}
        bindings = {
            (b.get("source"), b.get("destination"), b.get("routing_key"))
            for b in await api.bindings()
        }
    version = parse_version(str(overview.get("rabbitmq_version") or "0.0.0"))
    desired = expand_all(list(topology), via=via, broker_version=version)
    wanted: list[tuple[str, str, bool]] = []
    wanted += [("exchange", e.name, e.name in exchanges) for e in desired.exchanges]
    if via == "policy":
        wanted += [("policy", p.name, p.name in policies) for p in desired.policies]
    wanted += [("queue", q.name, q.name in queues) for q in desired.all_queues()]
    wanted += [
        ("binding", b.label, (b.source, b.destination, b.routing_key) in bindings)
        for b in desired.bindings
    ]
    missing = [(kind, name) for kind, name, there in wanted if not there]
    return Presence(present=len(wanted) - len(missing), missing=missing)

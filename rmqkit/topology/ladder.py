"""The default delay ladder (rmqkit.delay) in a topology: declared with the file when a queue of
it has a ``delay``, with the exits that ``rmqkit publish`` and the outbox need for its messages.

The ladder is ``rmqkit.delay.Ladder()`` (100 ms unit, 20 rungs: up to 29 h), the one publish and
the outbox use; its objects are shared by every file of the vhost and never anyone's orphan.
"""

from __future__ import annotations

from rmqkit.delay import Ladder
from rmqkit.topology.model import Topology


def delay_targets(topology: Topology) -> list[tuple[str, str]]:
    """The ladder exits a file's delayed messages leave by, as ``(exchange, routing_key)``.

    A publisher targets either the exchange it publishes to (the message keeps its routing
    key, so the exchange routes it as if it were published now) or, for a lane, the default
    exchange and the lane queue; and ``rmqkit publish --exchange ''`` the work queue itself.
    So per queue with a ``delay``: the exchanges its ``bind`` entries name, the queue itself
    (not for a partitioned one, which is no queue: its hash exchange instead), and its lanes.
    """
    targets: list[tuple[str, str]] = []

    def add(target: tuple[str, str]) -> None:
        if target not in targets:
            targets.append(target)

    for name, spec in topology.model.queues.items():
        if spec.delay is None:
            continue
        for bind in spec.bind:
            add((bind.exchange, ""))
        exchange = topology.partition_exchange(name)
        add((exchange, "") if exchange else ("", name))
        for lane in topology.lanes_of(name):
            add(("", lane.queue))
    return targets


def default_ladder() -> Ladder:
    """The ladder publish, the outbox and declare agree on."""
    return Ladder()

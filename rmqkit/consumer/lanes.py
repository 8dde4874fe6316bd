"""One ``rmqkit consume --queue W`` serving several queues: W's lanes, or W's partitions.

A lane (``W.lane.NAME``, issue 15) holds W's large or slow messages; a partitioned W is N queues
``W.p0`` … (one active consumer each, by the broker's single-active-consumer). The consumer of W
serves them all: ``served_queues`` says which (from the topology file, or from the queues the
broker has when consume runs without one), and ``run_consumers`` runs one ``QueueConsumer`` per
queue in the worker, each with its own connection, channel, prefetch and handler slots. A lane
full of slow jobs therefore holds only its own prefetch window and its own handler slots: it can
never take the capacity of another lane or of W itself (the prefetch is the concurrency; see
rmqkit.consumer.dispatch). Nor can a lane's absence stop the others: a served queue deleted while
the consumer runs makes only its own QueueConsumer wait for it (rmqkit.consumer.runner).
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from rmqkit.consumer.runner import QueueConsumer
from rmqkit.names import is_lane_of, partition_index
from rmqkit.topology.model import Topology

__all__ = ["Served", "run_consumers", "served_from_names", "served_from_topology"]


@dataclass(frozen=True)
class Served:
    """One queue a consumer of a work queue serves, and its own limits (None: the work
    queue's, i.e. the flags' or the topology's)."""

    queue: str
    prefetch: int | None = None
    concurrency: int | None = None


def served_from_topology(topology: Topology, queue: str) -> list[Served]:
    """What ``consume --queue QUEUE`` serves by the file: a partitioned work queue's partitions
    (p0 first; the parent is no queue), else the work queue then its lanes in file order. A
    lane or partition queue named on its own is served alone."""
    if queue not in topology.model.queues:
        return [Served(queue)]
    partitions = topology.partitions_of(queue)
    if partitions:
        return [Served(name) for name in partitions]
    lanes = topology.model.queues[queue].lanes
    return [
        Served(queue),
        *(
            Served(lane.queue, lanes[lane.name].prefetch, lane.concurrency)
            for lane in topology.lanes_of(queue)
        ),
    ]


def served_from_names(names: Iterable[str], queue: str) -> list[Served]:
    """The same without a topology file, from the names of the vhost's queues: ``QUEUE.pI``
    when QUEUE itself does not exist, else QUEUE and its ``QUEUE.lane.NAME`` queues."""
    names = set(names)
    parts = sorted((index, n) for n in names if (index := partition_index(n, queue)) is not None)
    if queue not in names and parts:
        return [Served(name) for _, name in parts]
    return [Served(queue), *(Served(n) for n in sorted(names) if is_lane_of(n, queue))]


async def run_consumers(consumers: Sequence[QueueConsumer]) -> None:
    """Run every consumer until all have stopped. One that ends by itself (a fatal error, or a
    recycle after stuck handlers) stops the others gracefully; its error is raised then."""
    if len(consumers) == 1:
        await consumers[0].run()
        return
    tasks = [asyncio.create_task(c.run(), name=f"consume {c.config.queue}") for c in consumers]
    try:
        await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
        for consumer in consumers:
            consumer.stop()
        await asyncio.gather(*tasks, return_exceptions=True)
        for task in tasks:
            error = task.exception() if not task.cancelled() else None
            if error is not None:
                raise error
    finally:
        for task in tasks:
            if not task.done():
                task.cancel()

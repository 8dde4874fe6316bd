"""``RmqkitBroker``: a throwaway vhost on a real broker for a user's integration tests.

Behind the ``rmqkit_broker`` fixture (rmqkit.testing.plugin). Every method is synchronous (each
runs its own short event loop), so it is called from ordinary test functions; the consumer runs
in the calling process, through ``rmqkit.Consumer``, the consumer of ``rmqkit consume``.
"""

from __future__ import annotations

import asyncio
import os
import uuid
from collections.abc import Callable, Coroutine, Mapping
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import unquote, urlsplit

from rmqkit.broker.codec import Properties
from rmqkit.broker.management import management
from rmqkit.broker.session import Outcome, session
from rmqkit.errors import DataError, UsageError
from rmqkit.parking.model import ParkedFilter, ParkedMessage
from rmqkit.parking.ops import list_parked
from rmqkit.settings import Settings
from rmqkit.topology import declare_topology, load_topology
from rmqkit.topology.model import Topology

__all__ = ["VHOST_PREFIX", "RmqkitBroker"]

T = TypeVar("T")
VHOST_PREFIX = "rmqkit-pytest-"
_POLL_S = 0.05


def _run(coro: Coroutine[Any, Any, T]) -> T:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coro)
    coro.close()
    raise UsageError(
        "rmqkit_broker's methods are synchronous and were called inside a running event loop; "
        "call them from a plain `def` test"
    )


class RmqkitBroker:
    """One vhost of its own on the broker of ``base`` (created by ``open()``, deleted with
    everything in it by ``close()``), with the topology declared in it and helpers to publish,
    consume and look into parking."""

    def __init__(self, base: Settings) -> None:
        self.vhost = f"{VHOST_PREFIX}{uuid.uuid4().hex[:12]}"
        self._base = base
        self.settings = base.for_vhost(self.vhost)
        self.topologies: list[Topology] = []
        self._opened = False

    # --- the vhost ---------------------------------------------------------------------------
    def open(self) -> RmqkitBroker:
        """Create the vhost (management API) with full permissions for the URL's user."""
        user = unquote(urlsplit(self._base.amqp_urls[0]).username or "guest")

        async def create() -> None:
            async with management(self._base) as api:
                await api.create_vhost(self.vhost, user)

        self._opened = True  # set first: a half-created vhost is deleted too
        _run(create())
        return self

    def close(self) -> None:
        """Delete the vhost and everything in it (connections to it are closed by the broker)."""
        if not self._opened:
            return

        async def delete() -> None:
            async with management(self._base) as api:
                await api.delete_vhost(self.vhost)

        _run(delete())
        self._opened = False

    # --- topology and messages ---------------------------------------------------------------
    def declare(self, topology: str | os.PathLike[str] | Topology) -> Topology:
        """Declare a topology file (or a loaded Topology) in the vhost, as ``rmqkit declare``."""
        loaded = topology if isinstance(topology, Topology) else load_topology(Path(topology))
        _run(declare_topology(self.settings, loaded))
        self.topologies.append(loaded)
        return loaded

    def publish(
        self,
        exchange: str,
        routing_key: str,
        body: bytes | str,
        message_id: str | None = None,
        headers: Mapping[str, Any] | None = None,
        *,
        content_type: str | None = None,
    ) -> str:
        """Publish one persistent message (confirmed, mandatory) and return its message_id
        (a new one when None). DataError when the broker returns it (routed nowhere) or nacks."""
        raw = body.encode("utf-8") if isinstance(body, str) else bytes(body)
        message_id = message_id if message_id is not None else uuid.uuid4().hex
        properties = Properties(
            message_id=message_id,
            headers=dict(headers) if headers else None,
            delivery_mode=2,
            content_type=content_type,
        )

        async def send() -> Outcome:
            async with session(self.settings, name="rmqkit_broker publish") as amqp:
                channel = await amqp.channel(confirms=True)
                try:
                    settled = await channel.publisher.publish(
                        raw, exchange=exchange, routing_key=routing_key, properties=properties
                    )
                    return await settled
                finally:
                    await channel.close()

        outcome = _run(send())
        if outcome is not Outcome.CONFIRMED:
            raise DataError(
                f"publish to exchange {exchange!r} with routing key {routing_key!r} was "
                f"{outcome.value} by the broker"
            )
        return message_id

    def depths(self, *queues: str) -> dict[str, int]:
        """Ready messages of ``queues`` (default: every queue the declared topologies made),
        by passive declare: exact at once, unlike the management API's figures."""
        names = list(queues) or self._declared_queues()

        async def read() -> dict[str, int]:
            async with session(self.settings, name="rmqkit_broker depths") as amqp:
                return {name: (await amqp.queue_depth(name)).ready for name in names}

        return _run(read())

    def parked(self, queue: str) -> list[ParkedMessage]:
        """The messages in the parking queue of work queue ``queue`` (or in ``queue`` itself
        when it is a parking queue), left where they are, oldest first."""
        target = self._parking_of(queue)
        found: list[ParkedMessage] = []
        _run(list_parked(self.settings, target, ParkedFilter(), found.append))
        return found

    # --- consuming ---------------------------------------------------------------------------
    def consume_until_idle(
        self,
        handler: Callable[..., Any] | str,
        queue: str,
        *,
        idle_s: float = 0.5,
        timeout_s: float = 30.0,
        waiting: bool = True,
        **options: Any,
    ) -> int:
        """Run the real consumer on ``queue`` until it is idle: the queue empty, nothing in
        flight, and (``waiting``) the queue's retry wait queues empty too, for ``idle_s`` in a
        row. Returns the deliveries it settled. ``options``: rmqkit.Consumer's keywords
        (``max_attempts``, ``handler_timeout_s``, ``permanent_errors``, ...).

        TimeoutError when it is not idle within ``timeout_s`` (the consumer is stopped first).
        """
        if idle_s <= 0 or timeout_s <= 0:
            raise UsageError("idle_s and timeout_s must be above 0")
        topology = self._topology_of(queue)
        watched = [queue]
        if waiting and topology is not None:
            from rmqkit.consumer.config import policy_from_topology

            watched += policy_from_topology(topology, queue, None).all_wait_queues
        return _run(
            _consume_until_idle(
                self.settings, handler, queue, topology, watched, idle_s, timeout_s, options
            )
        )

    # --- helpers -----------------------------------------------------------------------------
    def _topology_of(self, queue: str) -> Topology | None:
        for topology in self.topologies:
            if topology.parent_of(queue) is not None:
                return topology
        return None

    def _parking_of(self, queue: str) -> str:
        topology = self._topology_of(queue)
        return topology.parking_name(queue) if topology is not None else queue

    def _declared_queues(self) -> list[str]:
        from rmqkit.topology.expand import expand

        names: list[str] = []
        for topology in self.topologies:
            names += [q.name for q in expand(topology).all_queues()]
        return list(dict.fromkeys(names))


def embedded_consumer(
    settings: Settings,
    handler: Callable[..., Any] | str,
    queue: str,
    topology: Topology | None,
    options: Mapping[str, Any],
) -> Any:
    """The in-process consumer ``consume_until_idle`` runs: ``rmqkit.Consumer``, the one
    ``rmqkit consume``'s workers run (the one place to change to run another)."""
    from rmqkit.consumer.embedded import Consumer

    return Consumer(handler, queue=queue, topology=topology, settings=settings, **options)


def _in_flight(consumer: Any) -> int:
    # The consumer's gauge of handlers running now (what /metrics serves as in_flight).
    metrics = consumer.metrics
    return int(getattr(metrics, "_in_flight", 0)) if metrics is not None else 0


async def _consume_until_idle(
    settings: Settings,
    handler: Callable[..., Any] | str,
    queue: str,
    topology: Topology | None,
    watched: list[str],
    idle_s: float,
    timeout_s: float,
    options: Mapping[str, Any],
) -> int:
    options = {"grace_s": 5.0, **options}
    consumer = embedded_consumer(settings, handler, queue, topology, options)
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    await consumer.start()
    try:
        async with session(settings, name="rmqkit_broker watch") as amqp:
            idle_since: float | None = None
            last_processed = -1
            while True:
                now = loop.time()
                busy = _in_flight(consumer) > 0
                if not busy:
                    for name in watched:
                        try:
                            if (await amqp.queue_depth(name)).ready:
                                busy = True
                                break
                        except DataError:
                            continue  # a wait queue the broker does not have: nothing waits
                processed = consumer.processed
                if busy or processed != last_processed:
                    idle_since = None
                    last_processed = processed
                elif idle_since is None:
                    idle_since = now
                elif now - idle_since >= idle_s:
                    return int(processed)
                if now >= deadline:
                    raise TimeoutError(
                        f"{queue!r} not idle after {timeout_s:g}s ({processed} settled; "
                        "messages still ready, waiting or in flight)"
                    )
                await asyncio.sleep(_POLL_S)
    finally:
        await consumer.stop()

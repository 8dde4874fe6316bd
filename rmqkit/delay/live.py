"""The delay ladder on a live broker: declare it (and its exits), count what it holds.

Through ``rmqkit.broker.session`` only (no client import here)::

    ladder = Ladder()                                     # rmqkit.delay.100ms…, 20 rungs
    async with session(settings) as s:
        await declare_ladder(s, ladder, targets=[("orders", "")])
        plan = ladder.plan(90_000, "orders", "order.created", headers, expiration=None)
        channel = await s.channel(confirms=True)
        await (await channel.publisher.publish(body, exchange=plan.exchange,
                                               routing_key=plan.routing_key,
                                               properties=Properties(headers=plan.headers, …)))
        print(await delayed_counts(s, ladder))           # {'rmqkit.delay.100ms.00-100ms': 0, …}
"""

from __future__ import annotations

from collections.abc import Iterable

from rmqkit.broker.session import Session
from rmqkit.delay.ladder import Ladder


async def declare_ladder(
    session: Session, ladder: Ladder, targets: Iterable[tuple[str, str]] = ()
) -> None:
    """Declare every exchange, rung and binding of ``ladder`` and the exits to ``targets``
    (``(exchange, routing_key)``; the routing key matters only for the default exchange).
    Idempotent. A rung declared earlier with other arguments is a TopologyConflict (65)."""
    await session.declare(*ladder.objects(targets).declare_kwargs())


async def declare_target(
    session: Session, ladder: Ladder, exchange: str, routing_key: str = ""
) -> None:
    """Declare the ladder's exit into ``exchange`` (idempotent; the ladder must exist, and so
    must the target: a missing one is a DataError, 65). Do this before publishing a delayed
    message to a target the ladder has not served yet: without the exit, a due message waits in
    its last quorum rung (at-least-once) or is dropped (classic rungs)."""
    bindings = [b.declare_kwargs() for b in ladder.target_bindings(exchange, routing_key)]
    await session.declare([], [], bindings)


async def delayed_counts(session: Session, ladder: Ladder) -> dict[str, int]:
    """Ready messages per rung, read with passive declares (immediate, unlike the management
    API's statistics). Messages whose next hop the target refused are not in it: see
    ``Ladder.delayed_in`` for the management view that counts them."""
    return {name: (await session.queue_depth(name)).ready for name in ladder.queue_names}

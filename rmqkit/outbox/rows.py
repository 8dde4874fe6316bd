"""The outbox relay's rows as they are published (``relay --topology``, ``add(delay=...)``):
each to its lane or through the delay ladder (rmqkit.publishing.routing), and a row that must not or
cannot go out as it is marked with its ``routing_problem`` (it stays pending with that error).

A delayed row is published into the ladder only once the exit to its target has been declared
*in this batch*: an exit is a binding, and a binding goes with its target exchange (or queue)
when that is deleted, so a target deleted and declared again under a running relay has no exit
even though it exists. Without the exit the ladder takes the row (its confirm means "in the
ladder"), the row is marked, and the message is stuck in its last rung or dropped. Re-binding is
idempotent and costs one round trip per distinct target per batch; a target that is missing
fails its rows here, like a plain row for a missing exchange.

The ladder's headers (the remaining delay in binary) are planned in ``plan_at_publish``, called
by the broker side as each row is sent: after the ladder and its exits are declared (hundreds of
ms the first time), so the time that takes is not added to every row's delay.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import replace

from rmqkit.broker.session import Session
from rmqkit.errors import DataError
from rmqkit.outbox.amqp import Row
from rmqkit.publishing.routing import Edge, Encryptor, PublishRoute


async def route_rows(
    edge: Edge, encryptor: Encryptor, session: Session, rows: list[Row]
) -> list[Row]:
    """The rows as they are published: to their lane, or (delayed) marked with the target the
    ladder delivers them to, its exit declared in this batch; a row that cannot be routed gets
    its ``routing_problem``."""
    if edge.topology is None and all(row.delay_ms is None for row in rows):
        return rows
    out: list[Row] = []
    delayed: list[tuple[int, PublishRoute]] = []
    for row in rows:
        try:
            headers = json.loads(row.headers) if row.headers else None
            bare = encryptor.plaintext(row.exchange, row.routing_key, row.body, headers)
            if bare is not None:
                raise DataError(bare)
            # PublishRoute here only for where it goes (lane, target, the delay asked for, with
            # nothing deducted); the ladder's headers are planned as it is sent.
            routed = edge.route(
                row.exchange, row.routing_key, headers, len(row.body), delay_ms=row.delay_ms
            )
        except (DataError, ValueError) as exc:
            out.append(replace(row, routing_problem=str(exc)))
            continue
        if routed.target is not None and routed.delay_ms <= row.waited_ms():
            # Waited long enough already: straight to the target, mandatory like any row.
            out.append(replace(row, exchange=routed.target[0], routing_key=routed.target[1]))
            continue
        if routed.target is None:  # not delayed: as routed, mandatory
            out.append(
                replace(
                    row,
                    exchange=routed.exchange,
                    routing_key=routed.routing_key,
                    headers=None if routed.headers is None else json.dumps(routed.headers),
                )
            )
            continue
        delayed.append((len(out), routed))
        out.append(
            replace(
                row,
                exchange=routed.target[0],
                routing_key=routed.target[1],
                delay_ms=routed.delay_ms,  # asked for (a work queue's default filled in)
                ladder_target=routed.target,
            )
        )
    if delayed:
        try:
            failed = await edge.declare(session, (r for _, r in delayed), again=True)
        except DataError as exc:  # the ladder itself (a conflicting rung): retry later
            edge.forget_ladder()
            failed = {r.target: exc for _, r in delayed if r.target is not None}
        for i, routed in delayed:
            if routed.target in failed:  # its target exchange or queue is missing
                problem = f"delay ladder exit: {failed[routed.target]}"
                out[i] = replace(out[i], routing_problem=problem)
    return out


def planner(edge: Edge) -> Callable[[Row], Row]:
    """``plan_at_publish`` for ``edge`` (what ``Broker.publish_in_order`` takes as ``prepare``)."""
    return lambda row: plan_at_publish(edge, row)


def plan_at_publish(edge: Edge, row: Row) -> Row:
    """A delayed row as it is sent now: to the ladder's entry with the delay it has left at
    this moment (its delay minus the time since it was written), or straight to its target
    when that is already nothing. Any other row as it is."""
    if row.ladder_target is None or row.routing_problem is not None:
        return row
    headers = json.loads(row.headers) if row.headers else None
    left = max(0, int((row.delay_ms or 0) - row.waited_ms()))
    exchange, routing_key = row.ladder_target
    plan = edge.ladder.plan(left, exchange, routing_key, headers)
    if plan.applied_ms == 0:
        return replace(row, ladder_target=None)
    return replace(
        row,
        exchange=plan.exchange,
        routing_key=plan.routing_key,
        headers=json.dumps(plan.headers),
    )

"""The outbox relay's rows as they are published (``relay --topology``, ``add(delay=...)``):
each to its lane or through the delay ladder (rmqkit.outbox.edge), and a row that must not or
cannot go out as it is marked with its ``routing_problem`` (it stays pending with that error)."""

from __future__ import annotations

import json
from dataclasses import replace

from rmqkit.broker.session import Session
from rmqkit.errors import DataError
from rmqkit.outbox.amqp import Row
from rmqkit.outbox.edge import Edge, Encryptor, Routed


async def route_rows(edge: Edge, guard: Encryptor, session: Session, rows: list[Row]) -> list[Row]:
    """The rows as they are published: to their lane, through the delay ladder (declared
    first, once per process); a row that cannot be routed gets its ``routing_problem``."""
    if edge.topology is None and all(row.delay_ms is None for row in rows):
        return rows
    out: list[Row] = []
    delayed: list[tuple[int, Routed]] = []
    for row in rows:
        try:
            headers = json.loads(row.headers) if row.headers else None
            bare = guard.plaintext(row.exchange, row.routing_key, row.body, headers)
            if bare is not None:
                raise DataError(bare)
            routed = edge.route(
                row.exchange,
                row.routing_key,
                headers,
                len(row.body),
                delay_ms=row.delay_ms,
                waited_ms=row.age_ms,
            )
        except (DataError, ValueError) as exc:
            out.append(replace(row, routing_problem=str(exc)))
            continue
        if routed.target is not None:
            delayed.append((len(out), routed))
        out.append(
            replace(
                row,
                exchange=routed.exchange,
                routing_key=routed.routing_key,
                headers=None if routed.headers is None else json.dumps(routed.headers),
            )
        )
    if delayed:
        try:
            failed = await edge.declare(session, (r for _, r in delayed))
        except DataError as exc:  # the ladder itself (a conflicting rung): retry later
            failed = {r.target: exc for _, r in delayed if r.target is not None}
        for i, routed in delayed:
            if routed.target in failed:  # its target exchange or queue is missing
                problem = f"delay ladder exit: {failed[routed.target]}"
                out[i] = replace(out[i], routing_problem=problem)
    return out

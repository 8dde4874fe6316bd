"""The one step every publisher of rmqkit takes at the edge: encrypt a message's sensitive
fields, then pick where it goes (its lane, or the delay ladder's entry). ``rmqkit.Publisher``
and ``rmqkit publish`` both call ``at_edge``; the relay's rows were encrypted when written and
take ``Edge.route`` alone (rmqkit/outbox/rows.py)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # `rmqkit publish` without --topology/--delay loads neither crypto nor topology
    from rmqkit.outbox.edge import Edge, Encryptor, Routed


def at_edge(
    edge: Edge,
    encryptor: Encryptor | None,
    exchange: str,
    routing_key: str,
    body: bytes,
    headers: Mapping[str, Any] | None,
    *,
    delay_ms: int | None = None,
    expiration: str | None = None,
    model: type | None = None,
) -> tuple[bytes, Routed]:
    """``body`` with its sensitive fields encrypted (the same object when it has none) and
    where to publish it. The lane is chosen by the size of the body as sent (encrypted).
    DataError (65) for a body that cannot be encrypted or routed, KeyRingError (78) for
    sensitive fields without a key ring, DelayRangeError (65) beyond the ladder."""
    if encryptor is not None:
        body = encryptor.encrypt(exchange, routing_key, body, headers, model=model)
    routed = edge.route(
        exchange, routing_key, headers, len(body), delay_ms=delay_ms, expiration=expiration
    )
    return body, routed

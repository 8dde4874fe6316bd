"""What a publish's target is when it is not what was asked for: a queue's name given as the
exchange, or a routing key that no binding of the exchange matches.

Both errors name the way that works: for a queue, the default exchange (``''``, the queue's name
as the routing key) and the exchanges bound to it; for a routing key, the keys bound on the
exchange. The bindings come from the management API; where it cannot be reached the error says
what AMQP alone can tell (a passive declare: the queue exists; the key routes nowhere).
"""

from __future__ import annotations

from typing import Any

from rmqkit.broker.management import management
from rmqkit.broker.session import Session
from rmqkit.errors import AccessRefused, BrokerError, DataError
from rmqkit.settings import Settings

SHOWN = 8  # bindings named in one line; the rest are counted


async def require_target(settings: Settings, amqp: Session, exchange: str) -> None:
    """DataError (65) unless ``exchange`` exists; when a queue of that name exists, the error
    says to publish through the default exchange or an exchange bound to the queue."""
    if await amqp.exchange_exists(exchange):
        return
    where = f"no exchange {exchange!r} in vhost {settings.vhost!r}"
    if not await amqp.queue_exists(exchange):  # passive declare: works without management
        raise DataError(
            f"{where} (nor a queue of that name) — check the name, or declare it (`rmqkit declare`)"
        )
    default = (
        f"{where}, but a queue of that name exists — publish to it through the default "
        f"exchange, the queue's name as the routing key: rmqkit publish '' {_shell(exchange)}"
    )
    try:
        bound = await _bindings(settings, destination=exchange)
    except (BrokerError, AccessRefused):
        raise DataError(
            f"{default} (the exchanges bound to it are not listed: the management API did "
            "not answer)"
        ) from None
    sources = [b for b in bound if b.get("source")]  # the default exchange's own is implicit
    if not sources:
        raise DataError(f"{default} (no other exchange is bound to it)")
    named = ", ".join(
        f"{b['source']!r} (routing key {b.get('routing_key', '')!r})" for b in sources[:SHOWN]
    )
    more = f" and {len(sources) - SHOWN} more" if len(sources) > SHOWN else ""
    which = "the exchange" if len(sources) == 1 else "the exchanges"
    raise DataError(f"{default}; or through {which} bound to it: {named}{more}")


async def routing_hint(settings: Settings, exchange: str, keys: list[str]) -> str:
    """Why messages published to ``exchange`` with routing ``keys`` were returned unroutable:
    the routing keys bound on it (management API), or, without the API, that the key routes
    nowhere."""
    shown = ", ".join(repr(k) for k in keys[:3]) + (", …" if len(keys) > 3 else "")
    key = f"routing key {shown}" if len(keys) == 1 else f"routing keys {shown}"
    if not exchange:
        return (
            f"the default exchange routes a message to the queue its routing key names, and no "
            f"queue is named {shown} — check the queue's name (`rmqkit status` lists them)"
        )
    try:
        bound = await _bindings(settings, source=exchange)
    except (BrokerError, AccessRefused):
        return (
            f"{key} routes nowhere on exchange {exchange!r} (its bindings are not listed: the "
            "management API did not answer) — check the routing key and bindings (`rmqkit plan`)"
        )
    if not bound:
        return (
            f"exchange {exchange!r} has no bindings, so nothing published to it reaches a queue "
            "— bind a queue to it (`rmqkit declare`)"
        )
    named = ", ".join(_binding(b) for b in bound[:SHOWN])
    more = f" and {len(bound) - SHOWN} more" if len(bound) > SHOWN else ""
    return (
        f"{key} matches no binding of exchange {exchange!r}; its bindings: {named}{more} — "
        "publish with one of those routing keys, or bind a queue for this one"
    )


async def _bindings(
    settings: Settings, *, source: str | None = None, destination: str | None = None
) -> list[dict[str, Any]]:
    """The vhost's bindings from ``source`` (an exchange) or to ``destination`` (a queue)."""
    async with management(settings) as api:
        every = await api.bindings()
    found = [
        b
        for b in every
        if (source is None or b.get("source") == source)
        and (
            destination is None
            or (b.get("destination") == destination and b.get("destination_type") == "queue")
        )
    ]
    # in a stable order (the API lists them in no documented one)
    return sorted(found, key=lambda b: (str(b.get("source")), str(b.get("routing_key")), str(b)))


def _binding(binding: dict[str, Any]) -> str:
    kind = "queue" if binding.get("destination_type") == "queue" else "exchange"
    key = repr(binding.get("routing_key", ""))
    if binding.get("arguments"):  # a headers exchange matches arguments, not the key
        key += f" {binding['arguments']}"
    return f"{key} → {kind} {binding.get('destination')!r}"


def _shell(name: str) -> str:
    """``name`` as one shell word (quoted when it holds anything but safe characters)."""
    import shlex

    return shlex.quote(name)

"""Replay: parked messages back where they failed, each acked only after its copy is confirmed."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from rmqkit import headers as h
from rmqkit.parking.model import ParkedFilter, ParkedMessage
from rmqkit.parking.moves import MoveReport, move_parked
from rmqkit.parking.ops import Progress
from rmqkit.settings import Settings
from rmqkit.tracing import tracing


def replay_headers(headers: dict[str, Any], now: datetime) -> dict[str, Any]:
    """Headers of a replayed copy: fresh attempts, one more replay, the failure history kept."""
    out = h.strip_broker_headers(headers)
    out[h.ATTEMPT] = 0
    previous = out.get(h.REPLAY_COUNT)
    out[h.REPLAY_COUNT] = (previous if isinstance(previous, int) else 0) + 1
    out[h.REPLAYED_AT] = h.format_timestamp(now)
    return out


def replay_target(
    message: ParkedMessage,
    parking_queue: str,
    *,
    to_exchange: str | None = None,
    routing_key: str | None = None,
) -> tuple[str, str] | str:
    """Where a replay sends ``message``: ``(exchange, routing key)``, or why it cannot (a problem
    line; the message stays parked). Never a guessed target:

    * no override: the default exchange to the origin queue (the queue it last died in);
    * ``routing_key`` (with or without ``to_exchange``): exactly that key, on ``to_exchange`` or
      the default exchange (where a key is a queue name);
    * ``to_exchange`` alone: the message's original routing key (rmqkit's
      ``rmqkit-original-routing-key``, else the key x-death recorded when it died in its origin
      queue). The origin queue's *name* is not a routing key of a named exchange: routing by it
      sent every message to the wrong place (an alternate exchange's catch-all) or nowhere.
      ``to_exchange=""`` is the default exchange, as with no override.
    """
    exchange = to_exchange or ""
    if routing_key is not None:
        key = routing_key
    elif exchange:
        if message.original_routing_key is None:
            return (
                f"no original routing key known for exchange {exchange!r} "
                "(not parked by rmqkit, no x-death route): pass --routing-key"
            )
        key = message.original_routing_key
    elif message.origin_queue is not None:
        key = message.origin_queue
    else:
        return "no origin queue known: pass --to-exchange and/or --routing-key"
    if exchange == "" and key == parking_queue:
        return f"the target is the parking queue {parking_queue!r} itself"
    return exchange, key


async def replay_parked(
    settings: Settings,
    queue: str,
    flt: ParkedFilter,
    *,
    to_exchange: str | None = None,
    routing_key: str | None = None,
    dry_run: bool = False,
    rate: float | None = None,
    limit: int | None = None,
    progress: Progress | None = None,
    report: MoveReport | None = None,
    max_replays: int | None = None,
    batch: int | None = None,
    pause_s: float = 0.0,
) -> MoveReport:
    """Send matching parked messages back where they failed (``replay_target``), each acked
    after its confirm; headers by ``replay_headers``. The rest as ``move_parked``: a crash at
    any moment leaves each message parked, in its target, or (within the confirm window) in
    both, never in neither; running the replay again continues with what is left."""

    def route(message: ParkedMessage) -> tuple[str, str] | str:
        return replay_target(message, queue, to_exchange=to_exchange, routing_key=routing_key)

    traced = tracing(settings.tracing)

    def rewrite(message: ParkedMessage, now: datetime) -> dict[str, Any]:
        out = replay_headers(message.headers, now)
        if traced is not None:
            # a `send` span in the message's own trace, linked to the handling that parked
            # it; the replayed copy's handling is its child
            target = route(message)
            exchange, key = target if isinstance(target, tuple) else ("", "")
            with traced.sending(
                "send",
                exchange=exchange,
                routing_key=key,
                message_id=message.message_id,
                body_size=len(message.body),
                parent=message.headers,
                name=f"replay {queue}",
            ):
                traced.inject(out)
        return out

    return await move_parked(
        settings,
        queue,
        flt,
        route=route,
        rewrite=rewrite,
        require_exchange=to_exchange,
        dry_run=dry_run,
        rate=rate,
        limit=limit,
        progress=progress,
        report=report,
        max_replays=max_replays,
        batch=batch,
        pause_s=pause_s,
    )

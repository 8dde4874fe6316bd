"""Example handlers for `rmqkit consume` (the README quickstart runs `examples.handlers:handle`).

A body is JSON like {"order": "o-1"}; add "fail_times": N to fail transiently N times (then
succeed through the retry tiers), or "invalid": true to fail permanently (parked at once).
"""

from __future__ import annotations

import logging

import rmqkit

log = logging.getLogger("examples.handlers")


async def handle(message: rmqkit.Message) -> None:
    """Process one order: succeed, fail transiently (retried) or permanently (parked)."""
    order = message.json()  # a body that is not JSON is parked as undecodable
    if order.get("invalid"):
        raise rmqkit.Permanent(f"order {order.get('order')} has no items")
    if int(order.get("fail_times", 0)) >= message.attempt:
        raise ConnectionError(f"payment service timed out (attempt {message.attempt})")
    log.info("processed order %s on attempt %d", order.get("order"), message.attempt)

"""Routed handlers for the routing tests (`rmqkit consume tests.routing_handlers`).

Each handler writes one file per message it handled, ``<type>-<message_id>`` holding what it
saw, into ``out/`` beside the ledger (RMQKIT_TEST_LEDGER), the side effect the tests assert.
A body ``{"fail": N}`` fails transiently on attempts 1..N. ``order_refunded`` and
``handle_created``'s names are there for the adversarial test: a type header spelling an
attribute name must not reach it.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from pydantic import BaseModel

import rmqkit


class Order(BaseModel):
    id: str
    fail: int = 0


def _out() -> Path:
    out = Path(os.environ["RMQKIT_TEST_LEDGER"]).parent / "out"
    out.mkdir(exist_ok=True)
    return out


def _write(kind: str, message: rmqkit.Message, seen: dict[str, Any]) -> None:
    path = _out() / f"{kind}-{message.message_id}"
    # One file per message: a second write would be a second effect, which the tests count.
    with path.open("a") as file:
        file.write(json.dumps(seen) + "\n")


@rmqkit.handler("order.created")
async def handle_created(order: Order, message: rmqkit.Message) -> None:
    if message.attempt <= order.fail:
        raise ConnectionError(f"order {order.id}: attempt {message.attempt} fails")
    _write("created", message, {"id": order.id, "attempt": message.attempt})


@rmqkit.handler("order.paid")
def handle_paid(message: rmqkit.Message, data: dict[str, Any]) -> None:
    """Sync, and the body second: parameters are chosen by annotation, not position."""
    _write("paid", message, {"data": data, "routing_key": message.routing_key})


async def order_refunded(message: rmqkit.Message) -> None:
    """Not decorated: never a route, whatever a type header says."""
    _write("refunded", message, {})

"""The quickstart's end-to-end run, on a vhost of its own (recreated each run).

    python examples/quickstart.py setup   # vhost, declare topologies/orders.toml, publish orders
    python examples/quickstart.py wait    # until the consumer has settled them (deadline 30 s)
    python examples/quickstart.py show    # where every message went

scripts/demo runs these around `rmqkit consume examples.handlers:handle`.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
import uuid
from urllib.parse import unquote, urlsplit

import aio_pika
from rich.console import Console
from rich.table import Table

from rmqkit.broker.amqp import connection
from rmqkit.broker.management import management
from rmqkit.settings import Settings, load_settings, mask_url, with_vhost
from rmqkit.topology import declare_topology, load_topology
from rmqkit.topology.expand import expand

VHOST = os.environ.get("RMQKIT_DEMO_VHOST", "rmqkit-demo")
QUEUES = ("orders.work", "orders.work.wait.1s", "orders.work.parking")
console = Console(stderr=True, width=110)
ORDERS = [
    ("order.created", {"order": "o-1"}, "succeeds at once"),
    ("order.created", {"order": "o-2", "fail_times": 1}, "fails once, retried after ≤ 1 s"),
    ("order.paid", {"order": "o-3", "invalid": True}, "fails permanently: parked"),
    ("order.paid", None, "is not JSON: parked as undecodable"),
]


def demo_settings() -> Settings:
    base = load_settings()
    return load_settings(url=with_vhost(base.amqp_urls[0], VHOST))


async def setup() -> None:
    base = load_settings()
    async with management(base) as api:
        await api.delete_vhost(VHOST)
        await api.create_vhost(VHOST, unquote(urlsplit(base.amqp_urls[0]).username or "guest"))
    settings = demo_settings()
    console.print(
        f"[bold]1. declare[/bold] topologies/orders.toml on {mask_url(settings.amqp_urls[0])}"
    )
    result = await declare_topology(settings, load_topology("topologies/orders.toml"))
    console.print(
        f"   {len(result.applied)} objects created (work, 20 wait, parking queues; policies)"
    )
    console.print(
        "[bold]2. publish[/bold] to exchange 'orders' (persistent, confirmed, mandatory):"
    )
    async with connection(settings, name="rmqkit quickstart") as conn:
        channel = await conn.channel(on_return_raises=True)
        orders = await channel.get_exchange("orders")
        for key, order, what in ORDERS:
            body = json.dumps(order).encode() if order else b"\x00 not json"
            message = aio_pika.Message(
                body, message_id=uuid.uuid4().hex, delivery_mode=aio_pika.DeliveryMode.PERSISTENT
            )
            await orders.publish(message, routing_key=key, mandatory=True)
            console.print(f"   {key:<14} {body.decode(errors='replace'):<40} {what}")
        try:
            await orders.publish(aio_pika.Message(b"?"), routing_key="invoice.sent", mandatory=True)
        except aio_pika.exceptions.DeliveryError:
            console.print("   invoice.sent matches no binding: the broker returned it (not lost)")
    await show("before consuming")


async def depths(names: tuple[str, ...] = QUEUES) -> dict[str, int]:
    out: dict[str, int] = {}
    async with connection(demo_settings(), name="rmqkit quickstart") as conn:
        for name in names:
            channel = await conn.channel()
            declared = await channel.declare_queue(name, passive=True)
            out[name] = declared.declaration_result.message_count or 0
            await channel.close()
    return out


async def wait() -> None:
    """Until two are parked and the work queue and every wait slot are empty, twice in a row
    (a retry is in a wait slot for up to 1 s, then briefly back in orders.work)."""
    topology = load_topology("topologies/orders.toml")
    names = tuple(q.name for q in expand(topology).queues)
    deadline = time.monotonic() + 30
    settled = 0
    while time.monotonic() < deadline:
        counts = await depths(names)
        parked = counts.pop("orders.work.parking")
        settled = settled + 1 if parked == 2 and not any(counts.values()) else 0
        if settled == 2:
            return
        await asyncio.sleep(0.3)
    console.print("[red]the consumer did not settle the orders within 30 s[/red]")
    sys.exit(1)


async def show(title: str) -> None:
    table = Table(title=title, title_justify="left")
    table.add_column("queue")
    table.add_column("ready", justify="right")
    for name, count in (await depths()).items():
        table.add_row(name, str(count))
    console.print(table)


if __name__ == "__main__":
    step = sys.argv[1] if len(sys.argv) > 1 else "setup"
    if step == "setup":
        asyncio.run(setup())
    elif step == "wait":
        asyncio.run(wait())
    else:
        asyncio.run(show("after consuming: o-1 and o-2 processed, two parked with their reason"))

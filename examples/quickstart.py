"""The quickstart's end-to-end run, on a vhost of its own (recreated each run).

Declares topologies/orders.toml through the library, publishes a few orders, sends one to
parking the way a failed consumer would and one through the 1 s wait queue, then shows where
every message went. Run by scripts/demo; safe to run again.
"""

from __future__ import annotations

import asyncio
import os
import uuid
from urllib.parse import unquote, urlsplit

import aio_pika
from rich.console import Console
from rich.table import Table

from rmqkit.broker.amqp import connection
from rmqkit.broker.management import management
from rmqkit.settings import load_settings, mask_url, with_vhost
from rmqkit.topology import declare_topology, load_topology

VHOST = os.environ.get("RMQKIT_DEMO_VHOST", "rmqkit-demo")
console = Console()


async def main() -> None:
    base = load_settings()
    async with management(base) as api:
        await api.delete_vhost(VHOST)
        await api.create_vhost(VHOST, unquote(urlsplit(base.amqp_urls[0]).username or "guest"))
    settings = load_settings(url=with_vhost(base.amqp_urls[0], VHOST))
    console.print(
        f"[bold]1. declare[/bold] topologies/orders.toml on {mask_url(settings.amqp_urls[0])}"
    )
    result = await declare_topology(settings, load_topology("topologies/orders.toml"))
    console.print(f"   {len(result.applied)} objects created; a second run would change nothing")

    async with connection(settings, name="rmqkit quickstart") as conn:
        channel = await conn.channel(on_return_raises=True)
        orders = await channel.get_exchange("orders")
        console.print(
            "[bold]2. publish[/bold] 3 orders to exchange 'orders' (confirmed, mandatory)"
        )
        for key in ("order.created", "order.paid", "order.shipped"):
            message = aio_pika.Message(
                b'{"order": "%s"}' % key.encode(),
                message_id=uuid.uuid4().hex,
                delivery_mode=aio_pika.DeliveryMode.PERSISTENT,
            )
            await orders.publish(message, routing_key=key, mandatory=True)
        try:
            await orders.publish(aio_pika.Message(b"?"), routing_key="invoice.sent", mandatory=True)
        except aio_pika.exceptions.DeliveryError:
            console.print(
                "   'invoice.sent' matches no binding: the broker returned it (not lost silently)"
            )

        console.print(
            "[bold]3. reject[/bold] one order without requeue, as a poison message would be"
        )
        work = await channel.get_queue("orders.work", ensure=False)
        incoming = await work.get(fail=True)
        assert incoming is not None
        await incoming.reject(requeue=False)

        console.print("[bold]4. retry[/bold] one copy through orders.work.wait.1s (queue TTL 1 s)")
        await channel.default_exchange.publish(
            aio_pika.Message(b'{"order": "retry-me"}', message_id=uuid.uuid4().hex),
            routing_key="orders.work.wait.1s",
            mandatory=True,
        )
        await asyncio.sleep(0.2)
        await show(conn, "just after publishing")
        await asyncio.sleep(1.5)
        await show(conn, "1.7 s later: the retry is back in orders.work")
    console.print(
        f"\nExplore: RMQKIT_URL={mask_url(settings.amqp_urls[0])} "
        "rmqkit plan topologies/orders.toml"
    )


async def show(conn: aio_pika.abc.AbstractConnection, title: str) -> None:
    table = Table(title=title, title_justify="left")
    table.add_column("queue")
    table.add_column("ready", justify="right")
    for name in ("orders.work", "orders.work.wait.1s", "orders.work.parking"):
        channel = await conn.channel()
        declared = await channel.declare_queue(name, passive=True)
        table.add_row(name, str(declared.declaration_result.message_count))
        await channel.close()
    console.print(table)


if __name__ == "__main__":
    asyncio.run(main())

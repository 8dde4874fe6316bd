"""A FastAPI app that handles its own orders: the embedded ``rmqkit.Consumer`` runs in the app's
event loop, started and stopped by the lifespan, while an endpoint publishes orders.

    rmqkit declare topologies/orders.toml
    RMQKIT_URL=amqp://guest:guest@localhost:5672/ uvicorn examples.fastapi_app:app

``POST /orders {"id": "o-1", "amount": 5}`` publishes an order (confirmed by the broker, and
refused if nothing would receive it); the consumer hands it to ``handle_order`` with the same
acks, retries, parking and metrics as ``rmqkit consume``. An order with a negative amount is
parked at once (``rmqkit.Permanent``); any other exception is retried through the wait queues
and parked when its attempts are spent. ``GET /readyz`` answers 503 while the consumer is not
consuming (e.g. reconnecting after the broker restarted). Stopping the app (SIGTERM to uvicorn)
ends the lifespan: the consumer takes no new deliveries and finishes the ones in flight within
its grace before the process exits. tests/integration/test_embedded_consumer.py runs this app.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import aio_pika
from fastapi import FastAPI, Response
from pydantic import BaseModel

import rmqkit

TOPOLOGY = Path(__file__).resolve().parent.parent / "topologies" / "orders.toml"


class Order(BaseModel):
    id: str
    amount: int


def create_app(settings: rmqkit.Settings | None = None, topology: str | Path = TOPOLOGY) -> FastAPI:
    """The app; ``settings`` default to the ``RMQKIT_*`` environment, read at startup."""
    handled: list[str] = []  # stands in for the app's database

    async def handle_order(order: Order) -> None:
        if order.amount < 0:
            raise rmqkit.Permanent(f"order {order.id} has a negative amount")  # parked
        handled.append(order.id)  # the side effect; return = success = ack

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        config = settings if settings is not None else rmqkit.load_settings()
        consumer = rmqkit.Consumer(
            handle_order, queue="orders.work", topology=topology, settings=config, grace_s=10
        )
        app.state.consumer = consumer
        # Publishing: a plain aio-pika channel with publisher confirms (its default) and
        # returns raised, so a publish the broker could not route fails the request.
        connection = await aio_pika.connect_robust(config.amqp_urls[0])
        try:
            channel = await connection.channel(on_return_raises=True)
            app.state.exchange = await channel.get_exchange("orders")
            async with consumer:  # start(): consuming before the first request is served
                yield
            # leaving the block: stop(), the handlers in flight finish within the grace
        finally:
            await connection.close()

    app = FastAPI(lifespan=lifespan)

    @app.post("/orders", status_code=202)
    async def create_order(order: Order) -> dict[str, str]:
        await app.state.exchange.publish(
            aio_pika.Message(
                order.model_dump_json().encode(),
                message_id=order.id,  # the idempotency key, kept end to end
                content_type="application/json",
                delivery_mode=aio_pika.DeliveryMode.PERSISTENT,
            ),
            routing_key="order.created",
            mandatory=True,
        )
        return {"accepted": order.id}

    @app.get("/orders/handled")
    async def list_handled() -> list[str]:
        return handled

    @app.get("/readyz")
    async def readyz(response: Response) -> dict[str, bool]:
        consuming = app.state.consumer.consuming
        if not consuming:
            response.status_code = 503
        return {"consuming": consuming}

    return app


app = create_app()

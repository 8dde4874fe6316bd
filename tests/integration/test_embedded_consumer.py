"""The embedded consumer (``rmqkit.Consumer``) in the test's own event loop, against the real
broker: outcomes, a retry through the wait queue, parking with its reason headers, a graceful
stop that settles what is in flight and leaves the rest queued, and the FastAPI example with
its lifespan run (asgi-lifespan) and requests through httpx's ASGI transport."""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aio_pika
import pytest

import rmqkit
from rmqkit import headers as h
from rmqkit.settings import Settings
from rmqkit.topology import declare_topology, load_topology
from rmqkit.topology.expand import wait_queue_names
from rmqkit.topology.model import Topology
from tests import broker

pytestmark = pytest.mark.semantics("4.3")

ROOT = Path(__file__).resolve().parents[2]
TOPOLOGY = """
[exchanges."{name}"]
type = "direct"

[queues."{name}.work"]
bind = [{{ exchange = "{name}", routing_key = "job" }}]
retry_delays = ["1s"]
max_attempts = 3
delivery_limit = 5
prefetch = {prefetch}
"""


def make_topology(tmp_path: Path, vhost: str, name: str, prefetch: int = 20) -> Topology:
    """Declare a small topology of its own (exchange NAME, queue NAME.work) in ``vhost``."""
    path = tmp_path / f"{name}.toml"
    path.write_text(TOPOLOGY.format(name=name, prefetch=prefetch), encoding="utf-8")
    spec = load_topology(path)
    broker.run(declare_topology(broker.settings_for(vhost), spec))
    return spec


def all_queues(spec: Topology, queue: str) -> list[str]:
    waits = [name for tier in wait_queue_names(spec, queue) for name, _ in tier]
    return [queue, *waits, spec.parking_name(queue)]


async def depths(vhost: str, names: list[str]) -> dict[str, int | None]:
    result: dict[str, int | None] = await asyncio.to_thread(broker.depths, vhost, names)
    return result


async def publish(vhost: str, exchange: str, bodies: list[dict[str, Any]]) -> list[str]:
    """Publish JSON bodies (confirmed, mandatory); returns their message ids."""
    ids = [str(b.get("id") or uuid.uuid4().hex) for b in bodies]
    conn = await aio_pika.connect(broker.settings_for(vhost).amqp_urls[0])
    try:
        channel = await conn.channel(on_return_raises=True)
        target = await channel.get_exchange(exchange)
        for message_id, body in zip(ids, bodies, strict=True):
            await target.publish(
                aio_pika.Message(
                    json.dumps(body).encode(),
                    message_id=message_id,
                    delivery_mode=aio_pika.DeliveryMode.PERSISTENT,
                ),
                routing_key="job",
                mandatory=True,
            )
    finally:
        await conn.close()
    return ids


async def until(predicate: Any, timeout_s: float = 15.0) -> bool:
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not predicate():
        if asyncio.get_running_loop().time() > deadline:
            return False
        await asyncio.sleep(0.02)
    return True


@pytest.fixture
def settings(vhost: str) -> Iterator[Settings]:
    yield broker.settings_for(vhost)


def test_outcomes_retry_through_the_wait_queue_and_parking(
    vhost: str, settings: Settings, tmp_path: Path
) -> None:
    spec = make_topology(tmp_path, vhost, "emb-outcomes")
    queue = "emb-outcomes.work"
    seen: dict[str, list[rmqkit.Message]] = {}

    async def handle(message: rmqkit.Message) -> None:
        seen.setdefault(str(message.message_id), []).append(message)
        job = message.json()
        if job["kind"] == "permanent":
            raise rmqkit.Permanent("this job can never work")
        if job["kind"] == "transient" and message.attempt == 1:
            raise ConnectionError("downstream timed out")

    async def main() -> None:
        kinds = ["ok"] * 20 + ["transient"] * 2 + ["permanent"]
        ids = await publish(vhost, "emb-outcomes", [{"kind": k} for k in kinds])
        kind_of = dict(zip(ids, kinds, strict=True))
        consumer = rmqkit.Consumer(handle, queue=queue, topology=spec, settings=settings)
        await consumer.start()
        assert consumer.consuming
        try:
            done = await until(
                lambda: all(
                    len(seen.get(i, [])) == (2 if kind_of[i] == "transient" else 1) for i in ids
                )
            )
            assert done, {i: len(seen.get(i, [])) for i in ids}
            names = all_queues(spec, queue)
            parking = spec.parking_name(queue)
            assert await until(lambda: consumer.processed == len(ids) + 2)
            # every delivery settled: nothing ready anywhere but the one parked message
            assert await _eventually_depths(vhost, names, {parking: 1})
        finally:
            await consumer.stop(grace_s=5)
        assert not consumer.consuming
        for i in ids:
            if kind_of[i] != "transient":
                continue
            second = seen[i][1]
            assert second.attempt == 2
            # it came back from a wait queue of the 1s tier (its x-death names it: expired)
            deaths = second.headers.get("x-death") or []
            waits = {n for tier in wait_queue_names(spec, queue) for n, _ in tier}
            assert any(d.get("queue") in waits and d.get("reason") == "expired" for d in deaths)
        parked = await asyncio.to_thread(broker.drain, vhost, spec.parking_name(queue))
        assert len(parked) == 1
        headers = parked[0]["headers"]
        assert kind_of[parked[0]["message_id"]] == "permanent"
        assert headers[h.PARK_REASON] == "permanent"
        assert headers[h.ERROR_TYPE] == "rmqkit.Permanent"
        assert "never work" in headers[h.ERROR_MESSAGE]
        assert headers[h.ORIGIN_QUEUE] == queue

    asyncio.run(main())


async def _eventually_depths(vhost: str, names: list[str], expected: dict[str, int]) -> bool:
    want = {n: expected.get(n, 0) for n in names}
    for _ in range(100):
        if await depths(vhost, names) == want:
            return True
        await asyncio.sleep(0.1)
    return False


def test_stop_with_grace_settles_in_flight_and_leaves_the_rest_queued(
    vhost: str, settings: Settings, tmp_path: Path
) -> None:
    spec = make_topology(tmp_path, vhost, "emb-grace", prefetch=3)
    queue = "emb-grace.work"
    started: list[str] = []
    finished: list[str] = []
    release = asyncio.Event()

    async def slow(message: rmqkit.Message) -> None:
        started.append(str(message.message_id))
        await release.wait()
        finished.append(str(message.message_id))

    async def main() -> None:
        nonlocal release
        release = asyncio.Event()
        ids = await publish(vhost, "emb-grace", [{"n": n} for n in range(10)])
        consumer = rmqkit.Consumer(slow, queue=queue, topology=spec, settings=settings)
        await consumer.start()
        assert await until(lambda: len(started) == 3)  # the prefetch window, all in flight
        stopping = asyncio.create_task(consumer.stop(grace_s=10))
        await asyncio.sleep(0.3)
        assert not stopping.done()  # the drain waits for the handlers in flight
        assert len(started) == 3  # no new deliveries once stopping
        release.set()
        await asyncio.wait_for(stopping, timeout=10)
        assert sorted(finished) == sorted(started)
        assert consumer.processed == 3
        # the 3 were acked before the connection closed; the other 7 were never taken
        assert await depths(vhost, all_queues(spec, queue)) == {
            **{n: 0 for n in all_queues(spec, queue)},
            queue: 7,
        }
        assert set(started) <= set(ids)
        await consumer.stop()  # again: nothing happens

    asyncio.run(main())
    broker.drain(vhost, queue)


def test_fastapi_example_consumes_in_its_lifespan(vhost: str, settings: Settings) -> None:
    import httpx
    from asgi_lifespan import LifespanManager

    from examples.fastapi_app import create_app

    broker.run(declare_topology(settings, load_topology(ROOT / "topologies" / "orders.toml")))

    async def main() -> None:
        app = create_app(settings=settings, topology=ROOT / "topologies" / "orders.toml")
        async with LifespanManager(app) as manager:
            transport = httpx.ASGITransport(app=manager.app)
            async with httpx.AsyncClient(transport=transport, base_url="http://app") as client:
                ready = await client.get("/readyz")
                assert ready.status_code == 200, ready.text
                for n in range(5):
                    created = await client.post("/orders", json={"id": f"o-{n}", "amount": n})
                    assert created.status_code == 202, created.text
                refused = await client.post("/orders", json={"id": "o-bad", "amount": -1})
                assert refused.status_code == 202  # accepted; the consumer parks it

                async def handled() -> set[str]:
                    listed = await client.get("/orders/handled")
                    return set(listed.json())

                for _ in range(200):
                    if await handled() >= {f"o-{n}" for n in range(5)}:
                        break
                    await asyncio.sleep(0.05)
                assert await handled() == {f"o-{n}" for n in range(5)}
                names = ["orders.work", "orders.work.parking"]
                assert await _eventually_depths(vhost, names, {"orders.work.parking": 1})
        # the lifespan's end stopped the consumer
        assert app.state.consumer.consuming is False
        parked = await asyncio.to_thread(broker.drain, vhost, "orders.work.parking")
        assert [p["headers"][h.PARK_REASON] for p in parked] == ["permanent"]

    asyncio.run(main())


def test_start_raises_what_consume_exits_on_and_may_be_retried(
    vhost: str, settings: Settings, tmp_path: Path
) -> None:
    async def handle(message: rmqkit.Message) -> None:
        return None

    path = tmp_path / "emb-start.toml"
    path.write_text(TOPOLOGY.format(name="emb-start", prefetch=5), encoding="utf-8")
    queue = "emb-start.work"

    async def main() -> None:
        down = rmqkit.load_settings(
            url="amqp://guest:guest@127.0.0.1:5999/", management_url="http://127.0.0.1:15999"
        )
        with pytest.raises(rmqkit.BrokerUnavailable):  # exit 69 for `rmqkit consume`
            await rmqkit.Consumer(handle, queue=queue, topology=path, settings=down).start()
        with pytest.raises(rmqkit.BrokerUnavailable):  # no topology: management API needed
            await rmqkit.Consumer(handle, queue=queue, settings=down).start()
        nowhere = broker.settings_for(f"{vhost}-does-not-exist")
        with pytest.raises(rmqkit.AccessRefused):  # 77
            await rmqkit.Consumer(handle, queue=queue, topology=path, settings=nowhere).start()
        consumer = rmqkit.Consumer(handle, queue=queue, topology=path, settings=settings)
        with pytest.raises(rmqkit.ConfigError, match="does not exist"):  # 78: not declared
            await consumer.start()
        assert not consumer.consuming
        # the operator declares the topology; the same object starts now
        await declare_topology(settings, load_topology(path))
        await consumer.start()
        assert consumer.consuming
        await consumer.stop()
        with pytest.raises(rmqkit.UsageError):
            rmqkit.Consumer(handle, queue=queue, prefetch=0, settings=settings)
        with pytest.raises(rmqkit.ConfigError, match="takes no argument"):
            rmqkit.Consumer(lambda: None, queue=queue, settings=settings)

    asyncio.run(main())

"""``rmqkit.Publisher`` / ``rmqkit.SyncPublisher`` on the real broker: what the queues hold after
each call (read back with basic.get), not only what the call returned."""

from __future__ import annotations

import asyncio
import json
import threading
import uuid
from pathlib import Path
from typing import Annotated, Any

import aio_pika
import pytest
from pydantic import BaseModel, ConfigDict, Field

import rmqkit
from rmqkit.broker.session import session
from rmqkit.crypto import decrypt_fields, generate_keyring, is_envelope
from rmqkit.settings import Settings
from rmqkit.topology import declare_topology, load_topology
from tests import broker

pytestmark = [pytest.mark.broker, pytest.mark.semantics("4.3")]

SECRET = "SENTINEL-41c2-TAXID"
TOPOLOGY = """
[exchanges.later]
type = "direct"
[queues."later.work"]
bind = [{ exchange = "later", routing_key = "l" }]
retry_delays = []
delay = "3s"
"""


async def declare(settings: Settings, queue: str, exchange: str = "pub", **arguments: Any) -> None:
    """A durable direct exchange and a classic queue bound to it with key = queue name."""
    conn = await aio_pika.connect(settings.amqp_urls[0])
    try:
        channel = await conn.channel()
        ex = await channel.declare_exchange(exchange, "direct", durable=True)
        declared = await channel.declare_queue(queue, durable=True, arguments=arguments or None)
        await declared.bind(ex, routing_key=queue)
    finally:
        await conn.close()


def held(vhost: str, queue: str) -> list[dict[str, Any]]:
    return broker.drain(vhost, queue)


async def get_raw(settings: Settings, queue: str) -> list[aio_pika.abc.AbstractIncomingMessage]:
    conn = await aio_pika.connect(settings.amqp_urls[0])
    out = []
    try:
        channel = await conn.channel()
        source = await channel.get_queue(queue, ensure=False)
        while (message := await source.get(fail=False, no_ack=True)) is not None:
            out.append(message)
    finally:
        await conn.close()
    return out


def test_publish_confirmed_lands_persistent_with_headers_and_id(vhost: str) -> None:
    settings = broker.settings_for(vhost)

    async def main() -> tuple[Any, list[Any], list[Any]]:
        await declare(settings, "pub.ok")
        async with rmqkit.Publisher.connect(settings) as pub:
            one = await pub.publish(
                "pub", "pub.ok", b"hello", message_id="m-1", headers={"tenant": "t1", "n": 3}
            )
            many = await pub.publish_many(
                "pub",
                "pub.ok",
                [rmqkit.PublishMessage(f"b{i}".encode(), message_id=f"x{i}") for i in range(50)],
            )
        return one, many, await get_raw(settings, "pub.ok")

    one, many, got = broker.run(main())
    assert one == rmqkit.PublishResult("m-1", "pub", "pub.ok", True, "confirmed")
    assert [r.message_id for r in many] == [f"x{i}" for i in range(50)]
    assert all(r.confirmed and r.outcome == "confirmed" for r in many)
    assert len(got) == 51
    first = got[0]
    assert (first.message_id, first.body, first.delivery_mode) == ("m-1", b"hello", 2)
    assert first.headers == {"tenant": "t1", "n": 3}
    assert [m.message_id for m in got[1:]] == [f"x{i}" for i in range(50)]
    assert all(m.delivery_mode == 2 for m in got)


def test_unroutable_is_a_typed_error_and_nothing_is_lost_silently(vhost: str) -> None:
    settings = broker.settings_for(vhost)

    async def main() -> rmqkit.Unroutable:
        await declare(settings, "pub.routed")
        async with rmqkit.Publisher.connect(settings) as pub:
            with pytest.raises(rmqkit.Unroutable) as caught:
                await pub.publish_many(
                    "pub",
                    "pub.routed",
                    [
                        rmqkit.PublishMessage(b"a", message_id="r-1"),
                        rmqkit.PublishMessage(b"b", message_id="r-2", routing_key="nowhere"),
                    ],
                )
            with pytest.raises(rmqkit.Unroutable):
                await pub.publish("pub", "nowhere", b"c", message_id="r-3")
        return caught.value

    error = broker.run(main())
    assert error.exit_code == 65
    assert [r.message_id for r in error.confirmed] == ["r-1"]  # type: ignore[attr-defined]
    assert [(r.message_id, r.outcome) for r in error.unconfirmed] == [  # type: ignore[attr-defined]
        ("r-2", "returned")
    ]
    assert [m["message_id"] for m in held(vhost, "pub.routed")] == ["r-1"]


def test_full_bounded_queue_is_busy_listing_the_unconfirmed(vhost: str) -> None:
    settings = broker.settings_for(vhost)

    async def main() -> rmqkit.PublisherBusy:
        await declare(
            settings, "pub.bounded", **{"x-max-length": 2, "x-overflow": "reject-publish"}
        )
        async with rmqkit.Publisher.connect(settings, window=1) as pub:
            with pytest.raises(rmqkit.PublisherBusy) as caught:
                await pub.publish_many(
                    "pub",
                    "pub.bounded",
                    [rmqkit.PublishMessage(b"x", message_id=f"q{i}") for i in range(5)],
                )
        return caught.value

    error = broker.run(main())
    assert error.exit_code == 69
    confirmed = [r.message_id for r in error.confirmed]  # type: ignore[attr-defined]
    refused = [(r.message_id, r.outcome) for r in error.unconfirmed]  # type: ignore[attr-defined]
    assert confirmed == ["q0", "q1"]
    assert refused == [("q2", "nacked"), ("q3", "nacked"), ("q4", "nacked")]
    assert [m["message_id"] for m in held(vhost, "pub.bounded")] == confirmed


class Customer(BaseModel):
    model_config = ConfigDict(populate_by_name=True)
    full_name: Annotated[str, rmqkit.Sensitive()] = Field(alias="fullName")
    city: str


class Order(BaseModel):
    model_config = ConfigDict(populate_by_name=True)
    order_id: str = Field(alias="orderId")
    customer: Customer
    tax_id: Annotated[str, rmqkit.Sensitive(blind_index=True)] = Field(alias="taxId")


def test_model_body_by_alias_with_sensitive_fields_encrypted_on_the_wire(vhost: str) -> None:
    settings = broker.settings_for(vhost)
    ring = generate_keyring()
    order = Order(
        order_id="o-9", customer=Customer(full_name=SECRET + "-name", city="Lyon"), tax_id=SECRET
    )

    async def main() -> rmqkit.PublishResult:
        await declare(settings, "pub.model")
        async with rmqkit.Publisher.connect(settings, keyring=ring) as pub:
            return await pub.publish("pub", "pub.model", order, message_id="o-9")

    assert broker.run(main()).confirmed
    got = held(vhost, "pub.model")
    assert len(got) == 1 and SECRET.encode() not in got[0]["body"]
    body = json.loads(got[0]["body"])
    assert body["orderId"] == "o-9" and body["customer"]["city"] == "Lyon"  # by alias
    assert is_envelope(body["taxId"]) and is_envelope(body["customer"]["fullName"])
    plain = json.loads(decrypt_fields(got[0]["body"], ["taxId", "customer.fullName"], ring))
    assert plain["taxId"] == SECRET and plain["customer"]["fullName"] == SECRET + "-name"
    assert Order.model_validate(plain) == order


def test_model_with_sensitive_fields_and_no_key_ring_publishes_nothing(vhost: str) -> None:
    settings = broker.settings_for(vhost)
    order = Order(order_id="o-1", customer=Customer(full_name="n", city="c"), tax_id=SECRET)

    async def main() -> None:
        await declare(settings, "pub.noring")
        async with rmqkit.Publisher.connect(settings) as pub:
            with pytest.raises(rmqkit.ConfigError):
                await pub.publish("pub", "pub.noring", order)

    broker.run(main())
    assert held(vhost, "pub.noring") == []


def test_topology_default_delay_lands_in_the_work_queue_after_it(
    vhost: str, tmp_path: Path
) -> None:
    settings = broker.settings_for(vhost)
    path = tmp_path / "later.toml"
    path.write_text(TOPOLOGY)
    broker.run(declare_topology(settings, load_topology(path)))

    async def main() -> list[rmqkit.PublishResult]:
        async with rmqkit.Publisher.connect(settings, topology=path) as pub:
            return await pub.publish_many("later", "l", [b"d1", b"d2"])

    results = broker.run(main())
    assert [r.delay_ms for r in results] == [3000, 3000] and all(r.confirmed for r in results)
    assert broker.depths(vhost, ["later.work"])["later.work"] == 0, "arrived before its delay"
    broker.wait_for(lambda: broker.depths(vhost, ["later.work"])["later.work"] == 2, timeout_s=15)
    got = held(vhost, "later.work")
    assert sorted(m["body"] for m in got) == [b"d1", b"d2"]
    assert {m["message_id"] for m in got} == {r.message_id for r in results}


def test_sync_publisher_from_four_threads(vhost: str) -> None:
    settings = broker.settings_for(vhost)
    broker.run(declare(settings, "pub.sync"))
    results: list[rmqkit.PublishResult] = []
    errors: list[BaseException] = []
    with rmqkit.SyncPublisher(settings, call_timeout_s=60) as pub:

        def worker(t: int) -> None:
            try:
                for i in range(25):
                    results.append(pub.publish("pub", "pub.sync", b"s", message_id=f"t{t}-{i}"))
                results.extend(
                    pub.publish_many("pub", "pub.sync", [b"m"] * 5, headers={"thread": t})
                )
            except BaseException as exc:
                errors.append(exc)

        threads = [threading.Thread(target=worker, args=(t,)) for t in range(4)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(60)
    assert errors == []
    assert len(results) == 120 and all(r.confirmed for r in results)
    got = held(vhost, "pub.sync")
    assert sorted(m["message_id"] for m in got) == sorted(r.message_id for r in results)
    with pytest.raises(rmqkit.PublisherClosed):
        pub.publish("pub", "pub.sync", b"late")


def test_connection_closed_mid_publish_many_reconnects_and_reports_truthfully(
    vhost: str,
) -> None:
    settings = broker.settings_for(vhost)
    name = f"rmqkit-test-publisher-{uuid.uuid4().hex[:8]}"
    killed: list[str] = []

    def kill_when_seen() -> None:
        def ours() -> list[str]:
            listed = broker.api("GET", f"/vhosts/{broker.q(vhost)}/connections").json()
            return [
                c["name"]
                for c in listed
                if c.get("client_properties", {}).get("connection_name") == name
            ]

        for conn_name in broker.wait_for(ours, timeout_s=20, interval_s=0.05):
            broker.api("DELETE", f"/connections/{broker.q(conn_name)}")
            killed.append(conn_name)

    async def main() -> list[rmqkit.PublishResult]:
        await declare(settings, "pub.killed")
        results: list[rmqkit.PublishResult] = []
        async with rmqkit.Publisher.connect(settings, window=20, name=name) as pub:
            killer = asyncio.ensure_future(asyncio.to_thread(kill_when_seen))
            # batches back to back until a kill has landed inside one (seen as a resend); a
            # kill between two batches (or before the first) is simply made again
            deadline = asyncio.get_running_loop().time() + 40
            batch = 0
            while asyncio.get_running_loop().time() < deadline:
                if any(r.attempts > 1 for r in results):
                    break
                if killer.done():
                    killer.result()
                    killer = asyncio.ensure_future(asyncio.to_thread(kill_when_seen))
                bodies = [
                    rmqkit.PublishMessage(b"k" * 512, message_id=f"k{batch}-{i}")
                    for i in range(500)
                ]
                batch += 1
                try:
                    results += await pub.publish_many("pub", "pub.killed", bodies)
                except rmqkit.PublishFailed as exc:
                    results += exc.results  # type: ignore[arg-type]
            await killer
            return results

    results = broker.run(main())
    assert killed, "the connection was never seen to kill"
    n = len(results)
    assert n == len({r.message_id for r in results}) >= 1000
    in_queue = {m["message_id"] for m in held(vhost, "pub.killed")}
    confirmed = {r.message_id for r in results if r.confirmed}
    assert confirmed <= in_queue, "reported confirmed but not in the queue"
    assert any(r.attempts > 1 for r in results), "nothing was sent again after the kill"
    assert confirmed == {r.message_id for r in results}  # the reconnect sent the rest again


LANES = """
[exchanges.media]
type = "direct"
[queues."media.work"]
bind = [{ exchange = "media", routing_key = "media" }]
retry_delays = []
[queues."media.work".lanes.big]
body_over = 1000
"""


def test_topology_lane_by_body_size_is_in_the_result_and_the_lane_queue(
    vhost: str, tmp_path: Path
) -> None:
    settings = broker.settings_for(vhost)
    path = tmp_path / "lanes.toml"
    path.write_text(LANES)
    broker.run(declare_topology(settings, load_topology(path)))

    async def main() -> list[rmqkit.PublishResult]:
        async with session(settings) as s:  # the lane queue, if declare did not make it
            if not await s.queue_exists("media.work.lane.big"):
                queue = {"queue": "media.work.lane.big", "durable": True}
                await s.declare([], [{**queue, "arguments": {"x-queue-type": "quorum"}}], [])
        async with rmqkit.Publisher.connect(settings, topology=path) as pub:
            return await pub.publish_many("media", "media", [b"small", b"B" * 2000])

    small, big = broker.run(main())
    assert (small.lane, big.lane) == (None, "media.work.lane.big")
    assert small.confirmed and big.confirmed
    assert [m["message_id"] for m in held(vhost, "media.work")] == [small.message_id]
    assert [m["message_id"] for m in held(vhost, "media.work.lane.big")] == [big.message_id]

"""rmqkit.broker.session against the broker: probes, consume/ack/reject, the broker's cancel,
confirmed publishes, typed deliveries, and what each leaves in the queues."""

from __future__ import annotations

import asyncio
from typing import Any

import aiormq
import pytest

from rmqkit.broker.codec import Properties, TypedProperties
from rmqkit.broker.session import Channel, Delivery, Outcome, Session, open_session, session
from rmqkit.errors import ConfigError, DataError
from rmqkit.settings import with_vhost
from tests import broker

pytestmark = pytest.mark.broker


async def _declare(vhost: str, *names: str) -> None:
    conn = await aiormq.connect(with_vhost(broker.BASE_URL, vhost))
    try:
        channel = await conn.channel()
        for name in names:
            await channel.queue_delete(name)
            await channel.queue_declare(name, durable=True, arguments={"x-queue-type": "quorum"})
    finally:
        await conn.close()


def test_probes_count_what_the_broker_holds_and_survive_a_missing_queue(vhost: str) -> None:
    broker.run(_declare(vhost, "s.probe"))
    broker.publish(vhost, "", "s.probe", [b"1", b"2", b"3"])

    async def main() -> None:
        async with session(broker.settings_for(vhost), name="test session") as s:
            assert s.server_version[0] in (3, 4)
            assert "guest:***" in s.display_url or "***" in s.display_url
            assert not await s.queue_exists("s.missing")
            # the 404 closed the probe channel: the next probe opens another
            depth = await s.queue_depth("s.probe")
            assert (depth.ready, depth.consumers) == (3, 0)
            assert await s.queue_exists("s.probe")
            with pytest.raises(ConfigError, match=r"queue 's\.missing' does not exist — declare"):
                await s.require_queue("s.missing", ConfigError, "declare it")
            with pytest.raises(DataError, match=r"checking queue 's\.missing'"):
                await s.queue_depth("s.missing")
            with pytest.raises(DataError, match=r"checking exchange 's\.nope'"):
                await s.require_exchange("s.nope")
            await s.require_exchange("")
            await s.require_exchange("amq.direct")
        assert s.is_closed

    broker.run(main())
    assert broker.depths(vhost, ["s.probe"]) == {"s.probe": 3}


def test_consume_ack_reject_and_confirmed_copies(vhost: str) -> None:
    """Five deliveries: two acked with one multiple ack, one copied to s.copies (confirmed)
    then acked, one rejected back, one left unacked until close (comes back)."""
    broker.run(_declare(vhost, "s.work", "s.copies"))
    broker.publish(vhost, "", "s.work", [b"a", b"b", b"c", b"d", b"e"], headers={"n": 1})

    async def main() -> list[Any]:
        s = await open_session(broker.settings_for(vhost), name="test consume")
        try:
            channel = await s.channel(confirms=True)
            await channel.qos(10)
            got: asyncio.Queue[Delivery] = asyncio.Queue()

            async def on_delivery(delivery: Delivery) -> None:
                got.put_nowait(delivery)

            tag = await channel.consume("s.work", on_delivery)
            seen = [await asyncio.wait_for(got.get(), 10) for _ in range(5)]
            assert [d.body for d in seen] == [b"a", b"b", b"c", b"d", b"e"]
            assert all(channel.owns(d) for d in seen)
            first = seen[0]
            assert isinstance(first.header.properties, Properties)
            assert first.header.properties.headers == {"n": 1}
            assert first.delivery.routing_key == "s.work" and first.delivery.exchange == ""
            assert first.delivery.redelivered is False
            tags = [d.delivery.delivery_tag for d in seen]
            await channel.ack(tags[1], multiple=True)  # a and b
            outcome = await (
                await channel.publisher.publish(
                    seen[2].body,
                    exchange="",
                    routing_key="s.copies",
                    properties=seen[2].header.properties,
                )
            )
            assert outcome is Outcome.CONFIRMED
            returned = await (
                await channel.publisher.publish(
                    b"x", exchange="", routing_key="s.nowhere", properties=Properties()
                )
            )
            assert returned is Outcome.RETURNED
            await channel.ack(tags[2])
            await channel.reject(tags[3], requeue=True)
            await channel.cancel(tag)
            await channel.close()
            await channel.close()  # twice is fine
            assert channel.is_closed
            return seen
        finally:
            await s.close()

    broker.run(main())
    assert broker.wait_for(
        lambda: broker.depths(vhost, ["s.work", "s.copies"]) == {"s.work": 2, "s.copies": 1}
    )


def test_the_broker_cancelling_our_consumer_reaches_the_listener(vhost: str) -> None:
    broker.run(_declare(vhost, "s.cancelled"))

    async def main() -> None:
        async with session(broker.settings_for(vhost)) as s:
            channel = await s.channel()
            heard: asyncio.Future[str] = asyncio.get_running_loop().create_future()

            def listener(consumer_tag: str) -> None:
                if not heard.done():
                    heard.set_result(consumer_tag)

            async def ignore(delivery: Delivery) -> None:
                return None

            channel.add_cancel_listener(listener)
            tag = await channel.consume("s.cancelled", ignore)
            broker.api("DELETE", f"/queues/{broker.q(vhost)}/s.cancelled").raise_for_status()
            assert await asyncio.wait_for(heard, 10) == tag
            channel.discard_cancel_listener(listener)
            channel.discard_cancel_listener(listener)  # no error
            assert not channel.is_closed

    broker.run(main())


def test_a_typed_session_delivers_typed_properties_and_wraps_a_bare_connection(
    vhost: str,
) -> None:
    broker.run(_declare(vhost, "s.typed"))
    broker.publish(vhost, "", "s.typed", [b"t"])

    async def main() -> None:
        async with session(broker.settings_for(vhost), typed=True) as s:
            channel: Channel = await s.channel()
            got: asyncio.Queue[Delivery] = asyncio.Queue()

            async def on_delivery(delivery: Delivery) -> None:
                got.put_nowait(delivery)

            await channel.qos(1)
            await channel.consume("s.typed", on_delivery)
            delivery = await asyncio.wait_for(got.get(), 10)
            assert isinstance(delivery.header.properties, TypedProperties)
            await channel.nack(delivery.delivery.delivery_tag, multiple=True, requeue=True)
            await channel.close()
        conn = await aiormq.connect(with_vhost(broker.BASE_URL, vhost))
        try:
            bare = Session.of(conn)
            assert Session.of(bare) is bare
            # The nacked message is ready again once the broker has processed the old
            # channel's close (a loaded 4.3 node answered ready=0, consumers=1 just before).
            for _ in range(100):
                depth = await bare.queue_depth("s.typed")
                if depth.ready == 1 and depth.consumers == 0:
                    break
                await asyncio.sleep(0.1)
            assert depth.ready == 1, depth
        finally:
            await conn.close()
        with pytest.raises(TypeError):
            Session.of("amqp://nowhere")

    broker.run(main())

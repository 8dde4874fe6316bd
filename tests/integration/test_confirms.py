"""ConfirmedPublisher against the broker: every outcome, and what each leaves in the queues."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import aiormq
import pytest
from pamqp import commands as spec

from rmqkit.broker.confirms import ConfirmedPublisher, Outcome
from rmqkit.settings import with_vhost
from tests import broker

pytestmark = pytest.mark.semantics("4.0", "4.3")

Scenario = Callable[[aiormq.abc.AbstractConnection, ConfirmedPublisher], Awaitable[None]]


def _props(**kwargs: Any) -> spec.Basic.Properties:
    return spec.Basic.Properties(delivery_mode=2, **kwargs)


def _run(vhost: str, scenario: Scenario, window: int = 1000) -> None:
    async def main() -> None:
        conn = await aiormq.connect(with_vhost(broker.BASE_URL, vhost))
        try:
            channel = await conn.channel(publisher_confirms=True)
            publisher = ConfirmedPublisher(channel, window=window)
            try:
                await scenario(conn, publisher)
            finally:
                await publisher.close()
        finally:
            await conn.close()

    asyncio.run(main())


async def _declare(conn: aiormq.abc.AbstractConnection, name: str, **arguments: Any) -> None:
    channel = await conn.channel()
    await channel.queue_delete(name)
    await channel.queue_declare(name, durable=True, arguments=arguments or None)
    await channel.close()


async def _bodies(conn: aiormq.abc.AbstractConnection, name: str) -> list[bytes]:
    channel = await conn.channel()
    out: list[bytes] = []
    while True:
        got = await channel.basic_get(name, no_ack=True)
        if isinstance(got.delivery, spec.Basic.GetEmpty):
            await channel.close()
            return out
        out.append(got.body)


def test_a_window_of_publishes_is_confirmed_and_all_arrive(vhost: str) -> None:
    async def scenario(conn: aiormq.abc.AbstractConnection, pub: ConfirmedPublisher) -> None:
        await _declare(conn, "c.many", **{"x-queue-type": "quorum"})
        futures = [
            await pub.publish(
                f"{i}".encode(), exchange="", routing_key="c.many", properties=_props()
            )
            for i in range(5000)
        ]
        assert set(await asyncio.gather(*futures)) == {Outcome.CONFIRMED}
        assert sorted(await _bodies(conn, "c.many")) == sorted(f"{i}".encode() for i in range(5000))

    _run(vhost, scenario, window=100)


def test_nacked_when_a_full_queue_rejects(vhost: str) -> None:
    async def scenario(conn: aiormq.abc.AbstractConnection, pub: ConfirmedPublisher) -> None:
        await _declare(conn, "c.full", **{"x-max-length": 1, "x-overflow": "reject-publish"})
        outcomes = [
            await (await pub.publish(b, exchange="", routing_key="c.full", properties=_props()))
            for b in (b"one", b"two", b"three")
        ]
        assert outcomes == [Outcome.CONFIRMED, Outcome.NACKED, Outcome.NACKED]
        assert not outcomes[1]
        assert await _bodies(conn, "c.full") == [b"one"]

    _run(vhost, scenario)


def test_identical_messages_in_flight_are_both_sent_and_returns_match(vhost: str) -> None:
    async def scenario(conn: aiormq.abc.AbstractConnection, pub: ConfirmedPublisher) -> None:
        await _declare(conn, "c.twins")
        futures = []
        for key in ("c.twins", "c.none", "c.twins", "c.none", "c.twins"):
            props = _props()  # no message_id at all: the case aiormq cannot match
            futures.append(
                await pub.publish(b"same", exchange="", routing_key=key, properties=props)
            )
        outcomes = await asyncio.gather(*futures)
        assert outcomes == [Outcome.CONFIRMED, Outcome.RETURNED] * 2 + [Outcome.CONFIRMED]
        assert await _bodies(conn, "c.twins") == [b"same"] * 3

    _run(vhost, scenario)


def test_a_body_larger_than_a_frame_arrives_whole(vhost: str) -> None:
    big = bytes(range(256)) * 2000  # 512,000 bytes: four body frames at the default frame_max

    async def scenario(conn: aiormq.abc.AbstractConnection, pub: ConfirmedPublisher) -> None:
        await _declare(conn, "c.big")
        settled = await pub.publish(big, exchange="", routing_key="c.big", properties=_props())
        assert await settled is Outcome.CONFIRMED
        assert await _bodies(conn, "c.big") == [big]

    _run(vhost, scenario)


def test_an_unencodable_message_fails_alone(vhost: str) -> None:
    async def scenario(conn: aiormq.abc.AbstractConnection, pub: ConfirmedPublisher) -> None:
        await _declare(conn, "c.enc")
        bad = _props(headers={"x": object()})
        with pytest.raises(TypeError):
            await pub.publish(b"bad", exchange="", routing_key="c.enc", properties=bad)
        good = await pub.publish(b"good", exchange="", routing_key="c.enc", properties=_props())
        assert await good is Outcome.CONFIRMED
        assert await _bodies(conn, "c.enc") == [b"good"]

    _run(vhost, scenario)


def test_a_channel_closed_by_the_broker_confirms_nothing_after_it(vhost: str) -> None:
    async def scenario(conn: aiormq.abc.AbstractConnection, pub: ConfirmedPublisher) -> None:
        await _declare(conn, "c.closed")
        before = await pub.publish(
            b"before", exchange="", routing_key="c.closed", properties=_props()
        )
        assert await before is Outcome.CONFIRMED
        # A publish to a missing exchange is a channel error: the broker closes the channel.
        doomed = [
            await pub.publish(
                b"lost", exchange="no.such.exchange", routing_key="x", properties=_props()
            )
        ]
        for i in range(50):
            try:
                doomed.append(
                    await pub.publish(
                        f"{i}".encode(), exchange="", routing_key="c.closed", properties=_props()
                    )
                )
            except aiormq.exceptions.AMQPError:
                break  # the channel is known closed: publish refuses
        results = await asyncio.gather(*doomed, return_exceptions=True)
        confirmed = [r for r in results if r is Outcome.CONFIRMED]
        assert not confirmed, results
        assert all(isinstance(r, BaseException) for r in results), results
        assert await _bodies(conn, "c.closed") == [b"before"]

    _run(vhost, scenario)


def test_the_same_body_with_different_ids_is_pipelined(vhost: str) -> None:
    async def scenario(conn: aiormq.abc.AbstractConnection, pub: ConfirmedPublisher) -> None:
        await _declare(conn, "c.same")
        futures = [
            await pub.publish(
                b"{}", exchange="", routing_key="c.same", properties=_props(message_id=f"m{i}")
            )
            for i in range(100)
        ]
        # Nothing waited for a confirm: all 100 were sent before the first one came back.
        assert not any(f.done() for f in futures)
        assert set(await asyncio.gather(*futures)) == {Outcome.CONFIRMED}
        assert await _bodies(conn, "c.same") == [b"{}"] * 100

    _run(vhost, scenario)

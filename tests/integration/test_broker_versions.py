"""What the broker does, per version: the rows of docs/broker-versions.md, each checked live.

Every test here passes on 3.10, 4.0 and 4.3 and branches on the version it sees
(``broker.version()``), so a run against one version (``scripts/broker-up --version V --env``)
re-verifies that version's column. Header shapes of the same scenarios are recorded, not
asserted, by scripts/record-headers (tests/unit/recorded/).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import aiormq
import aiormq.exceptions
import pytest
from pamqp.commands import Basic

from rmqkit.settings import with_vhost
from tests import broker
from tests.record_headers import Scenario, raw_headers

pytestmark = pytest.mark.semantics("4.0", "4.3")


def v4() -> bool:
    return bool(broker.version() >= (4, 0))


def v43() -> bool:
    return bool(broker.version() >= (4, 3))


def on_fresh_vhost(
    fresh_vhost: Callable[[], str], body: Callable[[Scenario], Awaitable[Any]]
) -> Any:
    async def run() -> Any:
        conn = await aiormq.connect(with_vhost(broker.BASE_URL, fresh_vhost()))
        try:
            return await body(Scenario(await conn.channel()))
        finally:
            await conn.close()

    return asyncio.run(run())


async def _returns_until_gone(s: Scenario, queue: str, settle: str, most: int) -> int:
    """Return the queue's one message (reject or nack, requeue) until the broker stops handing
    it out or ``most`` returns were made; how many returns it took."""
    returns = 0
    while returns < most:
        try:
            message = await s.take(queue, timeout_s=2)
        except TimeoutError:
            return returns
        if settle == "reject":
            await s.channel.basic_reject(message.delivery_tag, requeue=True)
        else:
            await s.channel.basic_nack(message.delivery_tag, requeue=True)
        returns += 1
    return returns


def test_quorum_default_delivery_limit(fresh_vhost: Callable[[], str]) -> None:
    """4.0+: a quorum queue without x-delivery-limit has a limit of 20 (no DLX: the message is
    dropped after its 20th return... 21st delivery); 3.x: unlimited."""

    async def body(s: Scenario) -> int:
        await s.channel.queue_declare("dl", durable=True, arguments={"x-queue-type": "quorum"})
        await s.publish({}, exchange="", routing_key="dl")
        return await _returns_until_gone(s, "dl", "reject", 25)

    returns = on_fresh_vhost(fresh_vhost, body)
    assert returns == (21 if v4() else 25)


@pytest.mark.parametrize("settle", ["reject", "nack"])
def test_what_counts_toward_the_delivery_limit(fresh_vhost: Callable[[], str], settle: str) -> None:
    """x-delivery-limit 2: reject(requeue) counts on every version; nack(requeue) counts up to
    4.2 and not on 4.3 (only x-acquired-count rises)."""

    async def body(s: Scenario) -> tuple[int, Any]:
        await s.declare(delivery_limit=2, to_parking=True)
        await s.publish({"tenant": "t1"})
        returns = await _returns_until_gone(s, "orders.work", settle, 6)
        parked = await s.channel.queue_declare("orders.work.parking", passive=True)
        return returns, parked.message_count

    returns, parked = on_fresh_vhost(fresh_vhost, body)
    if settle == "nack" and v43():
        assert (returns, parked) == (6, 0)  # never limited
    else:
        assert (returns, parked) == (3, 1)


def test_channel_close_with_the_message_unacked_counts(fresh_vhost: Callable[[], str]) -> None:
    """A consumer that dies holding the message (channel closed, unacked) spends one delivery
    attempt on every version, 4.3 included: how the delivery limit catches crash loops."""

    async def body(s: Scenario) -> Any:
        await s.declare(delivery_limit=5, to_parking=True)
        await s.publish({"tenant": "t1"})
        for _ in range(2):
            channel = await s.channel.connection.channel()
            taken = await channel.basic_get("orders.work", no_ack=False)
            assert isinstance(taken.delivery, Basic.GetOk)
            await channel.close()
        return raw_headers(await s.take())

    headers = on_fresh_vhost(fresh_vhost, body)
    assert headers["x-delivery-count"] == 2
    assert headers.get("x-acquired-count") == (2 if v43() else None)


def test_delivery_annotations(fresh_vhost: Callable[[], str]) -> None:
    """x-delivery-count at 0: sent by 3.10/3.11, omitted from 3.12; x-acquired-count from 4.3."""

    async def body(s: Scenario) -> list[Any]:
        await s.declare()
        await s.publish({"tenant": "t1"})
        seen = []
        for _ in range(2):
            message = await s.take()
            seen.append(raw_headers(message))
            await s.channel.basic_nack(message.delivery_tag, requeue=True)
        return seen

    first, second = on_fresh_vhost(fresh_vhost, body)
    if not v4():
        assert (first, second) == (
            {"tenant": "t1", "x-delivery-count": 0},
            {"tenant": "t1", "x-delivery-count": 1},
        )
    elif not v43():
        assert (first, second) == ({"tenant": "t1"}, {"tenant": "t1", "x-delivery-count": 1})
    else:
        assert (first, second) == ({"tenant": "t1"}, {"tenant": "t1", "x-acquired-count": 1})


def test_client_set_x_death_is_ignored_from_40(fresh_vhost: Callable[[], str]) -> None:
    """A client publishes x-death (count 5 for orders.work/rejected); one broker-driven loop
    later, 3.10 has counted on from it (6), 4.0+ started afresh (1)."""
    forged = [{"count": 5, "queue": "orders.work", "reason": "rejected", "exchange": "orders"}]

    async def body(s: Scenario) -> Any:
        await s.declare()
        await s.publish({"x-death": forged})
        message = await s.take()
        await s.channel.basic_reject(message.delivery_tag, requeue=False)
        return raw_headers(await s.take())  # back from the wait queue

    headers = on_fresh_vhost(fresh_vhost, body)
    rejected = [d for d in headers["x-death"] if d["reason"] == "rejected"]
    assert [d["count"] for d in rejected] == [1 if v4() else 6]
    assert ("x-last-death-reason" in headers) is v4()  # x-last-death-* from 3.13


def test_delivery_count_across_dead_lettering(fresh_vhost: Callable[[], str]) -> None:
    """x-delivery-count of a parked message (limit 2, three rejects): 3.10 resets it to 0, 4.0
    drops it, 4.3 carries it into the parking queue (3): a parking queue with a delivery limit
    would start spending it there."""

    async def body(s: Scenario) -> Any:
        await s.declare(delivery_limit=2, to_parking=True)
        await s.publish({"tenant": "t1"})
        await _returns_until_gone(s, "orders.work", "reject", 6)
        return raw_headers(await s.take("orders.work.parking"))

    parked = on_fresh_vhost(fresh_vhost, body)
    expected = 3 if v43() else (None if v4() else 0)
    assert parked.get("x-delivery-count") == expected


@pytest.mark.parametrize("queue_type", ["classic", "quorum"])
def test_empty_and_absent_headers(fresh_vhost: Callable[[], str], queue_type: str) -> None:
    """An empty headers table and no table at all come back as sent, except on 3.10 quorum
    queues, which add x-delivery-count: 0 to both."""

    async def body(s: Scenario) -> list[Any]:
        await s.channel.queue_declare("q", durable=True, arguments={"x-queue-type": queue_type})
        out = []
        for headers in ({}, None):
            await s.publish(headers, exchange="", routing_key="q")
            message = await s.take("q")
            out.append(raw_headers(message))
            await s.channel.basic_ack(message.delivery_tag)
        return out

    empty, absent = on_fresh_vhost(fresh_vhost, body)
    if queue_type == "quorum" and not v4():
        assert (empty, absent) == ({"x-delivery-count": 0}, {"x-delivery-count": 0})
    else:
        assert (empty, absent) == ({}, None)


def test_quorum_queue_priorities_from_40(fresh_vhost: Callable[[], str]) -> None:
    """4.0+: quorum queues deliver priority 5 and up ahead of normal messages; 3.10: FIFO."""

    async def body(s: Scenario) -> list[str | None]:
        await s.channel.queue_declare("q", durable=True, arguments={"x-queue-type": "quorum"})
        for message_id, priority in (("normal", 0), ("high", 9)):
            props = Basic.Properties(message_id=message_id, priority=priority, delivery_mode=2)
            await s.channel.basic_publish(b"", routing_key="q", properties=props)
        order = []
        for _ in range(2):
            message = await s.take("q")
            order.append(message.header.properties.message_id)
            await s.channel.basic_ack(message.delivery_tag)
        return order

    assert on_fresh_vhost(fresh_vhost, body) == (["high", "normal"] if v4() else ["normal", "high"])


def test_streams_drop_array_and_table_headers(fresh_vhost: Callable[[], str]) -> None:
    """An AMQP 0-9-1 consumer of a stream gets no array- or table-typed header back, x-death
    included, on 3.10 and still on 4.0 and 4.3: a stream cannot hold parked messages' history."""

    async def body(s: Scenario) -> Any:
        await s.channel.queue_declare("s", durable=True, arguments={"x-queue-type": "stream"})
        headers = {"s": "x", "arr": [1, "two"], "tbl": {"a": 1}, "x-death": [{"count": 1}]}
        await s.publish(headers, exchange="", routing_key="s")
        await s.channel.basic_qos(prefetch_count=10)
        got: asyncio.Future[Any] = asyncio.get_running_loop().create_future()

        async def on_message(message: Any) -> None:
            if not got.done():
                got.set_result(raw_headers(message))

        await s.channel.basic_consume("s", on_message, arguments={"x-stream-offset": "first"})
        return await asyncio.wait_for(got, 10)

    assert on_fresh_vhost(fresh_vhost, body) == {"s": "x", "x-stream-offset": 0}


def test_if_unused_delete_of_a_quorum_queue_closes_the_connection(
    fresh_vhost: Callable[[], str],
) -> None:
    """queue.delete with if-unused: NOT_IMPLEMENTED for quorum queues, connection closed, on
    every version here (aio-pika's Queue.delete() defaults to if_unused=True)."""

    async def body(s: Scenario) -> None:
        await s.channel.queue_declare("q", durable=True, arguments={"x-queue-type": "quorum"})
        await s.channel.queue_delete("q", if_unused=True)

    with pytest.raises(aiormq.exceptions.ConnectionNotImplemented):
        on_fresh_vhost(fresh_vhost, body)


def test_gets_of_a_message_under_a_limit_are_returns(fresh_vhost: Callable[[], str]) -> None:
    """basic.get + nack(requeue) -- how rmqkit browses -- spends delivery attempts up to 4.2:
    why a parking queue must have no limit. On 4.3 only reject-requeue does."""

    async def body(s: Scenario) -> int:
        await s.declare(delivery_limit=1, to_parking=True)
        await s.publish({"tenant": "t1"})
        return await _returns_until_gone(s, "orders.work", "nack", 4)

    assert on_fresh_vhost(fresh_vhost, body) == (4 if v43() else 2)

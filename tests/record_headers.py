"""Record the header shapes a real broker hands a consumer, for tests/unit/test_attempts.py.

    scripts/record-headers --version 4.0|4.3|3.10   (or: python -m tests.record_headers OUT.py)

Runs each scenario below on the broker under test (RMQKIT_TEST_URL, RMQKIT_TEST_MANAGEMENT_URL,
as the suite does) in a throwaway vhost of its own, and writes a Python module of the headers as
pamqp decodes them (the table aio-pika hands a consumer: long strings ``str``, ``count`` ``int``,
``time`` an aware datetime; ``None`` where the message had no headers table at all, which
aio-pika turns into ``{}``). Nothing is constructed: every value in the output came off the wire.

Every scenario uses the same topology, named as in test_attempts.py: topic exchange ``orders``,
quorum queue ``orders.work`` (bound with ``orders.#``, dead-lettering through the default
exchange to ``orders.work.wait.0``), quorum wait queue ``orders.work.wait.0`` (message TTL 200 ms,
dead-lettering back to ``orders.work``) and ``orders.work.parking``. Messages are taken with
``basic.get`` (the same message annotations as a consumer's ``basic.deliver``).
"""

from __future__ import annotations

import asyncio
import datetime
import importlib.metadata
import pprint
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import aiormq
from pamqp.commands import Basic

from rmqkit import headers as h
from rmqkit.broker.codec.properties import TypedProperties
from rmqkit.settings import with_vhost
from tests import broker

TTL_MS = 200
Headers = dict[str, Any] | None


class Scenario:
    """One fresh vhost with the topology; helpers to publish, take and settle messages."""

    def __init__(self, channel: aiormq.abc.AbstractChannel) -> None:
        self.channel = channel

    async def declare(self, *, delivery_limit: int | None = None, to_parking: bool = False) -> None:
        ch = self.channel
        await ch.exchange_declare("orders", exchange_type="topic", durable=True)
        work: dict[str, Any] = {
            "x-queue-type": "quorum",
            "x-dead-letter-exchange": "",
            "x-dead-letter-routing-key": "orders.work.parking"
            if to_parking
            else "orders.work.wait.0",
        }
        if delivery_limit is not None:
            work["x-delivery-limit"] = delivery_limit
        await ch.queue_declare("orders.work", durable=True, arguments=work)
        await ch.queue_bind("orders.work", "orders", routing_key="orders.#")
        wait = {
            "x-queue-type": "quorum",
            "x-message-ttl": TTL_MS,
            "x-dead-letter-exchange": "",
            "x-dead-letter-routing-key": "orders.work",
        }
        await ch.queue_declare("orders.work.wait.0", durable=True, arguments=wait)
        await ch.queue_declare(
            "orders.work.parking", durable=True, arguments={"x-queue-type": "quorum"}
        )

    async def publish(
        self,
        headers: Headers,
        *,
        exchange: str = "orders",
        routing_key: str = "orders.created",
        expiration: str | None = None,
    ) -> None:
        props = TypedProperties(
            message_id="m1", delivery_mode=2, headers=headers, expiration=expiration
        )
        confirm = await self.channel.basic_publish(
            b"body", exchange=exchange, routing_key=routing_key, properties=props, mandatory=True
        )
        assert isinstance(confirm, Basic.Ack), confirm

    async def take(self, queue: str = "orders.work", timeout_s: float = 10) -> Any:
        """basic.get until a message arrives (it may still be in a wait queue)."""
        deadline = time.monotonic() + timeout_s
        while True:
            message = await self.channel.basic_get(queue, no_ack=False)
            if isinstance(message.delivery, Basic.GetOk):
                return message
            if time.monotonic() > deadline:
                raise TimeoutError(f"no message in {queue} after {timeout_s}s")
            await asyncio.sleep(0.05)

    async def empty(self, queue: str) -> bool:
        declared = await self.channel.queue_declare(queue, passive=True)
        return declared.message_count == 0


def raw_headers(message: Any) -> Headers:
    value: Headers = message.header.properties.headers
    return value


async def first_delivery(s: Scenario) -> Headers:
    await s.publish({"tenant": "t1"})
    return raw_headers(await s.take())


async def empty_headers_table(s: Scenario) -> Headers:
    await s.publish({})
    return raw_headers(await s.take())


async def _requeued_twice(s: Scenario, settle: str) -> Headers:
    await s.publish({"tenant": "t1"})
    for _ in range(2):
        message = await s.take()
        if settle == "reject":
            await s.channel.basic_reject(message.delivery_tag, requeue=True)
        else:
            await s.channel.basic_nack(message.delivery_tag, requeue=True)
    return raw_headers(await s.take())


async def rejected_requeue_twice(s: Scenario) -> Headers:
    return await _requeued_twice(s, "reject")


async def nacked_requeue_twice(s: Scenario) -> Headers:
    return await _requeued_twice(s, "nack")


async def _broker_loop(s: Scenario, delivery: int) -> Headers:
    await s.publish({"tenant": "t1"})
    for _ in range(delivery - 1):
        message = await s.take()
        await s.channel.basic_reject(message.delivery_tag, requeue=False)
    return raw_headers(await s.take())


async def broker_loop_delivery_2(s: Scenario) -> Headers:
    return await _broker_loop(s, 2)


async def broker_loop_delivery_3(s: Scenario) -> Headers:
    return await _broker_loop(s, 3)


async def named_exchange_loop(s: Scenario) -> Headers:
    """Expiration 60 s, one nack-requeue, then a reject: the delivery back from the wait queue."""
    await s.publish({"tenant": "t1"}, expiration="60000")
    message = await s.take()
    await s.channel.basic_nack(message.delivery_tag, requeue=True)
    message = await s.take()
    await s.channel.basic_reject(message.delivery_tag, requeue=False)
    return raw_headers(await s.take())


async def _republished(s: Scenario, *, strip: bool) -> Headers:
    """rmqkit's retry: a copy (attempt header set; x-* stripped or not) into the wait queue,
    the original acked; the copy expires back to orders.work. Two rounds, so a kept x-death
    would have been read back by the broker (3.10 increments it; 4.0+ ignores it)."""
    await s.publish({"tenant": "t1"})
    for attempt in (1, 2, 3):
        message = await s.take()
        received = dict(raw_headers(message) or {})
        copy = h.strip_broker_headers(received) if strip else received
        copy.update(
            {
                h.ATTEMPT: attempt,
                h.ORIGINAL_EXCHANGE: "orders",
                h.ORIGINAL_ROUTING_KEY: "orders.created",
            }
        )
        await s.publish(copy, exchange="", routing_key="orders.work.wait.0")
        await s.channel.basic_ack(message.delivery_tag)
    return raw_headers(await s.take())


async def republished_stripped(s: Scenario) -> Headers:
    return await _republished(s, strip=True)


async def republished_unstripped(s: Scenario) -> Headers:
    return await _republished(s, strip=False)


async def delivery_limit_parked(s: Scenario) -> Headers:
    """x-delivery-limit 2, reject(requeue=True) until the broker dead-letters it to parking."""
    await s.declare(delivery_limit=2, to_parking=True)
    await s.publish({"tenant": "t1"})
    deadline = time.monotonic() + 10
    rejected = 0  # a requeued message is back a moment later: poll, do not count gets
    while rejected < 10 and time.monotonic() < deadline:
        if await s.empty("orders.work") and not await s.empty("orders.work.parking"):
            break
        message = await s.channel.basic_get("orders.work", no_ack=False)
        if isinstance(message.delivery, Basic.GetOk):
            await s.channel.basic_reject(message.delivery_tag, requeue=True)
            rejected += 1
        else:
            await asyncio.sleep(0.05)
    return raw_headers(await s.take("orders.work.parking"))


async def nacked_past_the_limit(s: Scenario) -> Headers:
    """x-delivery-limit 2, nack(requeue=True) 4 times: the 5th delivery's headers if the message
    is still there (4.3: nack-requeue does not count), else its parked copy's."""
    await s.declare(delivery_limit=2, to_parking=True)
    await s.publish({"tenant": "t1"})
    try:
        for _ in range(4):
            message = await s.take(timeout_s=2)
            await s.channel.basic_nack(message.delivery_tag, requeue=True)
        return raw_headers(await s.take(timeout_s=2))
    except TimeoutError:  # the limit was hit: the parked copy
        return {"parked": raw_headers(await s.take("orders.work.parking"))}


SCENARIOS: dict[str, Callable[[Scenario], Awaitable[Headers]]] = {
    "FIRST_DELIVERY": first_delivery,
    "EMPTY_HEADERS_TABLE": empty_headers_table,
    "REJECTED_REQUEUE_TWICE": rejected_requeue_twice,
    "NACKED_REQUEUE_TWICE": nacked_requeue_twice,
    "BROKER_LOOP_DELIVERY_2": broker_loop_delivery_2,
    "BROKER_LOOP_DELIVERY_3": broker_loop_delivery_3,
    "NAMED_EXCHANGE_LOOP": named_exchange_loop,
    "REPUBLISHED_STRIPPED": republished_stripped,
    "REPUBLISHED_UNSTRIPPED": republished_unstripped,
    "DELIVERY_LIMIT_PARKED": delivery_limit_parked,
    "NACKED_PAST_THE_LIMIT": nacked_past_the_limit,
}
DECLARES_ITS_OWN = {"DELIVERY_LIMIT_PARKED", "NACKED_PAST_THE_LIMIT"}


async def record(name: str) -> Headers:
    vhost = broker.create_vhost(f"rec-{name.lower()[:20]}")
    try:
        conn = await aiormq.connect(with_vhost(broker.BASE_URL, vhost))
        try:
            channel = await conn.channel()
            scenario = Scenario(channel)
            if name not in DECLARES_ITS_OWN:
                await scenario.declare()
            return await SCENARIOS[name](scenario)
        finally:
            await conn.close()
    finally:
        broker.delete_vhost(vhost)


def render(results: dict[str, Headers]) -> str:
    overview = broker.api("GET", "/overview").json()
    versions = ", ".join(
        f"{lib} {importlib.metadata.version(lib)}" for lib in ("aio-pika", "aiormq", "pamqp")
    )
    lines = [
        f'"""Headers RECORDED from RabbitMQ {overview["rabbitmq_version"]} (Erlang '
        f"{overview.get('erlang_version', '?')}, node {overview['node']}).",
        "",
        "Written by scripts/record-headers (tests/record_headers.py, which describes each",
        f"scenario) on {datetime.datetime.now(datetime.UTC):%Y-%m-%d %H:%M} UTC with {versions}.",
        "Do not edit by hand: re-run the script. Timestamps are the broker's, whole seconds.",
        '"""',
        "",
        "import datetime",
        "from typing import Any",
        "",
        f'RABBITMQ_VERSION = "{overview["rabbitmq_version"]}"',
    ]
    for name, value in results.items():
        text = pprint.pformat(value, width=96, sort_dicts=False)
        text = text.replace("datetime.timezone.utc", "datetime.UTC")  # as ruff writes it
        lines += ["", f"{name}: Any = {text}"]
    return "\n".join(lines) + "\n"


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python -m tests.record_headers OUT.py", file=sys.stderr)
        return 2
    results = {}
    for name in SCENARIOS:
        results[name] = asyncio.run(record(name))
        print(f"recorded {name}", file=sys.stderr)
    Path(argv[0]).write_text(render(results))
    print(f"wrote {argv[0]}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))

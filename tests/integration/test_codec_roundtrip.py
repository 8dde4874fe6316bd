"""export → purge → import against the real broker keeps bodies and every AMQP field type.

Messages are published with ``TypedProperties`` through ``aiormq.Channel.basic_publish`` (the
exact types go on the wire), read back as ``DeliveredMessage`` on a connection opened with
``pamqp_hook.connect_typed``, exported to NDJSON lines, left in the queue (nack + requeue), purged,
imported from the lines, and read again. Bodies must be byte-identical and properties and
headers equal *including type tags*.

Broker-owned headers are left out of the comparison: only ``x-delivery-count``, which quorum
queues add to every delivery (type ``l``, also at 0, on 3.10/3.11) and overwrite when a client
sets it. Observed and pinned by ``test_what_the_broker_does_with_types``: on RabbitMQ 3.10.8
classic queues return the content header byte for byte; quorum queues re-encode it, keep every
tag except ``L`` (returned as ``l``), sort the top-level header keys and add ``x-delivery-count``
at 0 (so a message published without headers comes back with a table). On 4.0.5 and 4.3.6 both
queue types re-encode it that way (messages are converted on the way in), and nothing is added
at 0: no headers stay no headers, an empty table stays empty. NaN and ±infinity are refused
(connection closed), so the property test draws finite floats only.

The vhost comes from the ``vhost`` fixture (tests/conftest.py): created with the management API
(``PUT /api/vhosts/NAME``, ``PUT /api/permissions/NAME/guest``) and deleted after the module.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from typing import Any

import aiormq
import aiormq.exceptions
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pamqp import commands as spec
from pamqp.common import FieldValue

from rmqkit.broker.codec import fieldtypes
from rmqkit.broker.codec import hook as pamqp_hook
from rmqkit.broker.codec.fieldtypes import (
    AmqpDecimal,
    Float32,
    Float64,
    Int8,
    Int16,
    Int32,
    Int64,
    Int64L,
    Timestamp,
    UInt8,
    UInt16,
    UInt32,
)
from rmqkit.broker.codec.properties import TypedProperties
from rmqkit.parking import records
from rmqkit.settings import with_vhost
from tests import broker
from tests.unit.test_codec import shortstr, tables

pytestmark = [pytest.mark.broker, pytest.mark.semantics("4.0", "4.3")]

BROKER_OWNED = frozenset({"x-delivery-count"})
QUEUES: dict[str, dict[str, FieldValue]] = {"quorum": {"x-queue-type": "quorum"}, "classic": {}}


@pytest.fixture(scope="module")
def url(vhost: str) -> Iterator[str]:
    address = with_vhost(broker.BASE_URL, vhost)

    async def declare() -> None:
        conn = await aiormq.connect(address)
        channel = await conn.channel()
        for name, arguments in QUEUES.items():
            await channel.queue_declare(name, durable=True, arguments=arguments)
        await conn.close()

    asyncio.run(declare())
    yield address


# ------------------------------------------------------------------------------------------------
# Helpers: publish, export (non-destructive), purge, import, drain
# ------------------------------------------------------------------------------------------------


async def publish(url: str, queue: str, messages: list[tuple[TypedProperties, bytes]]) -> None:
    conn = await aiormq.connect(url)
    try:
        channel = await conn.channel()  # publisher confirms on
        for properties, body in messages:
            confirm = await channel.basic_publish(
                body, exchange="", routing_key=queue, properties=properties, mandatory=True
            )
            assert isinstance(confirm, spec.Basic.Ack)
    finally:
        await conn.close()


async def export(url: str, queue: str, *, remove: bool) -> list[str]:
    """Every message as an NDJSON line, read with basic.get on a typed connection.

    ``remove=False`` returns them to the queue afterwards (nack + requeue), as ``export`` does
    without ``--remove``.
    """
    conn = await pamqp_hook.connect_typed(url)
    lines: list[str] = []
    try:
        channel = await conn.channel()
        last_tag = 0
        while True:
            message = await channel.basic_get(queue, no_ack=False)
            if isinstance(message.delivery, spec.Basic.GetEmpty):
                break
            delivery = message.delivery
            assert isinstance(delivery, spec.Basic.GetOk)
            properties = message.header.properties
            assert isinstance(properties, TypedProperties)
            info = records.delivery_info(delivery, queue=queue)
            record = records.message_to_record(properties, message.body, delivery_info=info)
            lines.append(records.dumps_record(record))
            last_tag = int(delivery.delivery_tag or 0)
        if last_tag:
            if remove:
                await channel.basic_ack(last_tag, multiple=True)
            else:
                await channel.basic_nack(last_tag, multiple=True, requeue=True)
    finally:
        await conn.close()
    return lines


async def purge(url: str, queue: str, expected: int) -> None:
    conn = await aiormq.connect(url)
    try:
        channel = await conn.channel()
        purged = await channel.queue_purge(queue)
        assert purged.message_count == expected
    finally:
        await conn.close()


async def import_lines(url: str, queue: str, lines: list[str]) -> None:
    messages = [
        records.record_to_message(records.loads_record(line, number, source="export.ndjson"))
        for number, line in enumerate(lines, start=1)
    ]
    await publish(url, queue, messages)


async def round_trip(
    url: str, queue: str, messages: list[tuple[TypedProperties, bytes]]
) -> tuple[list[str], list[str]]:
    """Publish, export, purge, import, drain: the exported lines and the lines after import."""
    await purge_all(url, queue)
    await publish(url, queue, messages)
    exported = await export(url, queue, remove=False)
    await purge(url, queue, expected=len(messages))
    await import_lines(url, queue, exported)
    after = await export(url, queue, remove=True)
    return exported, after


async def purge_all(url: str, queue: str) -> None:
    conn = await aiormq.connect(url)
    try:
        channel = await conn.channel()
        await channel.queue_purge(queue)
    finally:
        await conn.close()


def comparable(line: str) -> str:
    """Properties (broker-owned headers left out) and body of one line, as canonical text."""
    record = json.loads(line)
    properties = dict(record["properties"])
    headers = {k: v for k, v in properties.get("headers", {}).items() if k not in BROKER_OWNED}
    if headers or "headers" in properties:
        properties["headers"] = headers
    return json.dumps({"properties": properties, "body": record["body"]}, sort_keys=True)


def reencodes(queue: str) -> bool:
    """Does the broker re-encode headers on this queue type ('L' back as 'l', keys sorted)?
    Version difference: on 3.10 only quorum queues do; from 4.0 every queue type does (the
    message container converts the content on the way in)."""
    return queue == "quorum" or broker.version() >= (4, 0)


def adds_delivery_count(queue: str) -> bool:
    """Version difference: 3.10 quorum queues add x-delivery-count even at 0 (3.12+ omit it)."""
    return queue == "quorum" and broker.version() < (3, 12)


def as_published(properties: TypedProperties, body: bytes, queue: str) -> str:
    """What the first export should hold for a message we published, on this queue type."""
    record = records.message_to_record(properties, body, delivery_info={})
    if reencodes(queue):
        record = json.loads(json.dumps(record).replace('{"t": "L"', '{"t": "l"'))
    if adds_delivery_count(queue):
        record["properties"].setdefault("headers", {})  # the broker adds x-delivery-count
    return comparable(json.dumps(record))


def assert_round_trip(
    queue: str,
    messages: list[tuple[TypedProperties, bytes]],
    exported: list[str],
    after: list[str],
) -> None:
    assert len(exported) == len(after) == len(messages)
    if queue == "quorum" and broker.version() >= (4, 0):
        # Version difference: 4.0 quorum queues have two priority levels (priority 5 and up is
        # high, delivered ahead of normal ones), so with mixed priorities the export order is
        # not the publish order (3.10 quorum queues ignore priority): compare as multisets.
        assert sorted(map(comparable, after)) == sorted(map(comparable, exported))
        published = [as_published(properties, body, queue) for properties, body in messages]
        assert sorted(map(comparable, exported)) == sorted(published)
        imported = [records.record_to_message(json.loads(line))[1] for line in after]
        assert sorted(imported) == sorted(body for _, body in messages)  # byte-identical
        return
    for (properties, body), first, second in zip(messages, exported, after, strict=True):
        assert comparable(second) == comparable(first)  # export → purge → import is exact
        assert comparable(first) == as_published(properties, body, queue)  # and so was export
        _, imported_body = records.record_to_message(json.loads(second))
        assert imported_body == body  # byte-identical


# ------------------------------------------------------------------------------------------------
# Every field type and every property, once
# ------------------------------------------------------------------------------------------------

EVERY_TYPE: dict[str, Any] = {
    "bool": True,
    "b": Int8(-128),
    "B": UInt8(255),
    "s": Int16(-32768),
    "u": UInt16(65535),
    "I": Int32(-(2**31)),
    "i": UInt32(2**32 - 1),
    "l": Int64(-(2**63)),
    "L": Int64L(2**63 - 1),
    "f": Float32(1.5),
    "d": Float64(0.1),
    "d-negative-zero": Float64(-0.0),
    "D": AmqpDecimal("-12345.6789"),
    "D-scale": AmqpDecimal("0E-255"),
    "S": "hello, wörld",
    "S-not-utf8": b"\xff\xfe\x00",
    "x": bytearray(b"\x00\x01\xff"),
    "T": Timestamp(1_700_000_000),
    "T-ms": Timestamp(1_700_000_000_123),
    "T-max": Timestamp(2**64 - 1),
    "V": None,
    "A": [Int8(1), UInt16(2), "three", [None, False], {"k": Float32(-2.5)}],
    "F": {"zz": Int32(1), "aa": {"deeper": [AmqpDecimal("1.50"), bytearray(b"")]}},
    "x-death": [{"count": Int64(3), "queue": "orders.work", "time": Timestamp(1_700_000_000)}],
    "key-\udcff-not-utf8": UInt32(7),
    "": Int8(0),
}


def every_property(**changes: Any) -> TypedProperties:
    values: dict[str, Any] = {
        "content_type": "application/octet-stream",
        "content_encoding": "identity",
        "headers": EVERY_TYPE,
        "delivery_mode": 2,
        "priority": 7,
        "correlation_id": "corr-1",
        "reply_to": "replies",
        "expiration": "86400000",
        "message_id": "msg-\udcfe-1",
        "timestamp": Timestamp(1_700_000_000_123),
        "message_type": "order.created",
        "user_id": "guest",  # RabbitMQ refuses any other than the publishing user
        "app_id": "rmqkit-tests",
        "cluster_id": "legacy",
    }
    values.update(changes)
    return TypedProperties(**values)


@pytest.mark.parametrize("queue", list(QUEUES))
def test_every_field_type_and_property_round_trips(url: str, queue: str) -> None:
    messages = [
        (every_property(), b"\x00\xffbinary body\x80"),
        (every_property(message_id="text-1"), "a UTF-8 body: żółw".encode()),
        (every_property(message_id="big-1"), bytes(range(256)) * 1200),  # > frame_max (128 KiB)
        (every_property(message_id="", content_type="", headers={}), b""),  # present but empty
        (TypedProperties(), b"no properties at all"),
    ]
    exported, after = asyncio.run(round_trip(url, queue, messages))
    assert_round_trip(queue, messages, exported, after)
    first = json.loads(exported[0])
    assert first["properties"]["headers"]["s"] == {"t": "s", "v": -32768}
    assert first["properties"]["headers"]["B"] == {"t": "B", "v": 255}
    assert first["properties"]["timestamp"] == 1_700_000_000_123  # not divided by 1000
    assert "body_text" not in first and json.loads(exported[1])["body_text"].endswith("żółw")
    empty = json.loads(exported[3])["properties"]
    assert empty["message_id"] == "" and empty["content_type"] == ""  # not replaced by aiormq


# ------------------------------------------------------------------------------------------------
# Property-based: random messages the broker accepts
# ------------------------------------------------------------------------------------------------


@st.composite
def broker_messages(draw: st.DrawFn, /) -> tuple[TypedProperties, bytes]:
    def maybe(strategy: st.SearchStrategy[Any]) -> Any:
        return draw(st.one_of(st.none(), strategy))

    properties = TypedProperties(
        content_type=maybe(shortstr()),
        content_encoding=maybe(shortstr()),
        headers=maybe(tables(finite_floats=True, max_leaves=15)),
        delivery_mode=maybe(st.sampled_from([1, 2])),
        priority=maybe(st.integers(0, 255)),
        correlation_id=maybe(shortstr()),
        reply_to=maybe(shortstr()),
        expiration=maybe(st.integers(3_600_000, 10**9).map(str)),  # long enough not to expire
        message_id=maybe(shortstr()),
        timestamp=maybe(st.integers(0, 2**64 - 1).map(Timestamp)),
        message_type=maybe(shortstr()),
        user_id=maybe(st.just("guest")),
        app_id=maybe(shortstr()),
        cluster_id=maybe(shortstr()),
    )
    body = draw(st.one_of(st.binary(max_size=300), st.text(max_size=100).map(str.encode)))
    return properties, body


@pytest.mark.parametrize("queue", list(QUEUES))
@settings(
    max_examples=30,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(messages=st.lists(broker_messages(), min_size=1, max_size=4))
def test_random_messages_round_trip(
    url: str, queue: str, messages: list[tuple[TypedProperties, bytes]]
) -> None:
    exported, after = asyncio.run(round_trip(url, queue, messages))
    assert_round_trip(queue, messages, exported, after)


# ------------------------------------------------------------------------------------------------
# What RabbitMQ does with the types (pins the facts the docs state)
# ------------------------------------------------------------------------------------------------


def test_what_the_broker_does_with_types(url: str) -> None:
    headers: dict[str, fieldtypes.FieldValue] = {
        "zz": Int64L(-1),
        "aa": UInt8(200),
        "n": {"z": Int8(1), "a": Int8(2)},
    }
    message = [(TypedProperties(headers=headers, message_id="m"), b"")]

    def read(queue: str) -> dict[str, Any]:
        lines = asyncio.run(export(url, queue, remove=True))
        result: dict[str, Any] = json.loads(lines[0])["properties"]["headers"]
        return result

    asyncio.run(purge_all(url, "classic"))
    asyncio.run(publish(url, "classic", message))
    classic = read("classic")
    if reencodes("classic"):  # 4.0+: re-encoded like a quorum queue's (see reencodes)
        assert list(classic) == ["aa", "n", "zz"]
        assert classic["zz"] == {"t": "l", "v": -1}
    else:  # 3.10
        assert list(classic) == ["zz", "aa", "n"]  # byte for byte: order and 'L' kept
        assert classic["zz"] == {"t": "L", "v": -1}

    asyncio.run(purge_all(url, "quorum"))
    asyncio.run(publish(url, "quorum", message))
    quorum = read("quorum")
    if adds_delivery_count("quorum"):  # 3.10
        assert list(quorum) == ["aa", "n", "x-delivery-count", "zz"]  # re-encoded, keys sorted
        assert quorum["x-delivery-count"] == {"t": "l", "v": 0}
    else:  # 4.0+: omitted at 0
        assert list(quorum) == ["aa", "n", "zz"]
    assert quorum["zz"] == {"t": "l", "v": -1}  # 'L' comes back as 'l'
    assert quorum["aa"] == {"t": "B", "v": 200}  # unsigned kept
    assert list(quorum["n"]["v"]) == ["z", "a"]  # nested order kept


@pytest.mark.parametrize("value", [Float64(float("nan")), Float32(float("inf"))])
def test_broker_refuses_nan_and_infinity(url: str, value: float) -> None:
    message = [(TypedProperties(headers={"f": value}, message_id="m"), b"")]
    with pytest.raises(aiormq.exceptions.AMQPError):
        asyncio.run(publish(url, "classic", message))

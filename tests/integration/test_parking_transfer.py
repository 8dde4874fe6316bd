"""export → purge → import through rmqkit's parking commands leaves every message as it was:
bodies byte-identical, properties and headers equal including each AMQP field type."""

from __future__ import annotations

import asyncio
import io
import json
from pathlib import Path
from typing import Any

import aiormq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rmqkit.broker.codec.properties import TypedProperties
from rmqkit.parking.model import ParkedFilter
from rmqkit.parking.ops import purge_parked
from rmqkit.parking.replay import replay_parked
from rmqkit.parking.transfer import export_parked, import_records, read_export
from rmqkit.settings import with_vhost
from tests import broker
from tests.integration.test_codec_roundtrip import broker_messages, every_property

pytestmark = pytest.mark.semantics("4.0", "4.3")

PARKING = "t.work.parking"
TOPOLOGY = '[queues."t.work"]\nretry_delays = ["1s"]\n'
BROKER_OWNED = {"x-delivery-count", "x-acquired-count"}


@pytest.fixture(scope="module")
def parking(vhost: str, tmp_path_factory: pytest.TempPathFactory) -> str:
    path = tmp_path_factory.mktemp("topology") / "t.toml"
    path.write_text(TOPOLOGY)
    assert broker.cli("declare", str(path), vhost=vhost).returncode == 0
    return vhost


async def _publish(vhost: str, messages: list[tuple[TypedProperties, bytes]]) -> None:
    conn = await aiormq.connect(with_vhost(broker.BASE_URL, vhost))
    try:
        channel = await conn.channel()
        for properties, body in messages:
            await channel.basic_publish(body, routing_key=PARKING, properties=properties)
    finally:
        await conn.close()


def _comparable(record: dict[str, Any]) -> str:
    properties = dict(record["properties"])
    headers = {k: v for k, v in properties.get("headers", {}).items() if k not in BROKER_OWNED}
    properties["headers"] = headers
    return json.dumps({"properties": properties, "body": record["body"]}, sort_keys=True)


async def _export(vhost: str) -> list[dict[str, Any]]:
    out = io.StringIO()
    await export_parked(broker.settings_for(vhost), PARKING, ParkedFilter(), out)
    return [json.loads(line) for line in out.getvalue().split("\n") if line]


async def _round_trip(vhost: str, messages: list[tuple[TypedProperties, bytes]]) -> None:
    await _publish(vhost, messages)
    first = await _export(vhost)
    assert len(first) == len(messages)
    removed = await purge_parked(broker.settings_for(vhost), PARKING, ParkedFilter())
    assert removed.count == len(messages)
    report = await import_records(broker.settings_for(vhost), first, PARKING)
    assert report.published == len(messages)
    second = await _export(vhost)
    assert sorted(map(_comparable, second)) == sorted(map(_comparable, first))
    await purge_parked(broker.settings_for(vhost), PARKING, ParkedFilter())


def test_every_field_type_survives_export_purge_import(parking: str) -> None:
    messages = [
        (every_property(), b"\x00\xffbinary body\x80"),
        (every_property(message_id="text-1"), "a UTF-8 body: żółw".encode()),
    ]
    asyncio.run(_round_trip(parking, messages))


@settings(
    max_examples=15,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(messages=st.lists(broker_messages(), min_size=1, max_size=4))
def test_random_messages_survive_export_purge_import(
    parking: str, messages: list[tuple[TypedProperties, bytes]]
) -> None:
    asyncio.run(_round_trip(parking, messages))


def test_cli_export_remove_then_import(parking: str, tmp_path: Path) -> None:
    v = parking
    asyncio.run(
        _publish(v, [(every_property(message_id=f"m-{i}"), b"body %d" % i) for i in range(50)])
    )
    out = tmp_path / "parked.ndjson"
    refused = broker.cli("parking", "export", PARKING, "--remove", vhost=v)
    assert refused.returncode == 64 and "--output" in refused.stderr
    kept = broker.cli("parking", "export", PARKING, vhost=v)
    assert kept.returncode == 0 and len(kept.stdout.splitlines()) == 50
    assert broker.depths(v, [PARKING])[PARKING] == 50
    moved = broker.cli("parking", "export", PARKING, "-o", str(out), "--remove", vhost=v)
    assert moved.returncode == 0, moved.stderr
    assert len(read_export(out)) == 50 and broker.depths(v, [PARKING])[PARKING] == 0
    back = broker.cli("parking", "import", str(out), PARKING, vhost=v)
    assert back.returncode == 0 and "imported 50 of 50" in back.stderr
    again = broker.cli("parking", "export", PARKING, vhost=v)
    assert sorted(map(_comparable, map(json.loads, again.stdout.splitlines()))) == sorted(
        _comparable(line.record) for line in read_export(out)
    )
    bad = tmp_path / "bad.ndjson"
    bad.write_text(out.read_text().splitlines()[0] + "\n{not json\n")
    broken = broker.cli("parking", "import", str(bad), PARKING, vhost=v)
    assert broken.returncode == 65 and f"{bad}:2" in broken.stderr
    assert broker.depths(v, [PARKING])[PARKING] == 50  # nothing published from a bad file


async def _get_headers(vhost: str, queue: str) -> dict[str, Any]:
    conn = await aiormq.connect(with_vhost(broker.BASE_URL, vhost))
    try:
        channel = await conn.channel()
        got = await channel.basic_get(queue, no_ack=True)
        assert got.header is not None
        return dict(got.header.properties.headers or {})
    finally:
        await conn.close()


def test_import_never_publishes_the_exporting_queues_delivery_counts(parking: str) -> None:
    """x-delivery-count / x-acquired-count are the exporting queue's annotations of its own
    deliveries (they rise with every browse), not message content: an import leaves them out and
    the target queue keeps its own. On 7cb9a46 a classic target handed the file's numbers (7, 9)
    to its consumers as if they were the message's."""
    target = "t.classic"
    arguments = {"x-queue-type": "classic"}
    body_ = {"durable": True, "auto_delete": False, "arguments": arguments}
    broker.api("PUT", f"/queues/{broker.q(parking)}/{broker.q(target)}", json=body_)
    record = {
        "rmqkit_export": 1,
        "properties": {
            "message_id": "counted-1",
            "headers": {
                "x-delivery-count": {"t": "l", "v": 7},
                "x-acquired-count": {"t": "l", "v": 9},
                "keep": {"t": "S", "v": "yes"},
            },
        },
        "body_text": "counted",
    }
    report = asyncio.run(import_records(broker.settings_for(parking), [record], target))
    assert report.published == 1
    headers = asyncio.run(_get_headers(parking, target))
    assert headers.get("keep") in ("yes", b"yes")
    assert headers.get("x-delivery-count") != 7, headers
    assert headers.get("x-acquired-count") != 9, headers


def test_replay_copies_carry_no_delivery_counts(parking: str) -> None:
    """Each browse of the quorum parking queue raises the message's x-delivery-count (3.10-4.2;
    4.3 raises x-acquired-count); the replayed copy starts with the target queue's own count."""
    target = "t.classic2"
    body_ = {"durable": True, "auto_delete": False, "arguments": {"x-queue-type": "classic"}}
    broker.api("PUT", f"/queues/{broker.q(parking)}/{broker.q(target)}", json=body_)
    asyncio.run(purge_parked(broker.settings_for(parking), PARKING, ParkedFilter()))  # leftovers
    props = TypedProperties(message_id="browsed-1", headers={"keep": "yes"}, delivery_mode=2)
    asyncio.run(_publish(parking, [(props, b"browsed")]))
    for _ in range(3):
        assert len(asyncio.run(_export(parking))) == 1  # a browse: counters rise
    counted = asyncio.run(_export(parking))[0]["properties"]["headers"]
    assert set(counted) & BROKER_OWNED, counted  # the parking queue's own count, as delivered
    report = asyncio.run(
        replay_parked(broker.settings_for(parking), PARKING, ParkedFilter(), routing_key=target)
    )
    assert report.moved == 1
    headers = asyncio.run(_get_headers(parking, target))
    assert headers.get("keep") in ("yes", b"yes")
    assert not set(headers) & BROKER_OWNED, headers

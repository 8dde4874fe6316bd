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

from rmqkit.broker.typed_properties import TypedProperties
from rmqkit.parking.model import ParkedFilter
from rmqkit.parking.ops import purge_parked
from rmqkit.parking.transfer import export_parked, import_records, read_export
from rmqkit.settings import with_vhost
from tests import broker
from tests.integration.test_codec_roundtrip import broker_messages, every_property

PARKING = "t.work.parking"
TOPOLOGY = '[queues."t.work"]\nretry_delays = ["1s"]\n'
BROKER_OWNED = {"x-delivery-count"}


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
    assert refused.returncode == 2 and "--output" in refused.stderr
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

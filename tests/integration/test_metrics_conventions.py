"""The messaging semantic conventions' metrics of a consumer, scraped from its real /metrics
after real deliveries: counts by outcome agree with what the broker ends up holding, copies are
counted by target queue, and the message age spans the retry's wait (the AMQP timestamp of the
first publish travels with the copy); the same numbers through OpenTelemetry's metrics API."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import aiormq
import httpx
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from prometheus_client.parser import text_string_to_metric_families

import rmqkit
from rmqkit import otel_metrics
from rmqkit.broker.codec import TypedProperties
from rmqkit.broker.codec.fieldtypes import Timestamp
from rmqkit.settings import Settings
from rmqkit.topology import declare_topology
from rmqkit.topology.expand import wait_queue_names
from rmqkit.topology.model import parse_topology
from tests import broker

TOPOLOGY = """
[exchanges.conv]
type = "direct"

[queues."conv.work"]
bind = [{ exchange = "conv", routing_key = "job" }]
retry_delays = ["1s"]
max_attempts = 3
"""
SPEC = parse_topology(TOPOLOGY, "conv.toml")
QUEUE, WAIT, PARKING = "conv.work", "conv.work.wait.1s", "conv.work.parking"
ALL = [QUEUE, *(n for tier in wait_queue_names(SPEC, QUEUE) for n, _ in tier), PARKING]


async def _until(done: Any, timeout_s: float = 20.0) -> bool:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while not done():
        if loop.time() > deadline:
            return False
        await asyncio.sleep(0.05)
    return True


def _samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    out: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return out


def _value(samples: dict[Any, float], name: str, **labels: str) -> float:
    want = set(labels.items())
    found = [v for (n, ls), v in samples.items() if n == name and want <= set(ls)]
    assert len(found) == 1, (name, labels, found)
    return found[0]


def _otel_points(reader: InMemoryMetricReader) -> dict[str, list[tuple[dict[str, Any], Any]]]:
    """Each instrument's data points (attributes, point) as the SDK would export them."""
    out: dict[str, list[tuple[dict[str, Any], Any]]] = {}
    data = reader.get_metrics_data()
    assert data is not None
    for resource in data.resource_metrics:
        for scope in resource.scope_metrics:
            for metric in scope.metrics:
                for point in metric.data.data_points:
                    out.setdefault(metric.name, []).append((dict(point.attributes or {}), point))
    return out


def test_counts_by_outcome_match_the_queues_and_the_age_spans_the_retry(vhost: str) -> None:
    """And the same numbers through OpenTelemetry's metrics API (what an OTLP exporter would
    send), from an SDK meter provider with an in-memory reader."""
    settings: Settings = broker.settings_for(vhost)
    reader = InMemoryMetricReader()
    provider = MeterProvider(metric_readers=[reader])
    otel_metrics.set_meter_provider(provider)
    broker.run(declare_topology(settings, SPEC))
    kinds = ["ok"] * 5 + ["transient", "permanent"]

    async def handle(message: rmqkit.Message) -> None:
        kind = message.json()["kind"]
        if kind == "permanent":
            raise rmqkit.Permanent("never")
        if kind == "transient" and message.attempt == 1:
            raise ConnectionError("later")

    async def main() -> str:
        async with rmqkit.Publisher.connect(settings) as pub:
            await pub.publish_many("conv", "job", [{"kind": k} for k in kinds])
        consumer = rmqkit.Consumer(
            handle, queue=QUEUE, topology=SPEC, settings=settings, metrics_port=0
        )
        await consumer.start()
        try:
            assert await _until(lambda: consumer.processed == len(kinds) + 1)
            async with httpx.AsyncClient() as client:
                got = await client.get(f"http://127.0.0.1:{consumer.metrics_port}/metrics")
            return got.text
        finally:
            await consumer.stop(grace_s=5)

    try:
        samples = _samples(broker.run(main()))
        points = _otel_points(reader)
    finally:
        otel_metrics.set_meter_provider(None)
        provider.shutdown()
    assert broker.depths(vhost, ALL) == {n: (1 if n == PARKING else 0) for n in ALL}
    base = {"messaging_system": "rabbitmq", "messaging_destination_name": QUEUE}
    consumed = "messaging_client_consumed_messages_total"
    assert _value(samples, consumed, **base, rmqkit_outcome="acked") == 6
    assert _value(samples, consumed, **base, rmqkit_outcome="retried") == 1
    assert _value(samples, consumed, **base, rmqkit_outcome="parked") == 1
    duration = "messaging_process_duration_seconds_count"
    for outcome, n in [("acked", 6), ("retried", 1), ("parked", 1)]:
        labels = {**base, "messaging_operation_name": "process", "rmqkit_outcome": outcome}
        assert _value(samples, duration, **labels) == n
    sent = "messaging_client_sent_messages_total"
    waits = [  # the retry went to one of the tier's jitter slots
        v
        for (n, ls), v in samples.items()
        if n == sent
        and dict(ls).get("messaging_destination_name", "").startswith(WAIT)
        and dict(ls).get("rmqkit_outcome") == "retried"
    ]
    assert sum(waits) == 1
    assert _value(samples, sent, messaging_destination_name=PARKING, rmqkit_outcome="parked") == 1
    # every handling had the Publisher's timestamp; the retried message's second handling came
    # at least the shortest jitter slot (500 ms) after its publish (whole-second timestamps
    # only make an age longer)
    age = "rmqkit_consumer_message_age_seconds"
    assert _value(samples, f"{age}_count", queue=QUEUE) == 8
    assert _value(samples, f"{age}_sum", queue=QUEUE) >= 0.5

    # OpenTelemetry: the same counts, under the conventions' instrument names
    consumed_otel = {
        a["rmqkit.outcome"]: p.value
        for a, p in points["messaging.client.consumed.messages"]
        if a["messaging.destination.name"] == QUEUE and a["messaging.system"] == "rabbitmq"
    }
    assert consumed_otel == {"acked": 6, "retried": 1, "parked": 1}
    durations = {a["rmqkit.outcome"]: p.count for a, p in points["messaging.process.duration"]}
    assert durations == {"acked": 6, "retried": 1, "parked": 1}
    sent_otel = {
        (a["messaging.destination.name"].startswith(WAIT), a["rmqkit.outcome"]): p.value
        for a, p in points["messaging.client.sent.messages"]
    }
    assert sent_otel == {(True, "retried"): 1, (False, "parked"): 1}
    [(_, age_point)] = points["rmqkit.message.age"]
    assert age_point.count == 8 and age_point.sum >= 0.5


def test_any_timestamp_a_producer_wrote_never_costs_a_message(vhost: str) -> None:
    """The age is a metric: a timestamp in milliseconds (read as such), 0, the largest uint64
    or one in the future is observed or skipped, and every message is handled and acked."""
    settings: Settings = broker.settings_for(vhost)
    broker.run(declare_topology(settings, SPEC))
    before = broker.depths(vhost, ALL)  # the module's vhost: an earlier test parked one
    now = int(time.time())
    stamps = [now * 1000 - 1_800_000, 0, 2**64 - 1, now + 86_400, now - 60]
    seen: list[str] = []

    async def handle(message: rmqkit.Message) -> None:
        seen.append(str(message.message_id))

    async def main() -> str:
        conn = await aiormq.connect(settings.amqp_urls[0])
        try:
            channel = await conn.channel()
            for n, stamp in enumerate(stamps):
                props = TypedProperties(
                    message_id=f"ts-{n}", delivery_mode=2, timestamp=Timestamp(stamp)
                )
                await channel.basic_publish(
                    b"{}", exchange="conv", routing_key="job", properties=props
                )
        finally:
            await conn.close()
        consumer = rmqkit.Consumer(
            handle, queue=QUEUE, topology=SPEC, settings=settings, metrics_port=0
        )
        await consumer.start()
        try:
            assert await _until(lambda: consumer.processed == len(stamps))
            async with httpx.AsyncClient() as client:
                got = await client.get(f"http://127.0.0.1:{consumer.metrics_port}/metrics")
            return got.text
        finally:
            await consumer.stop(grace_s=5)

    samples = _samples(broker.run(main()))
    assert sorted(seen) == [f"ts-{n}" for n in range(len(stamps))]
    assert broker.depths(vhost, ALL) == before
    consumed = "messaging_client_consumed_messages_total"
    assert _value(samples, consumed, messaging_destination_name=QUEUE, rmqkit_outcome="acked") == 5
    age = "rmqkit_consumer_message_age_seconds"
    # all five observed: the ms one (half an hour), the future one and the uint64 maximum (read
    # as ms, still the future) as at most an hour; the epoch as decades; none as a failure
    assert _value(samples, f"{age}_count", queue=QUEUE) == 5
    assert _value(samples, f"{age}_bucket", queue=QUEUE, le="900.0") == 3  # not the ms one
    assert _value(samples, f"{age}_bucket", queue=QUEUE, le="3600.0") == 4

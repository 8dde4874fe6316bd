"""OpenTelemetry tracing against the real broker, with the SDK's in-memory exporter: one trace
from ``outbox.add`` in the application's span, through the relay, two failed handlings, parking,
a replay and the handling that succeeds; each retry's span linked to the attempt before, the
replay's and the success's to the handling that parked it. And the headers the broker holds
carry the trace (an assertion on the parked message itself, not only on the spans)."""

from __future__ import annotations

import asyncio
import json
import logging
import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aio_pika
import pytest
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind

import rmqkit
import rmqkit.outbox
from rmqkit import headers as h
from rmqkit import tracing
from rmqkit.consumer.logs import JsonFormatter, MessageContextFilter
from rmqkit.outbox import RelayOptions, run_relay
from rmqkit.parking.model import ParkedFilter
from rmqkit.parking.replay import replay_parked
from rmqkit.publishing.engine import publish_messages
from rmqkit.publishing.inputs import OutgoingMessage
from rmqkit.settings import Settings
from rmqkit.topology import declare_topology
from rmqkit.topology.model import parse_topology
from tests import broker

TOPOLOGY = """
[exchanges.traced]
type = "direct"

[queues."traced.work"]
bind = [{ exchange = "traced", routing_key = "job" }]
retry_delays = ["200ms"]
max_attempts = 2
"""
SPEC = parse_topology(TOPOLOGY, "traced.toml")
QUEUE = "traced.work"
PARKING = "traced.work.parking"


@pytest.fixture
def provider() -> Iterator[TracerProvider]:
    """rmqkit's own tracer provider (never the global one: other tests in this worker must not
    trace); the application's spans come from it too."""
    made = TracerProvider()
    tracing.set_tracer_provider(made)
    try:
        yield made
    finally:
        tracing.set_tracer_provider(None)
        made.shutdown()


@pytest.fixture
def exporter(provider: TracerProvider) -> InMemorySpanExporter:
    memory = InMemorySpanExporter()
    provider.add_span_processor(SimpleSpanProcessor(memory))
    return memory


@pytest.fixture
def traced(vhost: str, tmp_path: Path) -> Settings:
    broker.run(declare_topology(broker.settings_for(vhost), SPEC))
    return broker.settings_for(vhost)


async def until(predicate: Any, timeout_s: float = 20.0) -> bool:
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not predicate():
        if asyncio.get_running_loop().time() > deadline:
            return False
        await asyncio.sleep(0.02)
    return True


async def parked_count(vhost: str, n: int, timeout_s: float = 20.0) -> bool:
    deadline = asyncio.get_running_loop().time() + timeout_s
    while (await asyncio.to_thread(broker.depths, vhost, [PARKING]))[PARKING] != n:
        if asyncio.get_running_loop().time() > deadline:
            return False
        await asyncio.sleep(0.1)
    return True


def _peek(vhost: str, queue: str) -> list[dict[str, Any]]:
    """The queue's head message as the management API shows it, put back (requeued)."""
    path = f"/queues/{broker.q(vhost)}/{broker.q(queue)}/get"
    body = {"count": 1, "ackmode": "ack_requeue_true", "encoding": "auto"}
    got = broker.api("POST", path, json=body)
    got.raise_for_status()
    result: list[dict[str, Any]] = got.json()
    return result


def _process_spans(spans: list[ReadableSpan]) -> list[ReadableSpan]:
    found = [s for s in spans if s.name == f"process {QUEUE}"]
    return sorted(found, key=lambda s: s.start_time or 0)


def test_one_trace_from_outbox_add_through_failures_parking_replay_and_success(
    provider: TracerProvider,
    exporter: InMemorySpanExporter,
    traced: Settings,
    vhost: str,
    tmp_path: Path,
) -> None:
    dsn = f"sqlite:///{tmp_path / 'app.db'}"
    rmqkit.outbox.init(dsn)
    app_tracer = provider.get_tracer("the-application")
    with (
        app_tracer.start_as_current_span("checkout") as app_span,
        sqlite3.connect(dsn.removeprefix("sqlite:///")) as conn,
    ):
        rmqkit.outbox.add(
            conn, exchange="traced", routing_key="job", body={"n": 1}, message_id="t-1"
        )
    trace_id = app_span.get_span_context().trace_id

    calls: list[int] = []
    fixed = False
    lines: list[dict[str, Any]] = []

    class Capture(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            lines.append(json.loads(JsonFormatter().format(record)))

    capture = Capture()
    capture.addFilter(MessageContextFilter())
    logging.getLogger("rmqkit").addHandler(capture)

    async def handle(message: rmqkit.Message) -> None:
        calls.append(message.attempt)
        logging.getLogger("rmqkit.app").warning("handling")
        with app_tracer.start_as_current_span("charge"):  # the handler's own span
            if not fixed:
                raise ConnectionError("downstream is down")

    async def main() -> list[dict[str, Any]]:
        nonlocal fixed
        report = await run_relay(traced, RelayOptions(dsn=dsn, once=True))
        assert report.published == 1
        consumer = rmqkit.Consumer(handle, queue=QUEUE, topology=SPEC, settings=traced)
        await consumer.start()
        try:
            assert await parked_count(vhost, 1)
            parked = await asyncio.to_thread(_peek, vhost, PARKING)
            fixed = True
            moved = await replay_parked(traced, PARKING, ParkedFilter())
            assert (moved.selected, moved.moved) == (1, 1)
            assert await until(lambda: len(calls) == 3)
            assert await until(lambda: consumer.processed == 3)
        finally:
            await consumer.stop(grace_s=5)
        return parked

    try:
        parked = broker.run(main())
    finally:
        logging.getLogger("rmqkit").removeHandler(capture)
    assert calls == [1, 2, 1]  # two failures, parked; after the replay attempt 1 again

    spans = exporter.get_finished_spans()
    process = _process_spans(list(spans))
    assert len(process) == 3
    first, second, success = process
    replay = [s for s in spans if s.name == f"replay {PARKING}"]
    assert len(replay) == 1
    # one trace from the application's span to the success
    assert {s.context.trace_id for s in [*process, *replay]} == {trace_id}
    assert all(s.kind is SpanKind.CONSUMER for s in process)
    assert first.parent is not None and first.parent.span_id == app_span.get_span_context().span_id
    # the retry is a new span, linked to the attempt before
    assert [link.context.span_id for link in second.links] == [first.context.span_id]
    # the replay continues the message's trace and links to the handling that parked it
    assert replay[0].kind is SpanKind.PRODUCER
    assert [link.context.span_id for link in replay[0].links] == [second.context.span_id]
    assert success.parent is not None and success.parent.span_id == replay[0].context.span_id
    assert [link.context.span_id for link in success.links] == [second.context.span_id]
    # the handler's own spans are children of its handling's
    charges = sorted((s for s in spans if s.name == "charge"), key=lambda s: s.start_time or 0)
    assert [c.parent.span_id for c in charges if c.parent] == [s.context.span_id for s in process]
    # outcome and semantic-convention attributes
    outcomes = [(s.attributes or {}).get("rmqkit.outcome") for s in process]
    assert outcomes == ["retried", "parked", "acked"]
    assert (second.attributes or {}).get("rmqkit.parking_reason") == "exhausted"
    attrs = dict(first.attributes or {})
    assert attrs["messaging.system"] == "rabbitmq"
    assert attrs["messaging.operation.type"] == "process"
    assert attrs["messaging.destination.name"] == QUEUE
    assert attrs["messaging.message.id"] == "t-1"
    assert attrs["messaging.message.body.size"] == len(b'{"n":1}')
    assert attrs["error.type"] == "ConnectionError"
    assert [(s.attributes or {}).get("rmqkit.attempt") for s in process] == [1, 2, 1]

    # what the broker held in parking: the trace in traceparent, the parking handling's span
    # in rmqkit-trace-link
    held = parked[0]["properties"]["headers"]
    assert held["traceparent"].split("-")[1] == format(trace_id, "032x")
    assert held[h.TRACE_LINK].split("-")[2] == format(second.context.span_id, "016x")

    # every log line of a handling carries the trace id and the message id
    handling = [line for line in lines if line.get("msg") == "handling"]
    assert len(handling) == 3
    assert {line["trace_id"] for line in handling} == {format(trace_id, "032x")}
    assert {line["message_id"] for line in handling} == {"t-1"}
    assert [line["span_id"] for line in handling] == [
        format(s.context.span_id, "016x") for s in process
    ]


def test_off_traces_nothing_and_adds_no_header(
    exporter: InMemorySpanExporter, traced: Settings, vhost: str
) -> None:
    """RMQKIT_TRACING=off: no span, no traceparent on the copies, although a provider is set."""
    off = traced.model_copy(update={"tracing": "off"})

    async def fail(message: rmqkit.Message) -> None:
        raise rmqkit.Permanent("no")

    async def main() -> None:
        async with rmqkit.Publisher.connect(off) as pub:
            await pub.publish("traced", "job", {"n": 2}, message_id="off-1")
        consumer = rmqkit.Consumer(fail, queue=QUEUE, topology=SPEC, settings=off)
        await consumer.start()
        try:
            assert await parked_count(vhost, 1)
        finally:
            await consumer.stop(grace_s=5)

    broker.run(main())
    assert exporter.get_finished_spans() == ()
    parked = broker.drain(vhost, PARKING)
    assert [m["message_id"] for m in parked] == ["off-1"]
    assert "traceparent" not in parked[0]["headers"]
    assert h.TRACE_LINK not in parked[0]["headers"]


def test_publisher_spans_carry_the_callers_trace(
    provider: TracerProvider, exporter: InMemorySpanExporter, traced: Settings, vhost: str
) -> None:
    """The Publisher: a `create` span per message, a child of the caller's span, whose context
    the consumer's span continues."""
    seen: list[str] = []

    async def handle(message: rmqkit.Message) -> None:
        seen.append(str(message.message_id))

    async def main() -> int:
        with provider.get_tracer("app").start_as_current_span("request") as span:
            async with rmqkit.Publisher.connect(traced) as pub:
                await pub.publish_many("traced", "job", [{"n": i} for i in range(3)])
        consumer = rmqkit.Consumer(handle, queue=QUEUE, topology=SPEC, settings=traced)
        await consumer.start()
        try:
            assert await until(lambda: len(seen) == 3)
            assert await until(lambda: consumer.processed == 3)
        finally:
            await consumer.stop(grace_s=5)
        return span.get_span_context().trace_id

    trace_id = broker.run(main())
    spans = exporter.get_finished_spans()
    created = [s for s in spans if s.name == "create traced"]
    process = _process_spans(list(spans))
    assert len(created) == 3 and len(process) == 3
    assert {s.context.trace_id for s in [*created, *process]} == {trace_id}
    assert {s.parent.span_id for s in process if s.parent} == {s.context.span_id for s in created}
    assert all(s.kind is SpanKind.PRODUCER for s in created)


def test_a_malformed_or_hostile_trace_header_never_costs_a_message(
    exporter: InMemorySpanExporter, traced: Settings, vhost: str
) -> None:
    """Whatever another publisher put in traceparent or rmqkit-trace-link (garbage, bytes that
    are not UTF-8, a number, an all-zero id), the message is handled once and acked; its span
    starts a trace of its own."""
    hostile: list[dict[str, Any]] = [
        {"traceparent": "garbage"},
        {"traceparent": bytearray(b"\xff\xfe\x00")},
        {"traceparent": 42, h.TRACE_LINK: 42},
        {"traceparent": "00-" + "0" * 32 + "-" + "0" * 16 + "-01", h.TRACE_LINK: "x"},
        {h.TRACE_LINK: bytearray(b"\xff")},
    ]
    seen: list[str] = []

    async def handle(message: rmqkit.Message) -> None:
        seen.append(str(message.message_id))

    async def main() -> None:
        conn = await aio_pika.connect(traced.amqp_urls[0])
        try:
            channel = await conn.channel()
            exchange = await channel.get_exchange("traced")
            for n, headers in enumerate(hostile):
                await exchange.publish(
                    aio_pika.Message(b"{}", message_id=f"h-{n}", headers=headers),
                    routing_key="job",
                )
        finally:
            await conn.close()
        consumer = rmqkit.Consumer(handle, queue=QUEUE, topology=SPEC, settings=traced)
        await consumer.start()
        try:
            assert await until(lambda: consumer.processed == len(hostile))
        finally:
            await consumer.stop(grace_s=5)

    broker.run(main())
    assert sorted(seen) == [f"h-{n}" for n in range(len(hostile))]
    assert broker.depths(vhost, [QUEUE, PARKING]) == {QUEUE: 0, PARKING: 0}
    process = _process_spans(list(exporter.get_finished_spans()))
    assert len(process) == len(hostile)
    assert all(s.parent is None and not s.links for s in process)
    assert len({s.context.trace_id for s in process}) == len(hostile)


def test_rmqkit_publish_engine_carries_the_current_trace(
    provider: TracerProvider, exporter: InMemorySpanExporter, traced: Settings, vhost: str
) -> None:
    """`rmqkit publish`'s engine (the command runs it; under opentelemetry-instrument the
    provider is global): a `create` span per message, a child of the current span, its
    traceparent in the message the broker holds."""

    async def main() -> int:
        with provider.get_tracer("ops").start_as_current_span("backfill") as span:
            report = await publish_messages(
                traced,
                "traced",
                "job",
                [OutgoingMessage(b'{"n": 1}', "cli-1"), OutgoingMessage(b'{"n": 2}', "cli-2")],
            )
        assert report.confirmed == 2
        return span.get_span_context().trace_id

    trace_id = broker.run(main())
    created = [s for s in exporter.get_finished_spans() if s.name == "create traced"]
    assert len(created) == 2
    assert {s.context.trace_id for s in created} == {trace_id}
    held = {m["message_id"]: m["headers"] for m in broker.drain(vhost, QUEUE)}
    assert set(held) == {"cli-1", "cli-2"}
    by_id = {(s.attributes or {}).get("messaging.message.id"): s for s in created}
    for message_id, headers in held.items():
        span_id = format(by_id[message_id].context.span_id, "016x")
        assert str(headers["traceparent"]).split("-")[1:3] == [format(trace_id, "032x"), span_id]

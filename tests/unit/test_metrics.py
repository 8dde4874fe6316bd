"""ConsumerMetrics series and the HealthServer's /metrics, /healthz and /readyz endpoints."""

from __future__ import annotations

import asyncio
import logging
import socket
from collections.abc import Awaitable, Callable

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from rmqkit.consumer.health_server import HealthServer
from rmqkit.consumer.metrics import (
    HANDLER_BUCKETS,
    METRICS_CONTENT_TYPE,
    ConsumerMetrics,
)
from rmqkit.errors import ConfigError, ExitCode
from rmqkit.headers import ParkingReason


def samples(metrics: ConsumerMetrics) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    """Every sample of the rendered text, keyed by (name, labels)."""
    out = {}
    for family in text_string_to_metric_families(metrics.render().decode()):
        for s in family.samples:
            out[(s.name, frozenset(s.labels.items()))] = s.value
    return out


def value(metrics: ConsumerMetrics, name: str, **labels: str) -> float:
    return samples(metrics)[(name, frozenset({"queue": metrics.queue, **labels}.items()))]


# --- ConsumerMetrics ------------------------------------------------------------------------------


def test_series_exist_at_zero_with_the_queue_label() -> None:
    m = ConsumerMetrics("orders.work", ["1s", "5s"], ["permanent", "exhausted"])
    text = m.render().decode()
    for series in (
        'rmqkit_consumer_received_total{queue="orders.work"} 0.0',
        'rmqkit_consumer_acked_total{queue="orders.work"} 0.0',
        'rmqkit_consumer_retried_total{queue="orders.work",tier="1s"} 0.0',
        'rmqkit_consumer_retried_total{queue="orders.work",tier="5s"} 0.0',
        'rmqkit_consumer_parked_total{queue="orders.work",reason="permanent"} 0.0',
        'rmqkit_consumer_parked_total{queue="orders.work",reason="exhausted"} 0.0',
        'rmqkit_consumer_handler_seconds_count{queue="orders.work"} 0.0',
        'rmqkit_consumer_in_flight{queue="orders.work"} 0.0',
        'rmqkit_consumer_reconnects_total{queue="orders.work"} 0.0',
        'rmqkit_consumer_connected{queue="orders.work"} 0.0',
        'rmqkit_consumer_consuming{queue="orders.work"} 0.0',
    ):
        assert series in text, series


def test_default_parking_reasons_are_every_parking_reason() -> None:
    m = ConsumerMetrics("q")
    for reason in ParkingReason:
        assert value(m, "rmqkit_consumer_parked_total", reason=reason.value) == 0


def test_counters_and_gauges_move() -> None:
    m = ConsumerMetrics("q", ["1s", "5s"], ["permanent"])
    for _ in range(3):
        m.received()
    m.acked()
    m.acked(4)
    m.retried("1s")
    m.retried("1s")
    m.retried("5s")
    m.parked("permanent")
    m.parked(ParkingReason.PERMANENT)  # the StrEnum member is the same series
    m.in_flight_inc()
    m.in_flight_inc()
    m.in_flight_dec()
    m.reconnected()
    m.set_connected(True)
    m.set_consuming(True)

    assert value(m, "rmqkit_consumer_received_total") == 3
    assert value(m, "rmqkit_consumer_acked_total") == 5
    assert value(m, "rmqkit_consumer_retried_total", tier="1s") == 2
    assert value(m, "rmqkit_consumer_retried_total", tier="5s") == 1
    assert value(m, "rmqkit_consumer_parked_total", reason="permanent") == 2
    assert value(m, "rmqkit_consumer_in_flight") == 1
    assert value(m, "rmqkit_consumer_reconnects_total") == 1
    assert value(m, "rmqkit_consumer_connected") == 1
    assert value(m, "rmqkit_consumer_consuming") == 1

    m.set_consuming(False)
    m.set_connected(False)
    assert value(m, "rmqkit_consumer_connected") == 0
    assert value(m, "rmqkit_consumer_consuming") == 0


def test_unknown_reason_and_tier_are_created_on_first_use() -> None:
    m = ConsumerMetrics("q", ["1s"], ["permanent"])
    m.parked("shutdown_timeout")
    m.parked("shutdown_timeout")
    m.retried("30s")
    assert value(m, "rmqkit_consumer_parked_total", reason="shutdown_timeout") == 2
    assert value(m, "rmqkit_consumer_retried_total", tier="30s") == 1


def test_handler_histogram_buckets_span_1ms_to_60s() -> None:
    assert HANDLER_BUCKETS[0] == 0.001
    assert HANDLER_BUCKETS[-1] == 60.0
    assert list(HANDLER_BUCKETS) == sorted(HANDLER_BUCKETS)

    m = ConsumerMetrics("q")
    m.observe_handler(0.0005)
    m.observe_handler(0.001)  # on a bound: counted in that bucket (le means <=)
    m.observe_handler(0.003)
    m.observe_handler(45.0)
    m.observe_handler(120.0)

    def bucket(le: str) -> float:
        return value(m, "rmqkit_consumer_handler_seconds_bucket", le=le)

    assert bucket("0.001") == 2
    assert bucket("0.0025") == 2
    assert bucket("0.005") == 3
    assert bucket("30.0") == 3
    assert bucket("60.0") == 4
    assert bucket("+Inf") == 5
    assert value(m, "rmqkit_consumer_handler_seconds_count") == 5
    assert value(m, "rmqkit_consumer_handler_seconds_sum") == pytest.approx(165.0045)
    les = [
        s.labels["le"]
        for f in text_string_to_metric_families(m.render().decode())
        if f.name == "rmqkit_consumer_handler_seconds"
        for s in f.samples
        if s.name.endswith("_bucket")
    ]
    assert les == [repr(b) for b in HANDLER_BUCKETS] + ["+Inf"]


def test_each_instance_has_its_own_registry() -> None:
    a = ConsumerMetrics("same")
    b = ConsumerMetrics("same")  # would raise "Duplicated timeseries" on a shared registry
    a.received()
    assert value(a, "rmqkit_consumer_received_total") == 1
    assert value(b, "rmqkit_consumer_received_total") == 0


def test_heartbeat_and_readiness_state() -> None:
    m = ConsumerMetrics("q")
    assert m.heartbeat_age() < 5
    before = m.last_heartbeat
    m.heartbeat()
    assert m.last_heartbeat >= before
    assert m.not_ready_reason() == "not connected to the broker"
    m.set_connected(True)
    assert m.not_ready_reason() == "connected but not consuming"
    m.set_consuming(True)
    assert m.not_ready_reason() is None


# --- HealthServer ---------------------------------------------------------------------------------


async def raw(port: int, data: bytes, *, half_close: bool = False) -> tuple[int, bytes, bytes]:
    """Send ``data`` as is; return (status, header block, body) of the response."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(data)
    await writer.drain()
    if half_close:
        writer.write_eof()
    response = await asyncio.wait_for(reader.read(), 5)
    writer.close()
    await writer.wait_closed()
    head, _, body = response.partition(b"\r\n\r\n")
    status = int(head.split(b" ", 2)[1])
    return status, head, body


async def get(port: int, path: str) -> tuple[int, bytes, bytes]:
    return await raw(port, f"GET {path} HTTP/1.1\r\nHost: x\r\n\r\n".encode())


def serve(
    m: ConsumerMetrics, scenario: Callable[[HealthServer], Awaitable[None]], **kwargs: float
) -> None:
    async def main() -> None:
        server = HealthServer(m, "127.0.0.1", 0, **kwargs)  # type: ignore[arg-type]
        await server.start()
        try:
            assert server.port != 0
            await scenario(server)
        finally:
            await server.stop()

    asyncio.run(main())


def test_metrics_endpoint() -> None:
    m = ConsumerMetrics("orders.work", ["1s"])
    m.received()

    async def scenario(server: HealthServer) -> None:
        status, head, body = await get(server.port, "/metrics")
        assert status == 200
        assert f"Content-Type: {METRICS_CONTENT_TYPE}".encode() in head
        assert b"Connection: close" in head
        assert f"Content-Length: {len(body)}".encode() in head
        assert b'rmqkit_consumer_received_total{queue="orders.work"} 1.0' in body

        # a real client too, with a query string
        async with httpx.AsyncClient() as client:
            r = await client.get(f"http://127.0.0.1:{server.port}/metrics?x=1")
        assert r.status_code == 200
        assert r.headers["content-type"].startswith("text/plain; version=0.0.4")
        assert 'rmqkit_consumer_retried_total{queue="orders.work",tier="1s"} 0.0' in r.text

        status, head, body = await raw(server.port, b"HEAD /metrics HTTP/1.1\r\n\r\n")
        assert status == 200 and body == b""

    serve(m, scenario)


def test_healthz_goes_stale_when_the_heartbeat_stops() -> None:
    m = ConsumerMetrics("q")

    async def scenario(server: HealthServer) -> None:
        m.heartbeat()
        status, _, body = await get(server.port, "/healthz")
        assert (status, body) == (200, b"ok\n")

        await asyncio.sleep(0.3)
        status, _, body = await get(server.port, "/healthz")
        assert status == 503
        assert body.startswith(b"stale: ")

        m.heartbeat()
        status, _, _ = await get(server.port, "/healthz")
        assert status == 200

    serve(m, scenario, stale_after_s=0.2)


def test_readyz_needs_connected_and_consuming() -> None:
    m = ConsumerMetrics("q")

    async def scenario(server: HealthServer) -> None:
        status, _, body = await get(server.port, "/readyz")
        assert (status, body) == (503, b"not ready: not connected to the broker\n")
        m.set_connected(True)
        status, _, body = await get(server.port, "/readyz")
        assert (status, body) == (503, b"not ready: connected but not consuming\n")
        m.set_consuming(True)
        status, _, body = await get(server.port, "/readyz")
        assert (status, body) == (200, b"ready\n")
        m.set_connected(False)  # lost the connection: not ready again
        status, _, _ = await get(server.port, "/readyz")
        assert status == 503

    serve(m, scenario)


def test_unknown_path_and_method() -> None:
    async def scenario(server: HealthServer) -> None:
        assert (await get(server.port, "/"))[0] == 404
        assert (await get(server.port, "/metricsx"))[0] == 404
        status, head, _ = await raw(server.port, b"POST /metrics HTTP/1.1\r\n\r\n")
        assert status == 405
        assert b"Allow: GET, HEAD" in head

    serve(ConsumerMetrics("q"), scenario)


@pytest.mark.parametrize(
    "request_bytes",
    [
        b"garbage\r\n\r\n",
        b"GET /metrics\r\n\r\n",
        b"GET /metrics HTTP/1.1 extra\r\n\r\n",
        b"GET metrics HTTP/1.1\r\n\r\n",
        b"GET /metrics SPDY/3\r\n\r\n",
        b"get /metrics HTTP/1.1\r\n\r\n",
        b"GET /m\xe9trics HTTP/1.1\r\n\r\n",
        b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03\n\r\n",  # a TLS ClientHello's first bytes
    ],
)
def test_malformed_request_is_400(request_bytes: bytes) -> None:
    async def scenario(server: HealthServer) -> None:
        status, _, _ = await raw(server.port, request_bytes)
        assert status == 400
        # and the server still answers afterwards
        assert (await get(server.port, "/healthz"))[0] == 200

    serve(ConsumerMetrics("q"), scenario)


def test_oversized_and_incomplete_and_slow_requests() -> None:
    async def scenario(server: HealthServer) -> None:
        long_line = b"GET /" + b"a" * 10_000 + b" HTTP/1.1\r\n\r\n"
        assert (await raw(server.port, long_line))[0] == 431

        many_headers = b"GET /metrics HTTP/1.1\r\n" + b"X-A: " + b"b" * 1000 + b"\r\n"
        many_headers = many_headers + (b"X-B: " + b"c" * 1000 + b"\r\n") * 40 + b"\r\n"
        assert (await raw(server.port, many_headers))[0] == 431

        # request line cut off by the client closing its side
        status, _, _ = await raw(server.port, b"GET /metr", half_close=True)
        assert status == 400

        # a client that sends nothing gets 408 once the read deadline passes
        status, _, _ = await raw(server.port, b"GET /metrics HTTP/1.1\r\n")
        assert status == 408

        # a client that connects and leaves at once does not break anything
        _, writer = await asyncio.open_connection("127.0.0.1", server.port)
        writer.close()
        await writer.wait_closed()
        assert (await get(server.port, "/healthz"))[0] == 200

    serve(ConsumerMetrics("q"), scenario, read_timeout_s=0.3)


def test_slow_client_does_not_block_others() -> None:
    async def scenario(server: HealthServer) -> None:
        _, slow = await asyncio.open_connection("127.0.0.1", server.port)
        slow.write(b"GET /metrics HTTP/1.1\r\n")  # never finishes its headers
        await slow.drain()
        status, _, _ = await asyncio.wait_for(get(server.port, "/readyz"), 1)
        assert status == 503
        slow.close()

    serve(ConsumerMetrics("q"), scenario, read_timeout_s=5)


def test_connections_beyond_the_limit_get_503() -> None:
    async def scenario(server: HealthServer) -> None:
        _, slow = await asyncio.open_connection("127.0.0.1", server.port)
        slow.write(b"GET /metrics HTTP/1.1\r\n")
        await slow.drain()
        await asyncio.sleep(0.05)
        status, _, body = await get(server.port, "/healthz")
        assert (status, body) == (503, b"too many connections\n")
        slow.close()

    serve(ConsumerMetrics("q"), scenario, max_connections=1)


def test_stop_closes_lingering_connections_and_frees_the_port(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async def main() -> None:
        server = HealthServer(ConsumerMetrics("q"), "127.0.0.1", 0, read_timeout_s=30)
        await server.start()
        port = server.port
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(b"GET /metrics HTTP/1.1\r\n")
        await writer.drain()
        await asyncio.sleep(0.05)
        await asyncio.wait_for(server.stop(), 2)
        assert await asyncio.wait_for(reader.read(), 2) == b""
        writer.close()
        with pytest.raises(OSError):
            await asyncio.open_connection("127.0.0.1", port)
        # the same port can be bound again right away
        again = HealthServer(ConsumerMetrics("q"), "127.0.0.1", port)
        await again.start()
        assert again.port == port
        await again.stop()

    asyncio.run(main())
    assert [r for r in caplog.records if r.levelno >= logging.WARNING] == []


def test_port_in_use_is_a_config_error() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        server = HealthServer(ConsumerMetrics("q"), "127.0.0.1", port)
        with pytest.raises(ConfigError) as caught:
            asyncio.run(server.start())
    assert caught.value.exit_code == ExitCode.CONFIG == 78
    assert str(caught.value) == (
        f"metrics port {port} is in use — pick another with --metrics-port"
    )
    assert "\n" not in str(caught.value)
    assert not server.started


def test_unbindable_host_is_a_config_error() -> None:
    server = HealthServer(ConsumerMetrics("q"), "192.0.2.1", 0)  # TEST-NET-1, not ours
    with pytest.raises(ConfigError) as caught:
        asyncio.run(server.start())
    assert str(caught.value).startswith("cannot listen on 192.0.2.1:0 for metrics: ")


def test_context_manager_and_port_before_start() -> None:
    async def main() -> None:
        server = HealthServer(ConsumerMetrics("q"), "127.0.0.1", 0)
        assert server.port == 0
        async with server:
            assert server.started and server.port != 0
            assert (await get(server.port, "/healthz"))[0] == 200
        assert not server.started
        await server.stop()  # stopping twice is harmless

    asyncio.run(main())


def test_readyz_fails_once_stuck_handlers_exhaust_the_threads() -> None:
    """Issue 9, finding 4: a worker whose handler threads are held by stuck calls says so."""
    m = ConsumerMetrics("q")
    m.set_connected(True)
    m.set_consuming(True)
    m.set_stuck_handlers(4)
    text = m.render().decode()
    assert 'rmqkit_consumer_stuck_handlers{queue="q"} 4.0' in text
    assert 'rmqkit_consumer_handler_threads_exhausted_total{queue="q"} 0.0' in text
    assert m.not_ready_reason() is None  # stuck calls alone: the spares still serve
    m.threads_exhausted()
    assert 'rmqkit_consumer_handler_threads_exhausted_total{queue="q"} 1.0' in m.render().decode()

    async def scenario(server: HealthServer) -> None:
        status, _, body = await get(server.port, "/readyz")
        assert status == 503
        assert b"handler threads exhausted by 4 stuck handler call(s)" in body

    serve(m, scenario)
